"""Chunked samplers: rank shares, resume, subsets, prefetch hints (orders: test_order.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

from readers.order import chunk_order, split_for_rank
from readers.samplers import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    ChunkShuffleBatchSampler,
    ChunkShuffleSampler,
)
from tests.readers.test_order import EPOCHS, LAYOUTS, ref_chunks


class RecordingDataset:
    """A real (tiny) dataset with the optional attributes; it logs prefetch hints."""

    def __init__(
        self, bounds: list[int], labels: np.ndarray | None = None, log: list[Any] | None = None
    ) -> None:
        self.shard_bounds = np.asarray(bounds, dtype=np.int64)
        self.labels = labels
        self.log = [] if log is None else log

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    def prefetch(self, start: int, stop: int) -> None:
        self.log.append(("prefetch", start, stop))


class PlainDataset:
    """Only `len`: no shard_bounds, labels or prefetch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


# ------------------------------------------------------------------ samplers


def make(ds: Any, **kw: Any) -> ChunkShuffleSampler:
    kw.setdefault("chunk_size", 16)
    kw.setdefault("window", 4)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return ChunkShuffleSampler(ds, **kw)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 3])
def test_sampler_yields_its_rank_share(world: int, drop_last: bool) -> None:
    bounds = LAYOUTS["uneven-shards"]
    ds = RecordingDataset(bounds, log=[])
    for epoch in EPOCHS:
        order = chunk_order(bounds, chunk_size=16, window=4, seed=5, epoch=epoch)
        for rank in range(world):
            s = make(ds, seed=5, rank=rank, world_size=world, drop_last=drop_last)
            s.set_epoch(epoch)
            got = list(s)
            assert all(type(i) is int for i in got)
            want = split_for_rank(order, rank=rank, world_size=world, drop_last=drop_last)
            assert got == want.tolist()
            assert len(s) == len(got)
            assert list(s) == got, "iterating again repeats the epoch: __iter__ changes nothing"
            assert s.epoch == epoch


def test_sampler_defaults_and_plain_dataset() -> None:
    s = ChunkShuffleSampler(PlainDataset(300))  # rank/world from paddle.distributed: 0 / 1
    assert (s.rank, s.world_size) == (0, 1)
    order = chunk_order(300, chunk_size=DEFAULT_CHUNK_SIZE, window=DEFAULT_WINDOW, seed=0, epoch=0)
    assert list(s) == order.tolist()
    s.set_epoch(1)
    assert list(s) != order.tolist()
    assert len(ChunkShuffleSampler(PlainDataset(0), rank=0, world_size=4)) == 0
    # paddle's own BatchSampler takes it as its sampler
    paddle = pytest.importorskip("paddle")
    batches = list(paddle.io.BatchSampler(sampler=s, batch_size=7))
    assert [i for b in batches for i in b] == list(s)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 2, "world_size": 2}, "rank must be < world_size"),
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"chunk_size": 0}, "chunk_size must be"),
        ({"indices": np.ones(5, dtype=bool)}, "one entry per sample"),
        ({"indices": [1, 1, 2]}, "id 1 more than once"),
        ({"indices": [0, 1000]}, r"must lie in \[0, 1000\)"),
        ({"labels": [1]}, "has no labels"),
    ],
)
def test_sampler_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(RecordingDataset(LAYOUTS["uneven-shards"]), **kwargs)


def test_shard_bounds_must_match_len() -> None:
    class Bad(PlainDataset):
        shard_bounds = np.array([0, 5, 9])

    with pytest.raises(ValueError, match="ends at 9 but len"):
        make(Bad(10))


# ------------------------------------------------------------------ resume


