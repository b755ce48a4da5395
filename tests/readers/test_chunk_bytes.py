"""Default chunk size by stored bytes: ``chunk_size=None`` -> about CHUNK_BYTES per chunk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from readers import ShardStream, open_dataset
from readers.io.hints import (
    CHUNK_BYTES,
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    PREFETCH_BYTES,
    resolve_chunk_size,
)
from readers.order import chunk_order, split_for_rank
from readers.samplers import DEFAULT_WINDOW, ChunkShuffleBatchSampler, ChunkShuffleSampler
from tests.conftest import Packed, build_packed, encode, write_tree


class Index:
    """The part of a dataset's index the samplers read: stored bytes per sample."""

    def __init__(self, nbytes: np.ndarray) -> None:
        self.nbytes = nbytes


class SizedRecords:
    """A dataset whose index says how many bytes each sample stores (no reads)."""

    def __init__(self, nbytes: list[int] | np.ndarray, bounds: list[int] | None = None) -> None:
        self.index = Index(np.asarray(nbytes, dtype=np.uint32))
        self.n = int(self.index.nbytes.size)
        self.shard_bounds = np.asarray(bounds or [0, self.n], dtype=np.int64)
        self.labels = np.arange(self.n) % 3

    def __len__(self) -> int:
        return self.n


def sampler(ds: Any, **kw: Any) -> ChunkShuffleSampler:
    return ChunkShuffleSampler(ds, rank=kw.pop("rank", 0), world_size=kw.pop("world_size", 1), **kw)


