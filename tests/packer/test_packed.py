"""`packer.packed.PackedRecords`: bulk reads hint each batch's bytes to the OS before reading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer import packed as packed_module
from packer.packed import PackedRecords
from packer.problems import Problem
from readers.formats import REGISTRY


@pytest.mark.parametrize("ahead", [1, 1 << 30])
def test_every_batch_is_hinted_before_it_is_read(
    packed: Any, monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    """Each record's stored bytes lie in a hinted range of its shard's data file, hinted before
    the record is read, and no more than `HINT_AHEAD` bytes beyond the batch being read."""
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(packed_module, "BATCH_RECORDS", 3)
    monkeypatch.setattr(packed_module, "HINT_AHEAD", ahead)
    monkeypatch.setattr(
        packed_module, "willneed", lambda path, b, e: events.append(("hint", (path, b, e)))
    )
    records = PackedRecords(packed.path)
    fmt = REGISTRY[packed.format]
    original = type(fmt).read_stored

    def read_stored(self: Any, shard_path: str, positions: Any, offsets: Any) -> Any:
        events.append(("read", (shard_path, list(offsets))))
        return original(self, shard_path, positions, offsets)

    monkeypatch.setattr(type(fmt), "read_stored", read_stored)

    got = list(records.read_batches(0, records.n))
    assert not [g for g in got if isinstance(g, Problem)]
    assert sum(len(g) for g in got) == records.n == len(packed.files)

    nbytes = records.index.nbytes.astype(np.int64)
    reads = [(k, e[1]) for k, e in enumerate(events) if e[0] == "read"]
    assert len(reads) == -(-records.n // 3)
    seen = 0
    for at, (shard_path, offsets) in reads:
        hinted = [e[1] for e in events[:at] if e[0] == "hint"]
        data_file = fmt.data_file(shard_path)
        for j, offset in enumerate(offsets):
            i = seen + j
            assert offset == records.offsets[i] >= 0
            end = offset + int(nbytes[i])
            assert any(p == data_file and b <= offset and end <= e for p, b, e in hinted), i
        seen += len(offsets)
    kinds = [e[0] for e in events]
    if ahead == 1:  # a window of one byte: each batch's hints come just before its read
        starts = [0] + [at + 1 for at, _ in reads[:-1]]
        for start, (at, (_, offsets)) in zip(starts, reads, strict=True):
            own = events[start:at]
            assert own
            assert all(kind == "hint" for kind, _ in own)
            assert min(b for _, (_, b, _) in own) <= min(offsets)
            assert max(e for _, (_, _, e) in own) > max(offsets)
    else:  # a window larger than the dataset: all of it hinted before the first read
        first = kinds.index("read")
        assert first > 0
        assert "hint" not in kinds[first:]


def test_a_hint_that_fails_reads_as_before(packed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data file that cannot be hinted (OSError) is read all the same."""

    def fail(path: str, b: int, e: int) -> int:
        raise OSError("no hints here")

    monkeypatch.setattr(packed_module, "willneed", fail)
    records = PackedRecords(packed.path)
    data = [r.data for r in packed_module.one_by_one(records.read_batches(0, records.n))]
    stored = sorted(bytes(d) for d in data)
    assert stored == sorted(packed.files.values())


def test_a_dataset_without_offsets_is_read_without_hints(
    tmp_path: Path, packed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the index has no offsets (-1), nothing is hinted and every record is read."""
    calls: list[Any] = []
    monkeypatch.setattr(packed_module, "willneed", lambda *a: calls.append(a))
    records = PackedRecords(packed.path)
    records.offsets = np.full(records.n, -1, np.int64)
    if packed.format != "lmdb":  # a RecordIO read needs its offsets; the hint part is the same
        assert records._hint(0, 0, records.n, None) == int(records.index.nbytes.sum())
        assert calls == []
        return
    data = [r.data for r in packed_module.one_by_one(records.read_batches(0, records.n))]
    assert sorted(bytes(d) for d in data) == sorted(packed.files.values())
    assert calls == []
