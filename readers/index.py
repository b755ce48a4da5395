"""Load a packed dataset's meta.json and index into compact columns (numpy / Arrow).

One Python object per sample would cost hundreds of bytes each and be copied page by page
into every forked DataLoader worker as reference counts change; a few flat arrays cost tens
of bytes per sample and stay shared.  ``index.jsonl`` is the source of truth;
``index.parquet`` is a columnar copy written at build time and used when it is fresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import DatasetFormatError
from readers.files import check_regular, open_regular
from readers.formats import get_format
from readers.formats.base import ShardFormat
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from readers.meta import is_int, load_meta, shard_table

__all__ = ["DatasetIndex", "Labels", "fingerprint", "load_index", "load_meta"]

# Columns a reader needs; the rest (path, width, ...) are loaded only when asked for.
CORE_COLUMNS = ("nbytes", "crc32", "offset")
EXTRA_COLUMNS = ("width", "height", "channels", "format", "path")

_SAMPLE_BLOCK = 1 << 16
_SAMPLE_COUNT = 64


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap fingerprint of a file: its size and a hash of evenly spaced 64 KiB blocks.

    Used to tell whether ``index.parquet`` still matches ``index.jsonl`` without hashing a
    multi-GB file at every open; ``packer verify`` compares the full contents.
    """
    size = os.path.getsize(path)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(size).encode())
    with open_regular(path) as f:
        if size <= _SAMPLE_BLOCK * _SAMPLE_COUNT:
            digest.update(f.read())
        else:
            step = (size - _SAMPLE_BLOCK) // (_SAMPLE_COUNT - 1)
            for i in range(_SAMPLE_COUNT):
                f.seek(i * step)
                digest.update(f.read(_SAMPLE_BLOCK))
    return f"{size}:{digest.hexdigest()}"


@dataclass
class Labels:
    """The labels of all samples in one compact form.

    ``kind`` is ``none`` (every label null), ``int`` (every label an int: ``ints``) or
    ``json`` (anything else: one JSON text per sample in an Arrow string array).
    """

    kind: str
    ints: np.ndarray | None = None
    texts: Any = None  # pyarrow.StringArray / LargeStringArray

    def __getitem__(self, i: int) -> Any:
        if self.kind == "int":
            assert self.ints is not None
            return int(self.ints[i])
        if self.kind == "json":
            return json.loads(self.texts[i].as_py())
        return None

    def __post_init__(self) -> None:
        ints = self.ints
        if (
            ints is not None
            and ints.size
            and ints.dtype != np.int32
            and int(ints.min()) >= -(2**31)
            and int(ints.max()) < 2**31
        ):
            self.ints = ints.astype(np.int32)  # class ids: half the memory

    def as_ints(self) -> np.ndarray | None:
        """The int labels as an array, or None when labels are not all ints."""
        return self.ints if self.kind == "int" else None


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

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    @property
    def format(self) -> str:
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


def _load_jsonl(
    root: Path, extra: tuple[str, ...], bounds: np.ndarray
) -> tuple[dict[str, np.ndarray], Labels, dict[str, Any]]:
    path = root / INDEX_NAME
    nbytes: list[int] = []
    crc: list[int] = []
    offset: list[int] = []
    label_texts: list[str] = []
    extras: dict[str, list[Any]] = {name: [] for name in extra}
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
            wrong = _check_row(row, n, shard, extra)
            if wrong is not None:
                raise DatasetFormatError(f"{path}:{n + 1}: {wrong}")
            nbytes.append(row["nbytes"])
            crc.append(row["crc32"])
            offset.append(-1 if row.get("offset") is None else row["offset"])
            label_texts.append(json.dumps(row.get("label"), ensure_ascii=False))
            for name in extra:
                extras[name].append(row.get(name))
    cols: dict[str, np.ndarray] = {
        "nbytes": np.asarray(nbytes, dtype=np.uint32),
        "crc32": np.asarray(crc, dtype=np.uint32),
        "offset": np.asarray(offset, dtype=np.int64),
    }
    import pyarrow as pa

    extra_cols: dict[str, Any] = {}
    for name, values in extras.items():
        if name in ("path", "format"):
            extra_cols[name] = pa.array(values, type=pa.string())
        else:
            extra_cols[name] = np.asarray([-1 if v is None else v for v in values], np.int64)
    return cols, _labels_from_texts(label_texts), extra_cols


def _column(table: Any, name: str, dtype: Any, *, fill: int | None = None) -> np.ndarray:
    column = table.column(name)
    if fill is not None:
        column = column.fill_null(fill)
    return np.ascontiguousarray(column.to_numpy(), dtype=dtype)


