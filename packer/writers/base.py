"""The format-independent part of writing a dataset: shard rollover, index, shard table.

A `ShardWriter` subclass writes one shard's bytes in its format; `DatasetWriter` decides
when to start a new shard, numbers the samples, and writes ``index.jsonl`` (plus its
columnar copy ``index.parquet``) line by line so memory stays flat whatever the size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.encode import Record
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, shard_name

_PARQUET_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("path", pa.string()),
        ("label_json", pa.string()),
        ("label_int", pa.int64()),
        ("shard", pa.int32()),
        ("key", pa.string()),
        ("offset", pa.int64()),
        ("nbytes", pa.int64()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("channels", pa.int32()),
        ("format", pa.string()),
        ("crc32", pa.uint32()),
    ]
)
_ROW_GROUP = 65536


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter(ABC):
    """Writes the records of one shard; subclasses define the byte layout."""

    format: ClassVar[str]
    # True when record offsets are known only once the shard is closed (LMDB): the dataset
    # writer then holds the shard's index.parquet rows until record_offsets() can fill them.
    late_offsets: ClassVar[bool] = False

    def __init__(self, base: Path) -> None:
        """`base` is the shard's path without suffix, e.g. ``OUT/shard-00000``."""
        self.base = base

    @abstractmethod
    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Store the `local`-th record (1-based) of the shard; return its (key, offset)."""

    @abstractmethod
    def close(self) -> int:
        """Flush, fsync and close the shard; return its size in bytes on disk."""

    @abstractmethod
    def abort(self) -> None:
        """Close without finishing (the build failed); the files are removed by the caller."""

    @abstractmethod
    def files(self) -> list[Path]:
        """The files this shard consists of."""

    def record_offsets(self) -> np.ndarray | None:
        """After close(): each record's byte offset in its file, when only then known."""
        return None


class DatasetWriter:
    """Writes the shards and the index of one dataset into `root` (a temporary directory)."""

    def __init__(self, root: Path, shard_cls: type[ShardWriter], *, shard_size: int) -> None:
        self.root = root
        self.shard_cls = shard_cls
        self.shard_size = shard_size
        self.shards: list[dict[str, Any]] = []
        self.num_samples = 0
        self.payload_bytes = 0
        self.label_kinds: set[str] = set()
        self._shard: ShardWriter | None = None
        self._shard_bytes = 0
        self._shard_count = 0
        # open for the writer's whole life; closed in close() or abort()
        self._index = open(root / INDEX_NAME, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._index_hash = hashlib.sha256()
        self._rows: list[dict[str, Any]] = []
        self._parquet = pq.ParquetWriter(root / INDEX_COLUMNAR_NAME, _PARQUET_SCHEMA)

    def _roll(self) -> None:
        self._finish_shard()
        number = len(self.shards)
        self._shard = self.shard_cls(self.root / shard_name(number))
        self.shards.append(
            {"name": shard_name(number), "first": self.num_samples, "count": 0, "bytes": 0}
        )
        self._shard_bytes = 0
        self._shard_count = 0

    def _finish_shard(self) -> None:
        if self._shard is None:
            return
        file_bytes = self._shard.close()
        offsets = self._shard.record_offsets()
        if offsets is not None:
            rows = self._rows[len(self._rows) - self._shard_count :]
            for row, offset in zip(rows, offsets.tolist(), strict=True):
                row["offset"] = offset
        self._flush_rows()
        self.shards[-1].update(
            count=self._shard_count, bytes=self._shard_bytes, file_bytes=file_bytes
        )
        self._shard = None

    def add(self, record: Record) -> dict[str, Any]:
        """Store one record in the current shard (starting a new one when it is full)."""
        size = len(record.data)
        if self._shard is None or (
            self._shard_count > 0 and self._shard_bytes + size > self.shard_size
        ):
            self._roll()
        assert self._shard is not None
        sample_id = self.num_samples
        key, offset = self._shard.write(self._shard_count + 1, sample_id, record)
        row: dict[str, Any] = {
            "id": sample_id,
            "path": record.rel,
            "label": record.label,
            "shard": len(self.shards) - 1,
            "key": key,
        }
        if offset is not None:
            row["offset"] = offset
        row.update(
            nbytes=size,
            width=record.width,
            height=record.height,
            channels=record.channels,
            format=record.format,
            crc32=record.crc32,
        )
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._index.write(line)
        self._index_hash.update(line.encode("utf-8"))
        self._add_row(row)
        self._shard_count += 1
        self._shard_bytes += size
        self.shards[-1]["count"] = self._shard_count
        self.num_samples += 1
        self.payload_bytes += size
        return row

    def _add_row(self, row: dict[str, Any]) -> None:
        label = row["label"]
        if label is None:
            kind = "none"
        elif isinstance(label, int) and not isinstance(label, bool):
            kind = "int"
        else:
            kind = "json"
        self.label_kinds.add(kind)
        self._rows.append(
            {
                **row,
                "label_json": json.dumps(label, ensure_ascii=False, separators=(",", ":")),
                "label_int": label if kind == "int" else None,
                "offset": row.get("offset"),
            }
        )
        if len(self._rows) >= _ROW_GROUP and not self.shard_cls.late_offsets:
            self._flush_rows()

    def _flush_rows(self) -> None:
        if self._rows:
            self._parquet.write_table(pa.Table.from_pylist(self._rows, schema=_PARQUET_SCHEMA))
            self._rows = []

    @property
    def label_kind(self) -> str:
        """``none``, ``int`` or ``json``: the compact form readers load the labels into."""
        if self.label_kinds <= {"none"}:
            return "none"
        if self.label_kinds == {"int"}:
            return "int"
        return "json"

    @property
    def index_sha256(self) -> str:
        return self._index_hash.hexdigest()

    def close(self) -> None:
        """Finish the last shard and the index; fsync everything written."""
        self._finish_shard()
        self._flush_rows()
        self._parquet.close()
        self._index.flush()
        os.fsync(self._index.fileno())
        self._index.close()
        fsync_path(self.root / INDEX_COLUMNAR_NAME)

    def abort(self) -> None:
        """Stop after a failure; the caller removes the directory."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None
        self._index.close()
        with contextlib.suppress(Exception):
            self._parquet.close()
