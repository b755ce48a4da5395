"""The format-independent part of writing a dataset: shard parts, index, shard table.

A `ShardWriter` subclass writes one shard's bytes in its format.  `ShardPart` drives one
for a planned shard and leaves, beside it in the build directory, the shard's index rows,
its problems and a completion marker; a shard with a marker is finished and is kept by
``--resume`` (and can be written by another process or machine, as the Ray engine does).
`merge_parts` then numbers the samples and writes ``index.jsonl`` and its columnar copy
``index.parquet`` line by line, so memory stays flat whatever the size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.problems import Problem
from packer.records import Record
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

    # --- per-format behaviour that the build asks the writer class about ---

    # True when an index key is the global sample id (it changes when a shard is renumbered);
    # False when keys count within the shard.
    global_keys: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def paths(cls, base: Path) -> list[Path]:
        """The files or directories a shard at `base` consists of (to clear before a rewrite)."""

    @classmethod
    def check(cls, record: Record) -> Problem | None:
        """A problem when `record` cannot be stored in this format, else None."""
        return None

    @classmethod
    def renumber(
        cls, base: Path, old_first: int, new_first: int, rows: list[dict[str, Any]]
    ) -> int | None:
        """Give the finished shard at `base`, written with sample ids from `old_first`, the ids
        from `new_first`; return its new size in bytes, or None when it did not change.

        The default suits formats whose files hold no global ids: nothing to do.
        """
        return None

    @classmethod
    def describe(cls) -> dict[str, str]:
        """What meta.json records under ``writer``: the library or layout that wrote it."""
        return {}


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def part_paths(root: Path, number: int) -> dict[str, Path]:
    """The build-time side files of planned shard `number`."""
    name = shard_name(number)
    return {
        "rows": root / f"{name}.part.jsonl",
        "errors": root / f"{name}.errors.jsonl",
        "notes": root / f"{name}.notes.jsonl",
        "offsets": root / f"{name}.offsets.npy",
        "done": root / f"{name}.done.json",
    }


def read_done(root: Path, number: int) -> dict[str, Any] | None:
    """The completion marker of planned shard `number`, or None when it is not finished."""
    try:
        with open(part_paths(root, number)["done"], encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) else None


def _label_kind(label: Any) -> str:
    if label is None:
        return "none"
    if isinstance(label, int) and not isinstance(label, bool):
        return "int"
    return "json"


class ShardPart:
    """Writes planned shard `number` of a build: its files, index rows and problems.

    Sample ids are ``first_id + n``; a writer that does not know the final first id (a Ray
    task) passes its best guess and `merge_parts` renumbers the shard.
    """

    def __init__(
        self, root: Path, number: int, shard_cls: type[ShardWriter], *, first_id: int
    ) -> None:
        self.root = root
        self.number = number
        self.first_id = first_id
        self.paths = part_paths(root, number)
        for path in self.paths.values():
            path.unlink(missing_ok=True)
        self.shard = shard_cls(root / shard_name(number))
        self.count = 0
        self.bytes = 0
        self.label_kinds: set[str] = set()
        self.notes: list[dict[str, Any]] = []  # Record.notes, with the shard-local position
        self._rows = open(self.paths["rows"], "w", encoding="utf-8", newline="\n")  # noqa: SIM115

    def add(self, record: Record) -> None:
        """Store one record."""
        key, offset = self.shard.write(self.count + 1, self.first_id + self.count, record)
        row: dict[str, Any] = {"path": record.rel, "label": record.label, "key": key}
        if offset is not None:
            row["offset"] = offset
        row.update(
            nbytes=len(record.data),
            width=record.width,
            height=record.height,
            channels=record.channels,
            format=record.format,
            crc32=record.crc32,
        )
        self._rows.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.label_kinds.add(_label_kind(record.label))
        self.notes.extend({"local": self.count, **n.as_json()} for n in record.notes)
        self.count += 1
        self.bytes += len(record.data)

    def finish(self, problems: list[Problem]) -> dict[str, Any]:
        """Close the shard, write its side files and, last, its completion marker."""
        file_bytes = self.shard.close()
        offsets = self.shard.record_offsets()
        if offsets is not None:
            with open(self.paths["offsets"], "wb") as f:
                np.save(f, offsets)
                f.flush()
                os.fsync(f.fileno())
        self._rows.flush()
        os.fsync(self._rows.fileno())
        self._rows.close()
        for key, objs in (("errors", [p.as_json() for p in problems]), ("notes", self.notes)):
            with open(self.paths[key], "w", encoding="utf-8") as f:
                for obj in objs:
                    f.write(json.dumps(obj, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        done = {
            "number": self.number,
            "first": self.first_id,
            "count": self.count,
            "bytes": self.bytes,
            "file_bytes": file_bytes,
            "label_kinds": sorted(self.label_kinds),
            # top-level names under the build directory: the LMDB directory, or .rec + .idx
            "files": sorted({p.relative_to(self.root).parts[0] for p in self.shard.files()}),
        }
        _atomic_json(self.paths["done"], done)
        return done

    def abort(self) -> None:
        """Stop after a failure; the caller removes or keeps the directory."""
        self.shard.abort()
        with contextlib.suppress(OSError):
            self._rows.close()


class IndexWriter:
    """Writes ``index.jsonl`` and ``index.parquet`` row by row."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.num_samples = 0
        self.payload_bytes = 0
        self.label_kinds: set[str] = set()
        self._index = open(root / INDEX_NAME, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._hash = hashlib.sha256()
        self._rows: list[dict[str, Any]] = []
        self._parquet = pq.ParquetWriter(root / INDEX_COLUMNAR_NAME, _PARQUET_SCHEMA)

    def add(self, row: dict[str, Any], *, stored_offset: int | None = None) -> None:
        """Append one index line (the row's ``id`` must be the line number).

        `stored_offset` is where the image bytes start in an LMDB data file: kept in
        index.parquet only, for the readers' page-cache hints.
        """
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._index.write(line)
        self._hash.update(line.encode("utf-8"))
        label = row.get("label")
        kind = _label_kind(label)
        self.label_kinds.add(kind)
        offset = row.get("offset", stored_offset)
        self._rows.append(
            {
                **row,
                "label_json": json.dumps(label, ensure_ascii=False, separators=(",", ":")),
                "label_int": label if kind == "int" else None,
                "offset": offset,
            }
        )
        if len(self._rows) >= _ROW_GROUP:
            self._flush_rows()
        self.num_samples += 1
        self.payload_bytes += int(row["nbytes"])

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
        return self._hash.hexdigest()

    def close(self) -> None:
        self._flush_rows()
        self._parquet.close()
        self._index.flush()
        os.fsync(self._index.fileno())
        self._index.close()
        fsync_path(self.root / INDEX_COLUMNAR_NAME)

    def abort(self) -> None:
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


def merge_parts(
    root: Path, numbers: list[int], *, shard_cls: type[ShardWriter] | None = None
) -> MergeResult:
    """Turn the finished parts of planned shards `numbers` into the dataset's index.

    Shards that ended up empty (every input bad) are removed and the rest renamed so that
    shard names stay consecutive; sample ids are numbered in shard order.  A shard written
    with another first id than the one it gets (by a parallel writer) is renumbered by
    ``shard_cls.renumber``, which must then be given.
    """
    index = IndexWriter(root)
    shards: list[dict[str, Any]] = []
    problems: list[Problem] = []
    notes: list[dict[str, Any]] = []
    try:
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
            with open(paths["rows"], encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            renumbered = done["first"] != first
            if renumbered:
                if shard_cls is None:
                    raise ValueError(f"{old_base}: written with first id {done['first']}")
                resized = shard_cls.renumber(old_base, int(done["first"]), first, rows)
                if resized is not None:
                    done["file_bytes"] = resized
            if new_number != number:
                new_base = root / shard_name(new_number)
                for name in done["files"]:
                    os.rename(root / name, root / name.replace(old_base.name, new_base.name, 1))
            offsets = np.load(paths["offsets"]) if paths["offsets"].exists() else None
            with open(paths["notes"], encoding="utf-8") as f:
                for line in f:
                    note = json.loads(line)
                    note["id"] = first + note.pop("local")
                    notes.append(note)
            for j, part_row in enumerate(rows):
                row = {
                    "id": first + j,
                    "path": part_row["path"],
                    "label": part_row["label"],
                    "shard": new_number,
                    **{k: v for k, v in part_row.items() if k not in ("path", "label")},
                }
                if renumbered and shard_cls is not None and shard_cls.global_keys:
                    row["key"] = str(first + j)
                stored = int(offsets[j]) if offsets is not None else None
                index.add(row, stored_offset=stored)
            shards.append(
                {
                    "name": shard_name(new_number),
                    "first": first,
                    "count": done["count"],
                    "bytes": done["bytes"],
                    "file_bytes": done["file_bytes"],
                }
            )
        index.close()
        for number in numbers:
            _remove_parts(part_paths(root, number))
    except BaseException:
        index.abort()
        raise
    result = MergeResult(index, shards, problems)
    result.notes = notes
    return result


def _remove_parts(paths: dict[str, Path]) -> None:
    for key in ("rows", "errors", "notes", "offsets", "done"):
        paths[key].unlink(missing_ok=True)