@pytest.mark.parametrize("world", [1, 3])
def test_resume_from_random_cut_points(world: int) -> None:
    ds = RecordingDataset(LAYOUTS["uneven-shards"])
    rng = np.random.default_rng(0)
    for rank, epoch in itertools.product(range(world), (0, 4)):
        ref = make(ds, seed=9, rank=rank, world_size=world)
        ref.set_epoch(epoch)
        full = list(ref)
        for k in [0, len(full), *rng.integers(0, len(full), size=5).tolist()]:
            state = json.loads(json.dumps(ref.state_dict(consumed_samples=k)))  # plain JSON
            assert (state["epoch"], state["position"]) == (epoch, k)
            fresh = make(ds, seed=9, rank=rank, world_size=world)
            fresh.load_state_dict(state)
            fresh.set_epoch(epoch)  # the usual loop calls this again: it keeps the position
            assert list(fresh) == full[k:]
            assert list(fresh) == full, "the resume offset is used once"


def test_resume_from_tracked_count_and_state_on_another_rank() -> None:
    ds = RecordingDataset(LAYOUTS["uneven-shards"])
    s0 = make(ds, seed=2, rank=0, world_size=2)
    s0.set_epoch(3)
    it = iter(s0)
    head = list(itertools.islice(it, 123))
    state = s0.state_dict()
    assert state["position"] == 123
    # the state saved on rank 0 resumes rank 1 at the same position of its own share
    s1 = make(ds, seed=2, rank=1, world_size=2)
    s1.load_state_dict(state)
    ref1 = make(ds, seed=2, rank=1, world_size=2)
    ref1.set_epoch(3)
    assert list(s1) == list(ref1)[123:]
    # resuming twice: a resumed pass counts from the epoch start
    s0b = make(ds, seed=2, rank=0, world_size=2)
    s0b.load_state_dict(state)
    it = iter(s0b)
    more = list(itertools.islice(it, 10))
    assert s0b.state_dict()["position"] == 133
    assert head + more + list(it) == s0.rank_order().tolist()


def test_end_of_epoch_state_and_next_epoch() -> None:
    ds = RecordingDataset(LAYOUTS["one-shard"])
    s = make(ds, seed=1)
    s.set_epoch(2)
    full = list(s)
    state = s.state_dict()
    assert state["position"] == len(full) == len(s)
    fresh = make(ds, seed=1)
    fresh.load_state_dict(state)
    assert fresh.epoch == 2
    assert list(fresh) == []
    fresh.set_epoch(3)
    nxt = make(ds, seed=1)
    nxt.set_epoch(3)
    assert list(fresh) == list(nxt)


def test_set_epoch_to_a_new_epoch_drops_the_resume_offset() -> None:
    ds = RecordingDataset(LAYOUTS["one-shard"])
    s = make(ds)
    state = s.state_dict(consumed_samples=100)
    s2 = make(ds)
    s2.load_state_dict(state)
    s2.set_epoch(1)
    assert len(list(s2)) == 1000


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_resume(drop_last: bool) -> None:
    ds = RecordingDataset(LAYOUTS["uneven-shards"])
    kw: dict[str, Any] = {"batch_size": 32, "drop_last": drop_last, "seed": 4, "chunk_size": 16}
    ref = ChunkShuffleBatchSampler(ds, rank=1, world_size=3, **kw)
    ref.set_epoch(5)
    batches = list(ref)
    assert len(batches) == len(ref)
    flat = [i for b in batches for i in b]
    assert flat == ref.sampler.rank_order().tolist()[: len(flat)]
    if drop_last:
        assert all(len(b) == 32 for b in batches)
    else:
        assert flat == ref.sampler.rank_order().tolist()
    rng = np.random.default_rng(1)
    for b in [0, len(batches), *rng.integers(0, len(batches), size=4).tolist()]:
        fresh = ChunkShuffleBatchSampler(ds, rank=1, world_size=3, **kw)
        fresh.load_state_dict(ref.state_dict(consumed_batches=b))
        assert list(fresh) == batches[b:]
    # tracked: the count of yielded samples
    tracked = ChunkShuffleBatchSampler(ds, rank=1, world_size=3, **kw)
    tracked.set_epoch(5)
    head = list(itertools.islice(iter(tracked), 3))
    state = tracked.state_dict()
    assert state["position"] == 96 == tracked.state_dict(consumed_samples=96)["position"]
    fresh = ChunkShuffleBatchSampler(ds, rank=1, world_size=3, **kw)
    fresh.load_state_dict(state)
    assert head + list(fresh) == batches


