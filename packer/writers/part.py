"""One planned shard of a build, written by `ShardPart`.

One planned shard of a build, written by `ShardPart`: its files and, beside them in the
build directory, its index rows, problems, notes and completion marker.

A shard with a completion marker is finished: ``--resume`` keeps it, and it may have been
written by another process or machine (the pool of the local engine, a Ray task).
`packer.writers.merge` turns the finished parts into the dataset's index.

The index rows are kept in the form the merge writes them in, so merging copies text and
columns instead of encoding JSON again: ``shard-N.part.txt`` holds one line per record,
``HEAD<TAB>KEY<TAB>OFFSET<TAB>TAIL`` (HEAD is ``"path":...,"label":...``, KEY the key as
JSON, TAIL ``"nbytes":...,"crc32":...}``, all as in the final index line; a TAB cannot occur
in JSON text), and
``shard-N.part.arrow`` the shard's index.parquet columns (with ``compression``, null for
records stored uncompressed, which the merge leaves out of a build that compresses nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from packer.problems import Problem
from packer.records import Record
from packer.writers.base import ShardWriter
from packer.writers.batch import RecordBatch
from readers.durable import fsync_path, write_durably
from readers.formats.layout import shard_name

PART_VERSION = 3
"""Of the side files; a marker of another version is not a finished part (it is rewritten)."""

PART_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("label_json", pa.string()),
        ("label_int", pa.int64()),
        ("key", pa.string()),
        ("offset", pa.int64()),
        ("nbytes", pa.int64()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("channels", pa.int32()),
        ("format", pa.string()),
        ("compression", pa.string()),
        ("crc32", pa.uint32()),
    ]
)

# built once, not per row; allow_nan=False: a NaN or infinite label raises instead of writing
# index.jsonl text that no JSON parser reads (inputs refuse them before: the last guard)
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ENCODE_STR = json.encoder.encode_basestring  # what _JSON.encode does with a str, without the call


class IndexRow(NamedTuple):
    """A record's index row, encoded once (in the process that prepared the record)."""

    head: str  # '"path":...,"label":...'
    tail: str  # '"nbytes":...,"width":...,"height":...,"channels":...,"format":...,"crc32":...'
    # ("compression":... before "crc32" when the record is compressed)
    label_json: str
    label_int: int | None
    label_kind: str  # none | int | json


def label_text(label: Any) -> tuple[str, int | None, str]:
    """A label's index text, its int (when it is a class id) and its kind (none, int, json)."""
    if label is None:
        return "null", None, "none"
    if isinstance(label, int) and not isinstance(label, bool):
        return str(label), label, "int"
    return _JSON.encode(label), None, "json"


def make_index_row(record: Record) -> IndexRow:
    """The index row of `record`, but for its id, shard, key and offset."""
    label_json, label_int, kind = label_text(record.label)
    return IndexRow(
        f'"path":{_JSON.encode(record.rel)},"label":{label_json}',
        f'"nbytes":{len(record.data)},"width":{record.width},"height":{record.height},'
        f'"channels":{record.channels},"format":{_JSON.encode(record.format)},'
        + ("" if record.compression is None else f'"compression":"{record.compression}",')
        + f'"crc32":{record.crc32}',
        label_json,
        label_int,
        kind,
    )


def part_paths(root: Path, number: int) -> dict[str, Path]:
    """The build-time side files of planned shard `number`."""
    name = shard_name(number)
    return {
        "rows": root / f"{name}.part.txt",
        "columns": root / f"{name}.part.arrow",
        "errors": root / f"{name}.errors.jsonl",
        "notes": root / f"{name}.notes.jsonl",
        "done": root / f"{name}.done.json",
    }


def read_done(root: Path, number: int) -> dict[str, Any] | None:
    """The completion marker of planned shard `number`, or None when it is not finished."""
    try:
        with open(part_paths(root, number)["done"], encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict) or done.get("part_version") != PART_VERSION:
        return None
    return done


