"""Load a packed dataset's meta.json and index into compact columns (numpy / Arrow).

One Python object per sample would cost hundreds of bytes each and be copied page by page
into every forked DataLoader worker as reference counts change; a few flat arrays cost tens
of bytes per sample and stay shared.  ``index.jsonl`` is the source of truth;
``index.parquet`` is a columnar copy written at build time and used when it is fresh.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from readers.columnar import (
    COMPRESSIONS,
    RAW_DIMS,
    Labels,
    check_shard_column,
    fingerprint,
    load_parquet,
)
from readers.errors import DatasetFormatError
from readers.files import open_regular
from readers.formats import get_format
from readers.formats.base import ShardFormat
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from readers.meta import is_int, load_meta, shard_table

__all__ = [
    "COMPRESSIONS",
    "DatasetIndex",
    "Labels",
    "fingerprint",
    "load_index",
    "load_meta",
]

# Columns a reader needs; the rest (path, width, ...) are loaded only when asked for, but
# the dimensions always when some record holds raw pixels (format "raw").
CORE_COLUMNS = ("nbytes", "crc32", "offset")
EXTRA_COLUMNS = ("width", "height", "channels", "format", "path")


@dataclass
class DatasetIndex:
    """meta.json plus the index of a packed dataset, held as flat arrays."""

    root: Path
    meta: dict[str, Any]
    shard_bounds: np.ndarray  # int64, num_shards + 1: shard s holds ids [b[s], b[s+1])
    shard_names: list[str]
    nbytes: np.ndarray  # uint32
    crc32: np.ndarray  # uint32
    offset: np.ndarray | None  # as ShardFormat.index_offsets keeps it
    labels: Labels
    extra: dict[str, Any] = field(default_factory=dict)
    raw: np.ndarray | None = None
    """Per sample, whether its record holds raw pixels (index ``format: raw``; bool); None
    when none does. The dimensions of raw records are then in ``extra`` (`raw_dims`)."""
    compression: np.ndarray | None = None
    """Per sample, the code in `COMPRESSIONS` of its record's ``compression`` (uint8); None
    when no record is compressed."""

    def raw_dims(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(height, width, channels)`` columns when some record holds raw pixels."""
        if self.raw is None:
            return None
        h, w, c = (self.extra[name] for name in RAW_DIMS)
        return h, w, c

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    @property
    def format(self) -> str:
        """The dataset's storage format, as recorded in ``meta.json`` (``meta["format"]``)."""
        return str(self.meta["format"])

    def shard_of(self, i: int) -> int:
        """The shard that holds sample `i`."""
        return int(np.searchsorted(self.shard_bounds, i, side="right")) - 1

    def path_of(self, i: int) -> str | None:
        """The source path of sample `i` (read from the index on demand; for messages)."""
        if "path" in self.extra:
            return str(self.extra["path"][i].as_py())
        index_path = self.root / INDEX_NAME
        try:
            with open(index_path, encoding="utf-8") as f:
                for n, line in enumerate(f):
                    if n == i:
                        return str(json.loads(line).get("path"))
        except (OSError, ValueError):
            return None
        return None


_INT64_MAX = 2**63 - 1
_UINT32_MAX = 2**32 - 1


def _labels_from_texts(texts: list[str]) -> Labels:
    import pyarrow as pa

    values = [json.loads(t) for t in texts]
    if all(v is None for v in values):
        return Labels("none")
    if all(is_int(v) and -_INT64_MAX - 1 <= v <= _INT64_MAX for v in values):
        return Labels("int", ints=np.asarray(values, dtype=np.int64))
    return Labels("json", texts=pa.array(texts, type=pa.large_string()))