def test_batch_and_sample_positions_are_interchangeable() -> None:
    ds = RecordingDataset(LAYOUTS["one-shard"])
    bs = ChunkShuffleBatchSampler(ds, batch_size=10, seed=3, rank=0, world_size=1)
    s = make(ds, seed=3, chunk_size=DEFAULT_CHUNK_SIZE, window=DEFAULT_WINDOW)
    s.load_state_dict(bs.state_dict(consumed_batches=7))
    assert list(s) == [i for b in list(bs)[7:] for i in b]
    with pytest.raises(ValueError, match="not both"):
        bs.state_dict(1, consumed_samples=10)
    with pytest.raises(ValueError, match="exceeds the 100 batches"):
        bs.state_dict(consumed_batches=101)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"chunk_size": 32}, "chunk_size: saved 16, now 32"),
        ({"window": 2}, "window: saved 4, now 2"),
        ({"seed": 8}, "seed: saved 7, now 8"),
        ({"shuffle": False}, "shuffle: saved True, now False"),
        # another world size is an elastic resume now: tests/readers/test_elastic_resume.py
        ({"drop_last": True}, "drop_last: saved False, now True"),
        ({"indices": np.arange(500)}, "num_selected: saved 1000, now 500"),
        ({"indices": np.arange(1, 1000)[::-1]}, "selection_crc32"),
    ],
)
def test_load_state_with_other_parameters_raises(change: dict[str, Any], match: str) -> None:
    ds = RecordingDataset(LAYOUTS["uneven-shards"])
    base: dict[str, Any] = {"seed": 7, "rank": 0, "world_size": 2}
    state = make(ds, **base).state_dict(consumed_samples=10)
    other = make(ds, **(base | change))
    with pytest.raises(ValueError, match=match) as info:
        other.load_state_dict(state)
    assert "repeat or skip samples" in str(info.value)


def test_selection_fingerprint_catches_same_size_selection() -> None:
    ds = RecordingDataset(LAYOUTS["one-shard"])
    state = make(ds, indices=np.arange(0, 500)).state_dict()
    with pytest.raises(ValueError, match="selection_crc32"):
        make(ds, indices=np.arange(500, 1000)).load_state_dict(state)
    # the same selection given as a mask is the same sampler
    make(ds, indices=np.arange(1000) < 500).load_state_dict(state)


def test_load_state_rejects_incomplete_or_out_of_range_states() -> None:
    ds = RecordingDataset(LAYOUTS["one-shard"])
    s = make(ds)
    state = s.state_dict()
    with pytest.raises(ValueError, match=r"missing \['seed'\]"):
        s.load_state_dict({k: v for k, v in state.items() if k != "seed"})
    with pytest.raises(ValueError, match="position 1001 exceeds"):
        s.load_state_dict(state | {"position": 1001})
    with pytest.raises(ValueError, match="version 99"):
        s.load_state_dict(state | {"version": 99})
    with pytest.raises(ValueError, match="consumed_samples=1001 exceeds"):
        s.state_dict(consumed_samples=1001)


# ------------------------------------------------------------------ subsets


@pytest.mark.parametrize("world", [1, 3])
def test_subsets_by_mask_ids_and_labels(world: int) -> None:
    bounds = LAYOUTS["uneven-shards"]
    labels = np.arange(1000) % 5
    ds = RecordingDataset(bounds, labels=labels)
    rng = np.random.default_rng(7)
    mask = rng.random(1000) < 0.3
    ids = rng.choice(1000, size=250, replace=False)  # unsorted ids are fine
    cases: list[tuple[dict[str, Any], set[int]]] = [
        ({"indices": mask}, set(np.flatnonzero(mask).tolist())),
        ({"indices": ids}, set(ids.tolist())),
        ({"indices": ids.tolist()}, set(ids.tolist())),
        ({"labels": [1, 3]}, {i for i in range(1000) if i % 5 in (1, 3)}),
        ({"labels": {2}, "indices": mask}, set(np.flatnonzero(mask & (labels == 2)).tolist())),
        ({"indices": []}, set()),
    ]
    for kw, want in cases:
        seen: list[int] = []
        for rank in range(world):
            s = make(ds, rank=rank, world_size=world, drop_last=True, **kw)
            assert s.num_selected == len(want)
            seen += list(s)
        assert len(seen) == len(set(seen)) == len(want) // world * world
        assert set(seen) <= want
        padded = [i for r in range(world) for i in make(ds, rank=r, world_size=world, **kw)]
        assert set(padded) == want