class ShardPart:
    """Writes planned shard `number` of a build: its files, index rows and problems.

    Sample ids are ``first_id + n``; a writer that does not know the final first id (a Ray
    task, a pool process) passes its best guess and `merge_parts` renumbers the shard.
    """

    def __init__(
        self,
        root: Path,
        number: int,
        shard_cls: type[ShardWriter],
        *,
        first_id: int,
        shard: ShardWriter | None = None,
    ) -> None:
        self.root = root
        self.number = number
        self.first_id = first_id
        self.paths = part_paths(root, number)
        for path in self.paths.values():
            path.unlink(missing_ok=True)
        # `shard`: a writer made by the caller (a reused shard's, `packer.writers.reuse`)
        self.shard = shard_cls(root / shard_name(number)) if shard is None else shard
        self.marker: dict[str, Any] = {}  # more for the completion marker
        self.count = 0
        self.bytes = 0
        self.label_kinds: set[str] = set()
        self.notes: list[dict[str, Any]] = []  # Record.notes, with the shard-local position
        self._rows = open(self.paths["rows"], "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._values: list[tuple[Any, ...]] = []  # one index.parquet row (PART_SCHEMA) each

    def add(self, record: Record, row: IndexRow | None = None) -> None:
        """Store one record; `row` is its `make_index_row` when the caller made it already."""
        key, offset = self.shard.write(self.count + 1, self.first_id + self.count, record)
        if row is None:
            row = make_index_row(record)
        at = "" if offset is None else offset
        self._rows.write(f"{row.head}\t{_JSON.encode(key)}\t{at}\t{row.tail}}}\n")
        self._values.append(
            (
                record.rel,
                row.label_json,
                row.label_int,
                key,
                offset,
                len(record.data),
                record.width,
                record.height,
                record.channels,
                record.format,
                record.compression,
                record.crc32,
            )
        )
        self.label_kinds.add(row.label_kind)
        if record.notes:
            self.notes.extend({"local": self.count, **n.as_json()} for n in record.notes)
        self.count += 1
        self.bytes += len(record.data)

    def add_batch(self, batch: RecordBatch) -> None:
        """Store the records of `batch`: the same files and rows as `add` of each in turn."""
        n = len(batch)
        if n == 0:
            return
        keys, offsets = self.shard.write_batch(self.count + 1, self.first_id + self.count, batch)
        if batch.int_labels is not None:
            label_int: list[Any] = batch.label
            label_json = list(map(str, label_int))
            kinds = {"int"}
        else:
            texts = list(map(label_text, batch.label))
            label_json, label_int = [t[0] for t in texts], [t[1] for t in texts]
            kinds = {t[2] for t in texts}
        nbytes = batch.sizes()
        formats = {f: _JSON.encode(f) for f in set(batch.format)}
        compressed = {
            c: "" if c is None else f'"compression":"{c}",' for c in set(batch.compression)
        }
        columns = (
            map(_ENCODE_STR, batch.rel),
            label_json,
            map(_ENCODE_STR, keys),
            ("" if o is None else o for o in offsets),
            nbytes,
            batch.width,
            batch.height,
            batch.channels,
            batch.format,
            batch.compression,
            batch.crc32,
        )
        self._rows.write(
            "".join(
                [
                    f'"path":{p},"label":{lj}\t{k}\t{o}\t"nbytes":{nb},"width":{w},"height":{h},'
                    f'"channels":{c},"format":{formats[f]},{compressed[z]}"crc32":{crc}}}\n'
                    for p, lj, k, o, nb, w, h, c, f, z, crc in zip(*columns, strict=True)
                ]
            )
        )
        self._values.extend(
            zip(
                batch.rel,
                label_json,
                label_int,
                keys,
                offsets,
                nbytes,
                batch.width,
                batch.height,
                batch.channels,
                batch.format,
                batch.compression,
                batch.crc32,
                strict=True,
            )
        )
        self.label_kinds.update(kinds)
        self.count += n
        self.bytes += sum(nbytes)

    def finish(self, problems: list[Problem]) -> dict[str, Any]:
        """Close the shard, write its side files and, last, its completion marker."""
        file_bytes = self.shard.close()
        columns: list[Any] = [list(c) for c in zip(*self._values, strict=True)] or [
            [] for _ in PART_SCHEMA.names
        ]
        late = self.shard.record_offsets()  # where the bytes start, for index.parquet
        if late is not None:
            columns[PART_SCHEMA.get_field_index("offset")] = late.tolist()
        self._rows.flush()
        os.fsync(self._rows.fileno())
        self._rows.close()
        table = pa.Table.from_arrays(columns, schema=PART_SCHEMA)
        with (
            pa.OSFile(str(self.paths["columns"]), "wb") as sink,
            pa.ipc.new_file(sink, PART_SCHEMA) as arrow,
        ):
            arrow.write_table(table)
        fsync_path(self.paths["columns"])
        write_durably(self.paths["errors"], [_JSON.encode(p.as_json()) + "\n" for p in problems])
        write_durably(self.paths["notes"], [_JSON.encode(n) + "\n" for n in self.notes])
        done = {
            "part_version": PART_VERSION,
            "number": self.number,
            "first": self.first_id,
            "count": self.count,
            "bytes": self.bytes,
            "file_bytes": file_bytes,
            "label_kinds": sorted(self.label_kinds),
            # top-level names under the build directory: the LMDB directory, or .rec + .idx
            "files": sorted({p.relative_to(self.root).parts[0] for p in self.shard.files()}),
            **self.marker,
        }
        tmp = self.paths["done"].with_name(self.paths["done"].name + ".tmp")
        write_durably(tmp, json.dumps(done))
        os.replace(tmp, self.paths["done"])
        return done

    def abort(self) -> None:
        """Stop after a failure; the caller removes or keeps the directory."""
        self.shard.abort()
        with contextlib.suppress(OSError):
            self._rows.close()


def clear_part(tmp: Path, number: int, shard_cls: type[ShardWriter]) -> None:
    """Remove what an unfinished earlier write of planned shard `number` left in `tmp`.

    LMDB would append to an environment left there; the files are unlinked, not written over,
    so a file that is a hard link of another dataset's (a reused shard) is never changed.
    """
    part_paths(tmp, number)["done"].unlink(missing_ok=True)  # unfinished from here on
    for path in shard_cls.paths(tmp / shard_name(number)):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def start_part(tmp: Path, number: int, shard_cls: type[ShardWriter], *, first_id: int) -> ShardPart:
    """Clear what an earlier write of shard `number` left in `tmp` (`clear_part`); open its part."""
    clear_part(tmp, number, shard_cls)
    return ShardPart(tmp, number, shard_cls, first_id=first_id)