def _load_parquet(
    root: Path, meta: dict[str, Any], extra: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], Labels, dict[str, Any]] | None:
    """The columns from index.parquet, or None when it is missing or stale."""
    pq_path = root / INDEX_COLUMNAR_NAME
    if not pq_path.exists():
        return None
    check_regular(pq_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        label_kind = str(meta.get("label_kind", ""))
        if label_kind not in ("none", "int", "json") or meta.get(
            "index_fingerprint"
        ) != fingerprint(root / INDEX_NAME):
            warnings.warn(
                f"{pq_path} does not match {INDEX_NAME} (edited or stale); reading "
                f"{INDEX_NAME} instead",
                stacklevel=3,
            )
            return None
        # offsets: where each record starts in its shard file, or where its stored bytes lie
        # in it (ShardFormat.offsets_locate_records; hints written by packer >= 0.1)
        wanted = ["nbytes", "crc32", "offset", "shard", *extra]
        wanted += {"int": ["label_int"], "json": ["label_json"], "none": []}[label_kind]
        table = pq.read_table(pq_path, columns=wanted)
    except (OSError, ValueError, KeyError) as exc:
        warnings.warn(f"{pq_path}: unreadable ({exc}); reading {INDEX_NAME}", stacklevel=3)
        return None
    if table.num_rows != int(meta["num_samples"]):
        return None
    try:
        return _columns_from_table(table, label_kind, extra)
    finally:
        del table
        # the decoded pages stay in Arrow's allocator unless handed back explicitly
        pa.default_memory_pool().release_unused()


def _columns_from_table(
    table: Any, label_kind: str, extra: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], Labels, dict[str, Any]]:
    cols = {
        "nbytes": _column(table, "nbytes", np.uint32),
        "crc32": _column(table, "crc32", np.uint32),
        "offset": (
            _column(table, "offset", np.int64, fill=-1)
            if "offset" in table.column_names
            else np.empty(0, np.int64)
        ),
        "shard": _column(table, "shard", np.int32, fill=-1),
    }
    if label_kind == "int":
        labels = Labels("int", ints=_column(table, "label_int", np.int64))
    elif label_kind == "json":
        labels = Labels("json", texts=table.column("label_json").combine_chunks())
    else:
        labels = Labels("none")
    extra_cols: dict[str, Any] = {}
    for name in extra:
        column = table.column(name).combine_chunks()
        extra_cols[name] = column if name in ("path", "format") else column.fill_null(-1).to_numpy()
    return cols, labels, extra_cols


def _check_shard_column(shard: np.ndarray, bounds: np.ndarray, where: Path) -> None:
    """Each sample's shard in the columnar index agrees with meta.json's shard table."""
    if len(shard) != int(bounds[-1]):
        return  # the count check below names the disagreement
    ok = bool((shard[1:] >= shard[:-1]).all()) if len(shard) > 1 else True
    for number in range(len(bounds) - 1):
        lo, hi = int(bounds[number]), int(bounds[number + 1])
        if ok and hi > lo:
            ok = int(shard[lo]) == number and int(shard[hi - 1]) == number
        if not ok:
            break
    if not ok:
        wrong = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)) != shard
        at = int(np.argmax(wrong))
        raise DatasetFormatError(
            f"{where}: sample {at} is in shard {int(shard[at])}, but the shard table of "
            f"{META_NAME} puts it in shard {int(np.searchsorted(bounds, at, side='right')) - 1}"
        )


def load_index(
    root: str | os.PathLike[str], *, extra: tuple[str, ...] = (), prefer_columnar: bool = True
) -> DatasetIndex:
    """Load the dataset at `root` into a `DatasetIndex`.

    Args:
        root: the dataset directory (``OUT`` of ``packer build``).
        extra: more columns to load (``width``, ``height``, ``channels``, ``format``, ``path``).
        prefer_columnar: use ``index.parquet`` when it is present and fresh.

    Raises:
        DatasetFormatError: meta.json or the index is missing, malformed, or disagrees.
    """
    root = Path(root)
    meta = load_meta(root)
    bounds, names = shard_table(meta, root / META_NAME)
    loaded = _load_parquet(root, meta, extra) if prefer_columnar else None
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
        _check_shard_column(shard, bounds, root / INDEX_COLUMNAR_NAME)
    # what an offset means (and whether reading needs it) is the format's business
    fmt = get_format(meta["format"]) or ShardFormat()
    offset = fmt.index_offsets(cols["offset"], len(cols["nbytes"]))
    return DatasetIndex(
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
