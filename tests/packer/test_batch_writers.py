"""`ShardPart.add_batch` writes exactly the bytes that `ShardPart.add` of each record gives: the
shard files, the index rows and columns, the completion marker, for every registered format,
every kind of label, payloads that hold the RecordIO magic word, ids whose header holds it, and
LMDB commits that fall inside and across batches."""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.formats import FORMATS
from packer.records import Record
from packer.writers import lmdb as lmdb_writer
from packer.writers.batch import RecordBatch
from packer.writers.part import ShardPart
from readers.formats.recordio import MAGIC, MAGIC_BYTES

MAGIC_FLOAT = struct.unpack("<f", MAGIC_BYTES)[0]  # a label whose float32 is the magic word


def _record(i: int, data: bytes, label: Any, compression: str | None = None) -> Record:
    fmt = "raw" if compression else "jpeg"
    return Record(
        f"d/ü {i}.jpg", label, data, fmt, 3 + i, 2, 3, zlib.crc32(data), compression=compression
    )


def _data(rng: np.random.Generator, i: int) -> bytes:
    data = bytearray(rng.integers(0, 256, 40 + 7 * (i % 5), dtype=np.uint8).tobytes())
    if i % 4 == 1:  # the magic word at an aligned offset of the payload: a multi-part record
        data[4 * (i % 3) : 4 * (i % 3) + 4] = MAGIC_BYTES
    if i % 4 == 2:  # ... at an unaligned one: still one part
        data[5:9] = MAGIC_BYTES
    return bytes(data)


def int_records(n: int, seed: int = 0) -> list[Record]:
    rng = np.random.default_rng(seed)
    # 2**62 + 2**38 + 1 rounds to another float32 directly than through float64 (as Python does)
    labels = [0, 7, -3, 2**24 + 1, 2**53 + 1, 2**62 + 2**38 + 1]
    return [_record(i, _data(rng, i), labels[i % len(labels)]) for i in range(n)]


def mixed_records(n: int, seed: int = 1) -> list[Record]:
    rng = np.random.default_rng(seed)
    labels: list[Any] = [
        'text ü "q"',
        [1.5, 2.0],
        {"box": [1, 2]},
        None,
        True,
        2.5,
        3,
        [MAGIC_FLOAT],
        MAGIC_FLOAT,
        [],
        1e300,
    ]
    found = []
    for i in range(n):
        compression = "lz4" if i % 6 == 5 else None
        found.append(_record(i, _data(rng, i), labels[i % len(labels)], compression))
    return found


def as_batch(records: list[Record]) -> RecordBatch:
    labels = [r.label for r in records]
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in labels)
    return RecordBatch(
        [r.rel for r in records],
        [r.data for r in records],
        labels,
        [r.format for r in records],
        [r.width for r in records],
        [r.height for r in records],
        [r.channels for r in records],
        [r.crc32 for r in records],
        [r.compression for r in records],
        np.asarray(labels, np.int64) if ints and records else None,
    )


def files_of(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "lock.mdb"
    }


def write(
    root: Path, fmt: str, records: list[Record], cuts: list[int], *, first_id: int, batched: bool
) -> dict[str, Any]:
    """Write `records` as shard 0 under `root`: one by one, or as batches cut at `cuts`
    (alternating with one-by-one runs, so that both paths share one writer's state)."""
    root.mkdir()
    part = ShardPart(root, 0, FORMATS[fmt].writer, first_id=first_id)
    bounds = [0, *cuts, len(records)]
    for n, (a, b) in enumerate(itertools.pairwise(bounds)):
        if batched and n % 3 != 2:
            part.add_batch(as_batch(records[a:b]))
        else:
            for record in records[a:b]:
                part.add(record)
    return part.finish([])


@pytest.mark.parametrize("kind", ["int", "mixed"])
def test_batches_write_the_bytes_of_records_one_by_one(tmp_path: Path, fmt: str, kind: str) -> None:
    records = int_records(60) if kind == "int" else mixed_records(60)
    cuts = [1, 2, 17, 30, 31, 45]
    one = write(tmp_path / "one", fmt, records, cuts, first_id=5, batched=False)
    many = write(tmp_path / "many", fmt, records, cuts, first_id=5, batched=True)
    assert one == many
    a, b = files_of(tmp_path / "one"), files_of(tmp_path / "many")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    if fmt == "recordio":  # the magic in payloads made multi-part records, in both
        rec = a["shard-00000.rec"]
        words = np.frombuffer(rec, "<u4")
        assert (words == MAGIC).sum() > len(records)


def test_ids_whose_header_holds_the_magic(tmp_path: Path) -> None:
    """IRHeader.id's low word equal to the magic: that record is split, in bulk as one by one."""
    records = int_records(6)
    first = MAGIC - 2
    one = write(tmp_path / "one", "recordio", records, [3], first_id=first, batched=False)
    many = write(tmp_path / "many", "recordio", records, [], first_id=first, batched=True)
    assert one == many
    assert files_of(tmp_path / "one") == files_of(tmp_path / "many")


def test_lmdb_commits_fall_where_they_fall_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits by count and by bytes (exactly at the limit too), inside batches and across
    them: the same commits, so the same pages."""
    monkeypatch.setattr(lmdb_writer, "_COMMIT_RECORDS", 7)
    monkeypatch.setattr(lmdb_writer, "_COMMIT_BYTES", 200)
    shard_cls = lmdb_writer.LmdbShardWriter
    real = shard_cls._commit
    commits: list[tuple[int, int]] = []

    def commit(self: Any, *args: Any) -> None:
        commits.append((self.count, len(self._pending)))
        real(self, *args)

    monkeypatch.setattr(shard_cls, "_commit", commit)
    rng = np.random.default_rng(2)
    sizes = [50, 50, 50, 50, 30, 70, 100, 100, 10, 190, 200, 201, 5]  # sums that hit 200
    records = [
        _record(i, rng.integers(0, 256, sizes[i % len(sizes)], np.uint8).tobytes(), i % 3)
        for i in range(80)
    ]
    cuts = [3, 4, 20, 41, 60]
    write(tmp_path / "one", "lmdb", records, cuts, first_id=0, batched=False)
    one, commits[:] = list(commits), []
    write(tmp_path / "many", "lmdb", records, cuts, first_id=0, batched=True)
    assert commits == one
    assert len(one) > 80 // 7
    assert files_of(tmp_path / "one") == files_of(tmp_path / "many")


def test_recordio_check_batch_finds_what_check_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.writers import recordio

    monkeypatch.setattr(recordio, "MAX_PAYLOAD", 24 + 60)  # records above 60 bytes: too large
    shard_cls = FORMATS["recordio"].writer
    for records in (int_records(20), mixed_records(20)):
        batch = as_batch(records)
        found = shard_cls.check_batch(batch)
        expected = [(i, p) for i, r in enumerate(records) if (p := shard_cls.check(r)) is not None]
        assert found == expected
        assert found  # some are too large, some are not
        assert len(found) < len(records)


def test_index_rows_are_json_lines(tmp_path: Path, fmt: str) -> None:
    records = mixed_records(12)
    write(tmp_path / "many", fmt, records, [5], first_id=0, batched=True)
    rows = (tmp_path / "many" / "shard-00000.part.txt").read_text(encoding="utf-8").splitlines()
    for row, record in zip(rows, records, strict=True):
        head, _key, _offset, tail = row.split("\t")
        line = json.loads("{" + head + "," + tail)
        assert line["path"] == record.rel
        assert line["label"] == record.label
        assert line["crc32"] == record.crc32
        assert line.get("compression") == record.compression
