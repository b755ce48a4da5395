"""The merge: finished shard parts become the index and the shard table.

The merge: the finished shard parts of a build become ``index.jsonl``, ``index.parquet``
and the shard table, with sample ids numbered in shard order.

Each part's rows are copied as text and columns (`packer.writers.part`): no JSON is encoded
again here, and memory holds one shard's columns at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.problems import Problem
from packer.writers.base import ShardWriter
from packer.writers.part import PART_SCHEMA, part_paths, read_done
from readers.durable import fsync_path
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, shard_name

# index.parquet: a part's columns plus the global id and the shard number
COMPRESSED_SCHEMA = PART_SCHEMA.insert(0, pa.field("id", pa.int64())).insert(
    4, pa.field("shard", pa.int32())
)
# ... and without ``compression`` when nothing is compressed (as before there was any)
PARQUET_SCHEMA = COMPRESSED_SCHEMA.remove(COMPRESSED_SCHEMA.get_field_index("compression"))
_ROW_GROUP = 65536


def _arrow(values: np.ndarray) -> pa.Array:
    """A numpy array of numbers as an Arrow array, without a copy.

    Not by pa.array, whose first call on a numpy array imports numpy.ma: 30 ms of every
    build's start.
    """
    kind = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


class IndexWriter:
    """Writes ``index.jsonl`` and ``index.parquet`` a shard part at a time."""

    def __init__(self, root: Path, *, compressed: bool = False) -> None:
        self.root = root
        self.schema = COMPRESSED_SCHEMA if compressed else PARQUET_SCHEMA
        self.num_samples = 0
        self.payload_bytes = 0
        self.label_kinds: set[str] = set()
        self._index = open(root / INDEX_NAME, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._hash = hashlib.sha256()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._parquet = pq.ParquetWriter(root / INDEX_COLUMNAR_NAME, self.schema)

    def add_part(
        self,
        rows: Path,
        columns: pa.Table,
        *,
        shard: int,
        done: dict[str, Any],
        global_keys: bool,
    ) -> None:
        """Append the rows of a finished part as shard `shard`, ids from `num_samples` on.

        `global_keys`: the keys are sample ids, written anew (the part had other ids).
        """
        first = self.num_samples
        lines = []
        with open(rows, encoding="utf-8") as f:
            for j, line in enumerate(f):
                head, key, offset, tail = line.split("\t", 3)
                if global_keys:
                    key = f'"{first + j}"'
                at = f',"offset":{offset}' if offset else ""
                lines.append(f'{{"id":{first + j},{head},"shard":{shard},"key":{key}{at},{tail}')
        if len(lines) != columns.num_rows or len(lines) != done["count"]:
            raise ValueError(f"{rows}: {len(lines)} rows, {done['count']} records")
        text = "".join(lines)
        self._index.write(text)
        self._hash.update(text.encode("utf-8"))
        arrays: dict[str, Any] = {name: columns.column(name) for name in columns.column_names}
        arrays["id"] = _arrow(np.arange(first, first + len(lines), dtype=np.int64))
        arrays["shard"] = _arrow(np.full(len(lines), shard, dtype=np.int32))
        if global_keys:
            arrays["key"] = pa.array([str(first + j) for j in range(len(lines))], pa.string())
        # the part's columns have the index's types already: no cast (which would import
        # pyarrow.compute, 80 ms)
        if self.schema is PARQUET_SCHEMA and arrays["compression"].null_count != len(lines):
            raise ValueError(f"{rows}: compressed records in a build that compresses nothing")
        table = pa.Table.from_arrays(
            [arrays[name] for name in self.schema.names], schema=self.schema
        )
        self._pending.append(table)
        self._pending_rows += len(lines)
        while self._pending_rows >= _ROW_GROUP:
            self._flush(_ROW_GROUP)
        self.num_samples += len(lines)
        self.payload_bytes += int(done["bytes"])
        self.label_kinds.update(done["label_kinds"])

    def add_dataset(self, root: Path, meta: dict[str, Any]) -> None:
        """Copy the index of the finished dataset `root` (its `meta`) first, unchanged.

        ``packer append`` keeps every old line byte for byte; the new parts follow it.
        """
        if self.num_samples:
            raise ValueError("a dataset's index can only come first")
        lines = 0
        with open(root / INDEX_NAME, encoding="utf-8", newline="\n") as f:
            for line in f:
                self._index.write(line)
                self._hash.update(line.encode("utf-8"))
                lines += 1
        rows = 0
        for batch in pq.ParquetFile(root / INDEX_COLUMNAR_NAME).iter_batches(65536):
            table = pa.Table.from_batches([batch]).select(PARQUET_SCHEMA.names)
            if table.schema != PARQUET_SCHEMA:
                table = table.cast(PARQUET_SCHEMA)
            self._pending.append(table)
            self._pending_rows += table.num_rows
            rows += table.num_rows
            while self._pending_rows >= _ROW_GROUP:
                self._flush(_ROW_GROUP)
        if lines != int(meta["num_samples"]) or rows != lines:
            raise ValueError(
                f"{root}: {lines} index lines and {rows} index.parquet rows, "
                f"{meta['num_samples']} samples in meta.json"
            )
        self.num_samples = lines
        self.payload_bytes = int(meta.get("payload_bytes") or 0)
        self.label_kinds.add(str(meta.get("label_kind") or "json"))

    def _flush(self, rows: int) -> None:
        """Write the first `rows` pending rows as one row group (whatever the shard sizes)."""
        table = pa.concat_tables(self._pending)
        self._parquet.write_table(table.slice(0, rows), row_group_size=rows)
        rest = table.slice(rows)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

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
        """The SHA-256 of the index.jsonl written so far."""
        return self._hash.hexdigest()

    def close(self) -> None:
        """Flush, fsync and close index.jsonl and index.parquet."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._parquet.close()
        self._index.flush()
        os.fsync(self._index.fileno())
        self._index.close()
        fsync_path(self.root / INDEX_COLUMNAR_NAME)

    def abort(self) -> None:
        """Close the index files without finishing them."""
        with contextlib.suppress(Exception):
            self._index.close()
        with contextlib.suppress(Exception):
            self._parquet.close()