# ------------------------------------------------------------------ prefetch hints


@pytest.mark.parametrize("use_ids", [False, True])
def test_prefetch_is_called_once_per_chunk_before_its_first_sample(use_ids: bool) -> None:
    bounds = LAYOUTS["uneven-shards"]
    log: list[Any] = []
    ds = RecordingDataset(bounds, log=log)
    ids = np.flatnonzero(np.random.default_rng(2).random(1000) < 0.6) if use_ids else None
    chunks = ref_chunks(bounds, 16, None if ids is None else ids.tolist())
    chunk_of = {i: (c[0], c[-1] + 1) for c in chunks for i in c}
    s = make(ds, seed=3, indices=ids)
    for i in s:
        log.append(("yield", i))
    hinted = [(a, b) for kind, a, b in (e for e in log if e[0] == "prefetch")]
    assert sorted(hinted) == sorted(chunk_of[c[0]] for c in chunks), "once per chunk"
    done: set[tuple[int, int]] = set()
    for entry in log:
        if entry[0] == "prefetch":
            done.add((entry[1], entry[2]))
        else:
            assert chunk_of[entry[1]] in done, f"id {entry[1]} yielded before its chunk's hint"
    # the hint comes just before the chunk's first sample, not all at the start
    first_yield = next(k for k, e in enumerate(log) if e[0] == "yield")
    assert first_yield < len(chunks)


def test_prefetch_for_batches_and_ranks() -> None:
    bounds = LAYOUTS["uneven-shards"]
    chunk_of = {i: (c[0], c[-1] + 1) for c in ref_chunks(bounds, 16) for i in c}
    for rank in range(2):
        log: list[Any] = []
        ds = RecordingDataset(bounds, log=log)
        bs = ChunkShuffleBatchSampler(ds, batch_size=20, rank=rank, world_size=2, chunk_size=16)
        done: set[tuple[int, int]] = set()
        mine: set[tuple[int, int]] = set()
        for batch in bs:
            done |= {(a, b) for _, a, b in log}
            log.clear()
            for i in batch:
                assert chunk_of[i] in done
                mine.add(chunk_of[i])
        assert done == mine, "hints only for chunks this rank reads"


# ------------------------------------------------------------------ paddle DataLoader


def test_paddle_dataloader_with_the_batch_sampler() -> None:
    paddle = pytest.importorskip("paddle")

    class IdDataset(paddle.io.Dataset):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.shard_bounds = np.array([0, 40, 41, 103], dtype=np.int64)

        def __len__(self) -> int:
            return 103

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return np.array([i], dtype=np.int64), np.full((3,), i * 0.5, dtype=np.float32)

    ds = IdDataset()
    for workers in (0, 2):
        bs = ChunkShuffleBatchSampler(ds, batch_size=8, chunk_size=8, window=2, seed=11)
        bs.set_epoch(2)
        expected = list(bs)
        loader = paddle.io.DataLoader(ds, batch_sampler=bs, num_workers=workers)
        assert len(loader) == len(expected) == 13
        got = []
        for ids, halves in loader:
            np.testing.assert_allclose(halves.numpy()[:, 0], ids.numpy()[:, 0] * 0.5)
            got.append(ids.numpy()[:, 0].tolist())
        assert got == expected
        assert sorted(i for b in got for i in b) == list(range(103))