def _check_row(row: Any, n: int, shard: int, extra: tuple[str, ...]) -> str | None:
    """What is wrong with the index object on line ``n + 1``, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, found {type(row).__name__}"
    if not is_int(row.get("id")) or row["id"] != n:
        return f"id is {row.get('id')!r}, expected {n} (id = line number)"
    for key in ("nbytes", "crc32"):
        value = row.get(key)
        if not is_int(value) or not 0 <= value <= _UINT32_MAX:
            return f"{key} is {value!r}, expected an integer in 0..2**32-1"
    offset = row.get("offset")
    if offset is not None and (not is_int(offset) or not 0 <= offset <= _INT64_MAX):
        return f"offset is {offset!r}, expected an integer >= 0"
    if "shard" in row and row["shard"] != shard:
        return (
            f"shard is {row['shard']!r}, but the shard table of {META_NAME} puts sample {n} in "
            f"shard {shard}"
        )
    for name in extra:
        value = row.get(name)
        if value is None:
            continue
        if name in ("path", "format"):
            if not isinstance(value, str):
                return f"{name} is {value!r}, expected a string"
        elif not is_int(value) or not 0 <= value <= _INT64_MAX:
            return f"{name} is {value!r}, expected an integer >= 0"
    return None


def _check_stored(row: dict[str, Any], raw: bytearray, codes: bytearray) -> str | None:
    """Note whether the record holds raw pixels and its compression code; or what is wrong."""
    is_raw = row.get("format") == "raw"
    compression = row.get("compression", "none")
    if compression not in COMPRESSIONS:
        return f"compression is {compression!r}, expected one of {', '.join(COMPRESSIONS[1:])}"
    if compression != "none" and not is_raw:
        return f"compression is {compression!r} on a {row.get('format')!r} record (raw only)"
    if is_raw and any(row.get(name) is None for name in RAW_DIMS):
        return "a raw record needs its width, height and channels"
    raw.append(is_raw)
    codes.append(COMPRESSIONS.index(compression))
    return None


def _load_jsonl(
    root: Path, extra: tuple[str, ...], bounds: np.ndarray
) -> tuple[dict[str, np.ndarray], Labels, dict[str, Any]]:
    path = root / INDEX_NAME
    nbytes: list[int] = []
    crc: list[int] = []
    offset: list[int] = []
    label_texts: list[str] = []
    raw_flags = bytearray()  # a byte per sample: a list of str would cost ~50 bytes each
    codes = bytearray()
    extras: dict[str, list[Any]] = {name: [] for name in (*extra, *RAW_DIMS)}
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: not found; is {root} a packed dataset?") from None
    except OSError as exc:
        raise DatasetFormatError(f"{path}: cannot read ({exc})") from exc
    shard = 0
    last_shard = max(0, len(bounds) - 2)
    with f:
        for n, raw in enumerate(f):
            if not raw.endswith(b"\n"):
                raise DatasetFormatError(
                    f"{path}:{n + 1}: the last line is cut short (torn write?)"
                )
            while shard < last_shard and n >= bounds[shard + 1]:
                shard += 1
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(f"{path}:{n + 1}: not UTF-8 ({exc})") from exc
            except (ValueError, RecursionError) as exc:
                raise DatasetFormatError(f"{path}:{n + 1}: not JSON ({exc})") from exc
            wrong = _check_row(row, n, shard, (*extra, *RAW_DIMS))
            if wrong is None:
                wrong = _check_stored(row, raw_flags, codes)
            if wrong is not None:
                raise DatasetFormatError(f"{path}:{n + 1}: {wrong}")
            nbytes.append(row["nbytes"])
            crc.append(row["crc32"])
            offset.append(-1 if row.get("offset") is None else row["offset"])
            label_texts.append(json.dumps(row.get("label"), ensure_ascii=False))
            for name in extras:
                extras[name].append(row.get(name))
    cols: dict[str, np.ndarray] = {
        "nbytes": np.asarray(nbytes, dtype=np.uint32),
        "crc32": np.asarray(crc, dtype=np.uint32),
        "offset": np.asarray(offset, dtype=np.int64),
        "raw": np.frombuffer(bytes(raw_flags), dtype=np.bool_),
        "compression": np.frombuffer(bytes(codes), dtype=np.uint8),
    }
    if not cols["raw"].any():  # the dimensions only where they decode something
        for name in RAW_DIMS:
            if name not in extra:
                del extras[name]
    import pyarrow as pa

    extra_cols: dict[str, Any] = {}
    for name, values in extras.items():
        if name in ("path", "format"):
            extra_cols[name] = pa.array(values, type=pa.string())
        else:
            extra_cols[name] = np.asarray([-1 if v is None else v for v in values], np.int64)
    return cols, _labels_from_texts(label_texts), extra_cols


def load_index(
    root: str | os.PathLike[str],
    *,
    extra: tuple[str, ...] = (),
    prefer_columnar: bool = True,
    meta: dict[str, Any] | None = None,
) -> DatasetIndex:
    """Load the dataset at `root` into a `DatasetIndex`.

    Args:
        root: the dataset directory (``OUT`` of ``packer build``).
        extra: more columns to load (``width``, ``height``, ``channels``, ``format``, ``path``).
        prefer_columnar: use ``index.parquet`` when it is present and fresh.
        meta: ``meta.json`` of `root` as just read by the caller (read here otherwise).

    Raises:
        DatasetFormatError: meta.json or the index is missing, malformed, or disagrees.
    """
    root = Path(root)
    meta = load_meta(root) if meta is None else meta
    bounds, names = shard_table(meta, root / META_NAME)
    loaded = load_parquet(root, meta, extra) if prefer_columnar else None
    if loaded is None:
        loaded = _load_jsonl(root, extra, bounds)
    cols, labels, extra_cols = loaded
    if len(cols["nbytes"]) != int(meta["num_samples"]):
        raise DatasetFormatError(
            f"{root / INDEX_NAME}: {len(cols['nbytes'])} lines but {META_NAME} says "
            f"num_samples = {meta['num_samples']}"
        )
    shard = cols.pop("shard", None)
    if shard is not None:
        check_shard_column(shard, bounds, root / INDEX_COLUMNAR_NAME)
    # what an offset means (and whether reading needs it) is the format's business
    fmt = get_format(meta["format"]) or ShardFormat()
    offset = fmt.index_offsets(cols["offset"], len(cols["nbytes"]))
    raw, codes = cols["raw"], cols["compression"]
    return DatasetIndex(
        raw=raw if raw.any() else None,
        compression=codes if codes.any() else None,
        root=root,
        meta=meta,
        shard_bounds=bounds,
        shard_names=names,
        nbytes=cols["nbytes"],
        crc32=cols["crc32"],
        offset=offset,
        labels=labels,
        extra=extra_cols,
    )