@pytest.mark.parametrize(
    ("record", "want"),
    [
        (5_000, CHUNK_BYTES // 5_000),  # small icons: ~200 samples, about 1 MiB
        (100_000, DEFAULT_CHUNK_SIZE),  # 100 KB records: 10 would do, 64 is the floor
        (1 << 20, DEFAULT_CHUNK_SIZE),  # large records keep today's 64
        (10, MAX_CHUNK_SIZE),  # tiny records: capped
    ],
)
def test_default_chunk_by_record_size(record: int, want: int) -> None:
    ds = SizedRecords(np.full(10_000, record))
    s = sampler(ds)
    assert s.chunk_size == want
    assert s.state_dict()["chunk_size"] == want
    assert (
        list(s) == chunk_order(ds.shard_bounds, chunk_size=want, window=8, seed=0, epoch=0).tolist()
    )


def test_explicit_chunk_size_is_kept() -> None:
    ds = SizedRecords(np.full(1_000, 5_000))
    for cs in (1, 7, 64, 5_000):
        s = sampler(ds, chunk_size=cs, seed=3)
        assert s.chunk_size == cs
        order = chunk_order(ds.shard_bounds, chunk_size=cs, window=DEFAULT_WINDOW, seed=3, epoch=0)
        assert list(s) == order.tolist()
    with pytest.raises(ValueError, match="chunk_size must be"):
        sampler(ds, chunk_size=0)


def test_without_an_index_or_with_a_wrong_one_the_chunk_is_64() -> None:
    class Plain:
        def __len__(self) -> int:
            return 500

    assert sampler(Plain()).chunk_size == DEFAULT_CHUNK_SIZE
    assert resolve_chunk_size(Plain(), None, None) == DEFAULT_CHUNK_SIZE
    wrong = SizedRecords(np.full(500, 10))
    wrong.index = Index(np.full(499, 10, dtype=np.uint32))  # not one entry per sample
    assert sampler(wrong).chunk_size == DEFAULT_CHUNK_SIZE
    assert sampler(SizedRecords(np.zeros(500))).chunk_size == DEFAULT_CHUNK_SIZE
    assert sampler(SizedRecords(np.zeros(0))).chunk_size == DEFAULT_CHUNK_SIZE


def test_subsets_count_only_their_own_bytes() -> None:
    sizes = np.where(np.arange(4_000) % 2 == 0, 1_000, 20_000)  # even ids small, odd large
    ds = SizedRecords(sizes)
    everything = sampler(ds).chunk_size
    assert everything == CHUNK_BYTES * 4_000 // int(sizes.sum()) == 99
    even = np.arange(0, 4_000, 2)
    assert sampler(ds, indices=even).chunk_size == CHUNK_BYTES // 1_000
    assert sampler(ds, indices=np.arange(1, 4_000, 2)).chunk_size == DEFAULT_CHUNK_SIZE
    by_label = ds.labels == 0
    assert sampler(ds, labels=[0]).chunk_size == resolve_chunk_size(
        ds, None, np.flatnonzero(by_label)
    )
    s = sampler(ds, indices=even, seed=2)
    s.set_epoch(4)
    cs = CHUNK_BYTES // 1_000
    order = chunk_order(ds.shard_bounds, chunk_size=cs, window=8, seed=2, epoch=4, ids=even)
    assert list(s) == order.tolist()


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_take_disjoint_shares_of_one_permutation(drop_last: bool) -> None:
    rng = np.random.default_rng(0)
    ds = SizedRecords(rng.integers(1_000, 9_000, 7_001), bounds=[0, 2_500, 2_500, 6_000, 7_001])
    world = 3
    for epoch in (0, 5):
        shares = []
        for rank in range(world):
            s = sampler(ds, seed=9, rank=rank, world_size=world, drop_last=drop_last)
            s.set_epoch(epoch)
            again = sampler(ds, seed=9, rank=rank, world_size=world, drop_last=drop_last)
            again.set_epoch(epoch)
            assert 100 < s.chunk_size == again.chunk_size < 400
            shares.append(list(s))
            assert shares[-1] == list(again), "the same (seed, epoch, rank): the same order"
        order = chunk_order(ds.shard_bounds, chunk_size=s.chunk_size, window=8, seed=9, epoch=epoch)
        for rank, share in enumerate(shares):
            want = split_for_rank(order, rank=rank, world_size=world, drop_last=drop_last)
            assert share == want.tolist()
        flat = [i for share in shares for i in share]
        if drop_last:
            assert len(set(flat)) == len(flat) == 7_001 - 7_001 % world
        else:
            assert set(flat) == set(range(7_001))
            assert len(flat) == -(-7_001 // world) * world
        assert sorted(order.tolist()) == list(range(7_001))


def test_resume_refuses_another_chunk_size() -> None:
    ds = SizedRecords(np.full(3_000, 5_000))
    auto = sampler(ds, seed=1, world_size=2)
    cs = auto.chunk_size
    assert cs == CHUNK_BYTES // 5_000
    state = auto.state_dict(consumed_samples=100)
    resumed = sampler(ds, seed=1, world_size=2)  # the same default resolves the same way
    resumed.load_state_dict(state)
    assert list(resumed) == list(auto)[100:]
    explicit = sampler(ds, seed=1, world_size=2, chunk_size=cs)  # the same value, given
    explicit.load_state_dict(state)
    other = sampler(ds, seed=1, world_size=2, chunk_size=DEFAULT_CHUNK_SIZE)
    with pytest.raises(ValueError, match=f"chunk_size: saved {cs}, now {DEFAULT_CHUNK_SIZE}"):
        other.load_state_dict(state)
    bigger = SizedRecords(np.full(3_000, 2_500))  # same count, other bytes: another default
    with pytest.raises(ValueError, match=f"chunk_size: saved {cs}, now {CHUNK_BYTES // 2_500}"):
        sampler(bigger, seed=1, world_size=2).load_state_dict(state)
    # a state saved with today's 64 is refused by the new default instead of reordering
    old = sampler(ds, seed=1, world_size=2, chunk_size=DEFAULT_CHUNK_SIZE).state_dict()
    with pytest.raises(ValueError, match=f"chunk_size: saved 64, now {cs}"):
        sampler(ds, seed=1, world_size=2).load_state_dict(old)


def test_stream_takes_the_samplers_default_chunk_and_records_it() -> None:
    ds = SizedRecords(np.full(3_000, 5_000))
    stream = ShardStream(ds, seed=1, rank=0, world_size=1)
    cs = stream.chunk_size
    assert cs == sampler(ds).chunk_size == CHUNK_BYTES // 5_000
    assert stream.shuffle_buffer == DEFAULT_WINDOW * cs  # 8 chunks, about 8 MiB
    state = stream.state_dict(consumed_samples=10)
    assert state["chunk_size"] == cs
    ShardStream(ds, seed=1, rank=0, world_size=1).load_state_dict(state)  # resolves the same
    other = ShardStream(ds, seed=1, rank=0, world_size=1, chunk_size=64, shuffle_buffer=8 * cs)
    with pytest.raises(ValueError, match=f"chunk_size: saved {cs}, now 64"):
        other.load_state_dict(state)
    large = ShardStream(SizedRecords(np.full(100, 1 << 20)), rank=0, world_size=1)
    assert (large.chunk_size, large.shuffle_buffer) == (DEFAULT_CHUNK_SIZE, 512)
    assert ShardStream(ds, rank=0, world_size=1, shuffle=False).shuffle_buffer == 1


@pytest.mark.parametrize("record", [10, 3_000, 5_000, 100_000, 1 << 20, 8 << 20])
def test_hints_stay_under_the_prefetch_cap(record: int) -> None:
    ds = SizedRecords(np.full(50_000, record))
    s = sampler(ds)
    # one block ahead (window chunks), never more than PREFETCH_BYTES, at least one chunk
    assert s._lookahead == max(s.chunk_size, min(8 * s.chunk_size, PREFETCH_BYTES // record))
    if s.chunk_size * record <= PREFETCH_BYTES:
        assert s._lookahead * record <= PREFETCH_BYTES


# ------------------------------------------------------------------ real packed datasets


def test_packed_small_records_get_large_chunks(packed: Packed) -> None:
    ds = open_dataset(packed.path)
    nbytes = np.asarray(ds.index.nbytes, dtype=np.int64)
    want = min(MAX_CHUNK_SIZE, max(DEFAULT_CHUNK_SIZE, CHUNK_BYTES * len(ds) // int(nbytes.sum())))
    assert want > 1_000  # the fixture's images are a few hundred bytes
    bs = ChunkShuffleBatchSampler(ds, batch_size=4, rank=0, world_size=1)
    assert bs.sampler.chunk_size == want
    assert sorted(i for b in bs for i in b) == list(range(len(ds)))


def test_packed_large_records_keep_64(fmt: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"small": 70})
    rng = np.random.default_rng(1)
    (src / "big").mkdir()
    for i in range(2):  # noise does not compress: ~600 KB each, most of the stored bytes
        image = rng.integers(0, 256, (350, 580, 3), dtype=np.uint8)
        (src / "big" / f"{i}.png").write_bytes(encode(image, ".png"))
    ds = open_dataset(build_packed(src, tmp_path / f"out.{fmt}", fmt))
    mean = float(np.mean(ds.index.nbytes))
    assert mean > CHUNK_BYTES / DEFAULT_CHUNK_SIZE  # a 64-sample chunk already holds > 1 MiB
    s = sampler(ds)
    assert s.chunk_size == DEFAULT_CHUNK_SIZE
    label = ds.labels[int(np.argmin(ds.index.nbytes))]
    small = sampler(ds, labels=[label])  # the small class alone: larger chunks
    assert small.chunk_size > DEFAULT_CHUNK_SIZE


def test_dataloader_with_workers_reads_every_sample_once(packed: Packed) -> None:
    paddle = pytest.importorskip("paddle")
    ds = open_dataset(packed.path, decode="bytes")
    bs = ChunkShuffleBatchSampler(ds, batch_size=3, seed=5, rank=0, world_size=1)
    bs.set_epoch(2)
    want = [ds.read_bytes(i) for b in bs for i in b]

    def as_arrays(batch: list[tuple[bytes, Any]]) -> list[np.ndarray]:
        return [np.frombuffer(data, dtype=np.uint8) for data, _ in batch]

    loader = paddle.io.DataLoader(ds, batch_sampler=bs, num_workers=2, collate_fn=as_arrays)
    got = [array.numpy().tobytes() for batch in loader for array in batch]
    assert got == want
    assert sorted(want) == sorted(packed.files.values())