class MergeResult:
    """What merging the shard parts produced, for meta.json."""

    def __init__(self, index: IndexWriter, shards: list[dict[str, Any]], problems: list[Problem]):
        self.num_samples = index.num_samples
        self.payload_bytes = index.payload_bytes
        self.label_kind = index.label_kind
        self.index_sha256 = index.index_sha256
        self.shards = shards
        self.problems = problems
        self.notes: list[dict[str, Any]] = []  # warnings.jsonl objects, with final ids


def _read_columns(path: Path) -> pa.Table:
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()


def merge_parts(
    root: Path,
    numbers: list[int],
    *,
    shard_cls: type[ShardWriter] | None = None,
    compressed: bool = False,
    after: tuple[Path, dict[str, Any]] | None = None,
    after_part: Callable[[int], None] | None = None,
) -> MergeResult:
    """Turn the finished parts of planned shards `numbers` into the dataset's index.

    Shards that ended up empty (every input bad) are removed and the rest renamed so that
    shard names stay consecutive; sample ids are numbered in shard order.  A shard written
    with another first id than the one it gets (by a parallel writer) is renumbered by
    ``shard_cls.renumber``, which must then be given.  `compressed`: the build compresses
    raw pixels, so index.parquet has a ``compression`` column.

    `after` (a finished dataset and its meta.json, for ``packer append``): its index lines and
    shard table come first, unchanged, and the parts' ids and shard numbers continue after it.
    `after_part` is called with each planned shard's number once its rows are in the index
    (the kill tests stop there).
    """
    index = IndexWriter(root, compressed=compressed)
    shards: list[dict[str, Any]] = []
    problems: list[Problem] = []
    notes: list[dict[str, Any]] = []
    try:
        if after is not None:
            index.add_dataset(*after)
            shards.extend(dict(s) for s in after[1]["shards"])
        for number in numbers:
            done = read_done(root, number)
            if done is None:
                raise FileNotFoundError(f"shard part {shard_name(number)} is not finished")
            paths = part_paths(root, number)
            with open(paths["errors"], encoding="utf-8") as f:
                problems.extend(Problem(**json.loads(line)) for line in f)
            old_base = root / shard_name(number)
            if done["count"] == 0:
                for name in done["files"]:
                    target = root / name
                    if target.is_dir():
                        shutil.rmtree(target)
                    else:
                        target.unlink(missing_ok=True)
                continue
            new_number = len(shards)
            first = index.num_samples
            columns = _read_columns(paths["columns"])
            renumbered = done["first"] != first
            if renumbered:
                if shard_cls is None:
                    raise ValueError(f"{old_base}: written with first id {done['first']}")
                offsets = columns.column("offset").to_pylist()
                resized = shard_cls.renumber(old_base, int(done["first"]), first, offsets)
                if resized is not None:
                    done["file_bytes"] = resized
            if new_number != number:
                new_base = root / shard_name(new_number)
                for name in done["files"]:
                    os.rename(root / name, root / name.replace(old_base.name, new_base.name, 1))
            with open(paths["notes"], encoding="utf-8") as f:
                for line in f:
                    note = json.loads(line)
                    note["id"] = first + note.pop("local")
                    notes.append(note)
            global_keys = renumbered and shard_cls is not None and shard_cls.global_keys
            index.add_part(
                paths["rows"], columns, shard=new_number, done=done, global_keys=global_keys
            )
            shards.append(
                {
                    "name": shard_name(new_number),
                    "first": first,
                    "count": done["count"],
                    "bytes": done["bytes"],
                    "file_bytes": done["file_bytes"],
                }
            )
            if after_part is not None:
                after_part(number)
        index.close()
        for number in numbers:
            for path in part_paths(root, number).values():
                path.unlink(missing_ok=True)
    except BaseException:
        index.abort()
        raise
    result = MergeResult(index, shards, problems)
    result.notes = notes
    return result
