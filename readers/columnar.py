"""``index.parquet`` -> the index's compact columns, when it is fresh; the column types.

``index.parquet`` is a columnar copy of ``index.jsonl`` written at build time; it is used
only while its recorded fingerprint matches ``index.jsonl`` (`fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import DatasetFormatError
from readers.files import check_regular, open_regular
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME

__all__ = [
    "COMPRESSIONS",
    "RAW_DIMS",
    "Labels",
    "check_shard_column",
    "fingerprint",
    "load_parquet",
]

RAW_DIMS = ("height", "width", "channels")

COMPRESSIONS = ("none", "lz4", "zstd")
"""The index's ``compression`` of a raw record (absent: ``none``), by its code in
``DatasetIndex.compression``."""

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


# The columns are read with numpy from the Arrow buffers, not with pyarrow.compute: importing
# pyarrow.compute (and pyarrow.dataset, which pq.read_table imports) costs more than reading
# the index of a 35k-sample dataset.


def _validity(array: Any) -> np.ndarray | None:
    """Per value of the Arrow array, True where it is not null; None when none is null."""
    if array.null_count == 0:
        return None
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    start = array.offset
    return np.unpackbits(bits, bitorder="little")[start : start + len(array)].astype(np.bool_)


# Arrow's names of the fixed-width number types whose numpy names differ
_NUMPY_NAMES = {"halffloat": "float16", "float": "float32", "double": "float64"}


def _values(array: Any) -> np.ndarray:
    """The values of a fixed-width number array, straight from its data buffer.

    Not ``to_numpy``: pyarrow imports pandas for it when pandas is installed (and pandas
    imports pyarrow.compute), which costs more than reading the whole index.
    """
    name = str(array.type)
    if not (name.startswith(("int", "uint")) or name in _NUMPY_NAMES):
        return np.asarray(array.to_numpy(zero_copy_only=False))
    values = np.frombuffer(array.buffers()[1], np.dtype(_NUMPY_NAMES.get(name, name)))
    return values[array.offset : array.offset + len(array)]


def _ints(column: Any, dtype: Any, fill: int) -> np.ndarray:
    """An integer column as a numpy array, `fill` where it is null."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    values = _values(array)
    valid = _validity(array)
    if valid is None:
        return np.ascontiguousarray(values, dtype=dtype)
    return np.where(valid, values, fill).astype(dtype or values.dtype)


def _string_codes(column: Any, names: tuple[str, ...]) -> np.ndarray:
    """Per value of a string column: its index in `names`, -1 for another text, -2 for null."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    n = len(array)
    codes = np.full(n, -1, np.int64)
    if n == 0:
        return codes
    buffers = array.buffers()
    wide = str(array.type) == "large_string"
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)
    offsets = offsets[array.offset : array.offset + n + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    for code, name in enumerate(names):
        text = np.frombuffer(name.encode(), np.uint8)
        rows = np.flatnonzero(lengths == len(text))
        if len(text) and len(rows):
            found = data[offsets[rows, None] + np.arange(len(text))] == text
            rows = rows[found.all(axis=1)]
        codes[rows] = code
    valid = _validity(array)
    if valid is not None:
        codes[~valid] = -2
    return codes


def _column(table: Any, name: str, dtype: Any, *, fill: int | None = None) -> np.ndarray:
    column = table.column(name)
    if fill is not None:
        return _ints(column, dtype, fill)
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if array.null_count:
        return np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype=dtype)
    return np.ascontiguousarray(_values(array), dtype=dtype)


def load_parquet(
    root: Path, meta: dict[str, Any], extra: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], Labels, dict[str, Any]] | None:
    """The columns from index.parquet, or None when it is missing or stale."""
    pq_path = root / INDEX_COLUMNAR_NAME
    if not pq_path.exists():
        return None
    check_regular(pq_path)  # a FIFO would block pyarrow forever
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
        parquet = pq.ParquetFile(pq_path)  # not pq.read_table: see _ints
        names = set(parquet.schema_arrow.names)
        stored = [n for n in ("format", "compression") if n in names and n not in extra]
        wanted = ["nbytes", "crc32", "offset", "shard", *extra, *stored]
        wanted += {"int": ["label_int"], "json": ["label_json"], "none": []}[label_kind]
        table = parquet.read(columns=wanted)
        raw, codes = _stored_columns(table)
        dims = [n for n in RAW_DIMS if n not in extra]
        if raw.any() and dims:
            more = parquet.read(columns=dims)
            for name in dims:
                table = table.append_column(name, more.column(name))
            extra = (*extra, *dims)
    except (OSError, ValueError, KeyError) as exc:
        warnings.warn(f"{pq_path}: unreadable ({exc}); reading {INDEX_NAME}", stacklevel=3)
        return None
    if table.num_rows != int(meta["num_samples"]):
        return None
    try:
        cols, labels, extra_cols = _columns_from_table(table, label_kind, extra)
        cols["raw"], cols["compression"] = raw, codes
        return cols, labels, extra_cols
    finally:
        del table
        # the decoded pages stay in Arrow's allocator unless handed back explicitly
        pa.default_memory_pool().release_unused()


def _stored_columns(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row: raw pixels or not (``format == "raw"``), and the compression code."""
    n = table.num_rows
    if "format" not in table.column_names:
        return np.zeros(n, np.bool_), np.zeros(n, np.uint8)
    raw_np = _string_codes(table.column("format"), ("raw",)) == 0
    codes = np.zeros(n, np.uint8)
    if "compression" in table.column_names:
        found = _string_codes(table.column("compression"), COMPRESSIONS)
        known = found != -1  # null is "none"
        codes[found > 0] = found[found > 0]
        if not np.all(known) or np.any(codes[~raw_np] != 0):
            raise ValueError("index.parquet: a compression that is unknown or not on a raw record")
    return raw_np, codes


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
        extra_cols[name] = column if name in ("path", "format") else _ints(column, None, -1)
    return cols, labels, extra_cols


def check_shard_column(shard: np.ndarray, bounds: np.ndarray, where: Path) -> None:
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
