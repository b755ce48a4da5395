"""Elastic resume: a state saved with N ranks loads with M; the rest is exactly what no rank
consumed, split over M ranks, for every sampler built on a global order (readers.resume).

Each sampler kind is one `Kind` entry in `KINDS`; the invariant tests run over all of them, so
adding a sampler (h7's mixed sampler, ``ChunkShuffleBatchSampler(weights=...)``) is one line.
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import readers.stream as stream_mod
from readers.buckets import BucketBatchSampler
from readers.concat import ConcatDataset
from readers.mixing import mix_counts
from readers.resume import rest_positions, unconsumed_positions
from readers.samplers import ChunkShuffleBatchSampler, ChunkShuffleSampler
from readers.stream import ShardStream
from tests.readers.test_order import round_robin
from tests.readers.test_stream import packed, truth  # noqa: F401 - fixtures: a real LMDB

SIZES = (1, 2, 3, 8)
EPOCH = 2
N_SAMPLES = 203
BOUNDS = [0, 40, 41, 120, 203]


class IdDataset:
    """A map-style dataset whose items name their id, with an index of record CRCs and widths
    (what a packed dataset exposes to samplers); `salt` changes the records' CRCs."""

    def __init__(
        self, n: int = N_SAMPLES, bounds: list[int] | None = None, salt: int = 0, base: int = 0
    ) -> None:
        rng = np.random.default_rng(salt)
        self.base = base  # items name base + id: the global id when this is a source of a concat
        self.shard_bounds = np.asarray(bounds or BOUNDS, dtype=np.int64)
        self.n = n
        widths = (16 + (np.arange(n) * 37) % 300).astype(np.int64)
        self.index = SimpleNamespace(
            crc32=rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
            nbytes=np.full(n, 1000, dtype=np.uint32),
            extra={"width": widths, "height": np.full(n, 32, dtype=np.int64)},
            root=None,
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return self.base + int(i), 0


# ------------------------------------------------------------------ one entry per sampler kind


@dataclass(frozen=True)
class Kind:
    """How the generic tests build, run and save one kind of sampler.

    ``run`` yields one rank's units of a pass, each a list of ids (a sample, a batch); ``save``
    is the state after ``k`` units; ``planned`` is this rank's share of the epoch as ids and
    ``total`` the samples of the epoch's global order (so the ranks' shares joined and cut to
    ``total`` are the global order); ``slack(M)`` bounds the ids ``drop_last`` may leave out of
    the rest (the split's remainder and the short batches) and ``pad(M)`` the ids padding may
    repeat; ``batches``: ``len()`` counts units, else samples; ``check_unit`` checks each unit
    after a resume (the per-source counts of a mix="batch" batch).
    """

    make: Callable[..., Any]
    run: Callable[[Any, pytest.MonkeyPatch], list[list[int]]]
    save: Callable[[Any, int], dict[str, Any]]
    planned: Callable[[Any], list[int]]
    total: Callable[[Any], int]
    slack: Callable[[int], int]
    pad: Callable[[int], int]
    batches: bool = False
    check_unit: Callable[[list[int]], None] | None = None


def _stream_units(stream: ShardStream, mp: pytest.MonkeyPatch, workers: int = 2) -> list[Any]:
    """The loader batches of one rank, emulating `workers` forked DataLoader workers."""
    per_worker = []
    for w in range(workers):
        info = SimpleNamespace(id=w, num_workers=workers)
        mp.setattr(stream_mod, "_worker_info", lambda info=info: info)
        per_worker.append([i for i, _ in pickle.loads(pickle.dumps(stream))])
    mp.setattr(stream_mod, "_worker_info", lambda: None)
    return round_robin(per_worker, 5, False)


STREAM_LOADER = SimpleNamespace(batch_size=5, num_workers=2, drop_last=False)


def len_of_stream(s: ShardStream) -> int:
    """Samples of the stream's global order (an epoch, for all ranks)."""
    return len(s.dataset) if s.mixture is None else s.mixture.num_ordered


KW: dict[str, Any] = {"seed": 3, "chunk_size": 8}

KINDS: dict[str, Kind] = {
    "chunk-sampler": Kind(
        make=lambda rank, world, drop: ChunkShuffleSampler(
            IdDataset(), window=2, rank=rank, world_size=world, drop_last=drop, **KW
        ),
        run=lambda s, mp: [[i] for i in s],
        save=lambda s, k: s.state_dict(consumed_samples=k),
        planned=lambda s: s.rank_order().tolist(),
        total=lambda s: s.num_selected,
        slack=lambda m: m - 1,
        pad=lambda m: m - 1,
    ),
    "chunk-batches": Kind(
        make=lambda rank, world, drop: ChunkShuffleBatchSampler(
            IdDataset(), batch_size=7, window=2, rank=rank, world_size=world, drop_last=drop, **KW
        ),
        run=lambda s, mp: list(s),
        save=lambda s, k: s.state_dict(consumed_batches=k),
        planned=lambda s: s.sampler.rank_order().tolist(),
        total=lambda s: s.sampler.num_selected,
        slack=lambda m: (m - 1) + m * 6,
        pad=lambda m: m - 1,
        batches=True,
    ),
    "bucket": Kind(
        make=lambda rank, world, drop: BucketBatchSampler(
            IdDataset(),
            6,
            buckets=4,
            scale_batch=True,
            rank=rank,
            world_size=world,
            drop_last=drop,
            **KW,
        ),
        run=lambda s, mp: list(s),
        save=lambda s, k: s.state_dict(consumed_batches=k),
        planned=lambda s: [i for b in s.rank_order().tolist() for i in _batch(s, b)],
        total=lambda s: int(s.epoch_batches()[0].size),
        slack=lambda m: (m - 1) * 60,
        pad=lambda m: (m - 1) * 60,
        batches=True,
    ),
    "stream": Kind(
        make=lambda rank, world, drop: ShardStream(
            IdDataset(), shuffle_buffer=16, rank=rank, world_size=world, drop_last=drop, **KW
        ),
        run=_stream_units,
        save=lambda s, k: s.state_dict(consumed_batches=k, loader=STREAM_LOADER),
        planned=lambda s: s.rank_order().tolist(),
        total=len_of_stream,
        slack=lambda m: m - 1,
        pad=lambda m: m - 1,
    ),
    "mixed": Kind(  # weighted mixing (mix="epoch"): 120 + 60 draws, one whole pass of each
        make=lambda rank, world, drop: ChunkShuffleSampler(
            _mixed(),
            weights=[2, 1],
            epoch_samples=180,
            window=2,
            rank=rank,
            world_size=world,
            drop_last=drop,
            **KW,
        ),
        run=lambda s, mp: [[i] for i in s],
        save=lambda s, k: s.state_dict(consumed_samples=k),
        planned=lambda s: s.rank_order().tolist(),
        total=lambda s: s.num_selected,
        slack=lambda m: m - 1,
        pad=lambda m: m - 1,
    ),
    "mixed-batch": Kind(  # mix="batch": 30 batches of 4 + 2, ranks split whole batches
        make=lambda rank, world, drop: ChunkShuffleBatchSampler(
            _mixed(),
            batch_size=6,
            weights=[2, 1],
            mix="batch",
            epoch_samples=180,
            window=2,
            rank=rank,
            world_size=world,
            drop_last=drop,
            **KW,
        ),
        run=lambda s, mp: list(s),
        save=lambda s, k: s.state_dict(consumed_batches=k),
        planned=lambda s: s.sampler.rank_order().tolist(),
        total=lambda s: s.sampler.num_selected,
        slack=lambda m: (m - 1) * 6,
        pad=lambda m: (m - 1) * 6,
        batches=True,
        check_unit=lambda batch: _check_composition(batch, [4, 2]),
    ),
    "mixed-stream": Kind(  # ShardStream over two datasets, weights 2:1 (mix="epoch")
        make=lambda rank, world, drop: _mixed_stream(rank, world, drop),
        run=_stream_units,
        save=lambda s, k: s.state_dict(consumed_batches=k, loader=STREAM_LOADER),
        planned=lambda s: s.rank_order().tolist(),
        total=len_of_stream,
        slack=lambda m: m - 1,
        pad=lambda m: m - 1,
    ),
    "mixed-bucket": Kind(  # width buckets over weighted draws: 50 of 120, 100 of 60 (repeats)
        make=lambda rank, world, drop: _mixed_bucket(rank, world, drop),
        run=lambda s, mp: list(s),
        save=lambda s, k: s.state_dict(consumed_batches=k),
        planned=lambda s: [i for b in s.rank_order().tolist() for i in _batch(s, b)],
        total=lambda s: int(s.epoch_batches()[0].size),
        slack=lambda m: (m - 1) * 120,
        pad=lambda m: (m - 1) * 120,
        batches=True,
        check_unit=lambda batch: _check_one_bucket(batch),
    ),
}


def _mixed(salt: int = 0) -> ConcatDataset:
    """Two sources of 120 and 60 samples, items naming their global id; weights 2:1 and 180
    draws per epoch make an epoch one whole pass of each, so no id repeats inside it."""
    return ConcatDataset(
        [IdDataset(120, [0, 40, 120], salt=salt), IdDataset(60, [0, 60], salt=salt + 1, base=120)]
    )


def _mixed_stream(
    rank: int,
    world: int,
    drop: bool,
    *,
    weights: tuple[float, ...] = (2, 1),
    epoch_samples: int = 180,
    seed: int = 3,
) -> ShardStream:
    return ShardStream(
        _mixed().datasets,
        weights=list(weights),
        epoch_samples=epoch_samples,
        shuffle_buffer=16,
        chunk_size=8,
        seed=seed,
        rank=rank,
        world_size=world,
        drop_last=drop,
    )


def _mixed_bucket(rank: int, world: int, drop: bool) -> BucketBatchSampler:
    return BucketBatchSampler(
        _mixed(),
        6,
        buckets=3,
        scale_batch=True,
        weights=[1, 2],
        epoch_samples=150,
        rank=rank,
        world_size=world,
        drop_last=drop,
        **KW,
    )


def _check_one_bucket(batch: list[int]) -> None:
    """A batch of `_mixed_bucket` holds one bucket of the index's widths."""
    probe = _mixed_bucket(0, 1, False)
    widths = np.concatenate([d.index.extra["width"] for d in _mixed().datasets])
    buckets = np.searchsorted(probe.boundaries, widths[batch], side="right")
    assert len(set(buckets.tolist())) == 1, batch


def _check_composition(batch: list[int], counts: list[int]) -> None:
    """A mix="batch" batch of `_mixed()` holds the per-source counts (ids < 120: source 0)."""
    assert np.bincount(np.asarray(batch) >= 120, minlength=2).tolist() == counts, batch


def _batch(s: BucketBatchSampler, b: int) -> list[int]:
    flat, bounds, _ = s.epoch_batches()
    return flat[bounds[b] : bounds[b + 1]].tolist()


def _ranks(
    kind: Kind,
    world: int,
    drop: bool,
    state: dict[str, Any] | None = None,
    *,
    epoch: int = EPOCH,
) -> list[Any]:
    out = []
    for rank in range(world):
        s = kind.make(rank, world, drop)
        s.set_epoch(epoch)
        if state is not None:
            s.load_state_dict(json.loads(json.dumps(state)))  # states are plain JSON
        out.append(s)
    return out


def planned_order(kind: Kind, ranks: list[Any]) -> Counter[int]:
    """The ids of the epoch's global order the saved run planned (a multiset: a source drawn
    across two passes in one epoch may give an id twice): the ranks' shares joined, cut to
    the order's length (padding repeats its start; drop_last plans a prefix)."""
    joined = [i for s in ranks for i in kind.planned(s)]
    return Counter(joined[: kind.total(ranks[0])])


def consumed_ids(full: list[list[list[int]]], k: int) -> Counter[int]:
    """The ids the first `k` units of every rank held (a padding copy counts as its id)."""
    return Counter(i for units in full for unit in units[:k] for i in unit)


def check_rest(
    kind: Kind,
    expected: Counter[int],
    rests: list[list[list[int]]],
    resumed: list[Any],
    *,
    drop: bool,
    world: int,
    pad: int,
) -> None:
    """The resumed ranks yield equal counts of units, and their `len`; exactly the `expected`
    ids, as a multiset (drop_last: a part of it, none beyond, within the kind's slack);
    at most `pad` ids more, as padding; every unit still whole (`check_unit`)."""
    assert len({len(r) for r in rests}) == 1, "every rank yields the same number of units"
    for s, units in zip(resumed, rests, strict=True):
        assert len(s) == (len(units) if kind.batches else sum(len(u) for u in units))
    got = Counter(i for units in rests for unit in units for i in unit)
    missing, extra = expected - got, got - expected
    if drop:
        assert not extra, "nothing consumed before, nothing twice, nothing outside the epoch"
        assert missing.total() <= kind.slack(world)
    else:
        assert not missing, "every unconsumed sample"
        assert extra.total() <= pad, "repeats only as padding"
    if kind.check_unit is not None:
        for units in rests:
            for unit in units:
                kind.check_unit(unit)


# ------------------------------------------------------------------ invariants, every kind


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize(("saved", "loaded"), list(itertools.product(SIZES, SIZES)))
@pytest.mark.parametrize("name", list(KINDS))
def test_elastic_rest_is_exactly_the_unconsumed_samples(
    name: str, saved: int, loaded: int, drop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = KINDS[name]
    run_elastic(kind, saved, loaded, drop, monkeypatch)


def run_elastic(
    kind: Kind,
    saved: int,
    loaded: int,
    drop: bool,
    mp: pytest.MonkeyPatch,
    *,
    epoch: int = EPOCH,
) -> None:
    """Save after 0, a third and all of every rank's units at `saved` ranks; load at
    `loaded`: the same size continues exactly, another yields exactly the rest."""
    ranks = _ranks(kind, saved, drop, epoch=epoch)
    full = [kind.run(s, mp) for s in ranks]
    planned = planned_order(kind, ranks)
    if kind.check_unit is not None:
        for unit in (u for units in full for u in units):
            kind.check_unit(unit)
    for k in sorted({0, len(full[0]) // 3, len(full[0])}):
        resumed = _ranks(kind, loaded, drop, kind.save(ranks[0], k), epoch=epoch)
        rests = [kind.run(s, mp) for s in resumed]
        if saved == loaded:  # the same world size continues every rank exactly
            assert rests == [units[k:] for units in full]
            continue
        if k == 0:  # nothing consumed: a fresh epoch at the new size (its own plan)
            assert rests == [kind.run(s, mp) for s in _ranks(kind, loaded, drop, epoch=epoch)]
        else:
            expected = planned - consumed_ids(full, k)
            # padding of the new split; and an id consumed on the saved run both as itself
            # and as its padding copy is counted twice there, though the epoch may hold it
            # twice (a source drawn across two passes) with one copy left
            pad = kind.pad(loaded) + kind.pad(saved)
            check_rest(kind, expected, rests, resumed, drop=drop, world=loaded, pad=pad)
        assert all(s.epoch == epoch for s in resumed)


# (weights, epoch_samples, seed, epoch, whether an id comes twice in the epoch) of a mixed
# ShardStream over sources of 120 and 60: whole passes; partial passes that cross a pass
# boundary inside the epoch; a source drawn six times over; uneven weights, few samples.
MIXED_STREAMS = [
    ((2, 1), 180, 3, 2, False),
    ((1, 1), 101, 0, 3, True),
    ((1, 3), 500, 7, 1, True),
    ((5, 0.5), 77, 12345, 5, True),
]


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize(("saved", "loaded"), list(itertools.product(SIZES, SIZES)))
@pytest.mark.parametrize(("weights", "epoch_samples", "seed", "epoch", "twice"), MIXED_STREAMS)
def test_mixed_stream_elastic_over_seeds_epochs_and_weights(
    weights: tuple[float, ...],
    epoch_samples: int,
    seed: int,
    epoch: int,
    twice: bool,
    saved: int,
    loaded: int,
    drop: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ShardStream(several datasets, weights=...) N -> M: the rest is exactly the samples no
    rank's loader had yielded (a multiset), split evenly, as the stream's own plan says."""
    kind = replace(
        KINDS["mixed-stream"],
        make=lambda rank, world, drop: _mixed_stream(
            rank, world, drop, weights=weights, epoch_samples=epoch_samples, seed=seed
        ),
    )
    probe = kind.make(0, 1, drop)
    probe.set_epoch(epoch)
    assert probe.mixture is not None
    assert probe.mixture.counts.tolist() == mix_counts(epoch_samples, weights).tolist()
    assert (max(Counter(probe.rank_order().tolist()).values()) > 1) == twice
    run_elastic(kind, saved, loaded, drop, monkeypatch, epoch=epoch)


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("sizes", [(8, 3, 2), (2, 3, 1), (3, 8, 3), (1, 2, 2)])
def test_resume_twice_at_other_sizes(
    name: str, sizes: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = KINDS[name]
    first, second, third = sizes
    ranks = _ranks(kind, first, False)
    full = [kind.run(s, monkeypatch) for s in ranks]
    planned = planned_order(kind, ranks)
    k1 = max(1, len(full[0]) // 4)
    consumed = consumed_ids(full, k1)
    middle = _ranks(kind, second, False, kind.save(ranks[0], k1))
    assert all(
        s.start_batch == (k1 if first == second else 0)
        for s in middle
        if name not in ("chunk-sampler", "mixed")
    )
    mid_units = [kind.run(s, monkeypatch) for s in middle]
    k2 = len(mid_units[0]) // 2
    consumed += consumed_ids(mid_units, k2)
    state = kind.save(middle[0], k2)
    assert len(state["history"]) == (first != second)
    last = _ranks(kind, third, False, state)
    rests = [kind.run(s, monkeypatch) for s in last]
    if second == third:  # the same size continues exactly, padding included
        assert rests == [units[k2:] for units in mid_units]
    else:
        assert len(last[0].history) == 1 + (first != second)
        pad = kind.pad(first) + kind.pad(second) + kind.pad(third)
        check_rest(kind, planned - consumed, rests, last, drop=False, world=third, pad=pad)


@pytest.mark.parametrize("name", list(KINDS))
def test_state_of_another_dataset_is_refused(name: str) -> None:
    kind = KINDS[name]
    state = kind.save(kind.make(0, 2, False), 1)
    assert isinstance(state["records_crc32"], int)
    other = kind.make(0, 3, False)
    other_ds = IdDataset(salt=1)  # same size and layout, other records
    if isinstance(other, ChunkShuffleBatchSampler):
        other.sampler._dataset = other_ds
    elif isinstance(other, ShardStream):
        other.dataset = other_ds
    else:
        other._dataset = other_ds
    with pytest.raises(ValueError, match=r"is of another dataset \(records_crc32: saved \d+, now"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="the stored records differ"):
        other.load_state_dict(state)


def test_refusal_names_the_count_and_the_seed() -> None:
    state = KINDS["chunk-sampler"].save(KINDS["chunk-sampler"].make(0, 2, False), 5)
    small = ChunkShuffleSampler(
        IdDataset(150, [0, 150]), seed=4, chunk_size=8, rank=0, world_size=1
    )
    with pytest.raises(ValueError, match="num_selected: saved 203, now 150") as info:
        small.load_state_dict(state)
    assert "seed: saved 3, now 4" in str(info.value)
    assert "another number of selected samples" in str(info.value)
    bucket_state = KINDS["bucket"].save(KINDS["bucket"].make(0, 2, False), 1)
    with pytest.raises(
        ValueError, match="saved by a BucketBatchSampler, not a ChunkShuffleSampler"
    ):
        KINDS["chunk-sampler"].make(0, 2, False).load_state_dict(bucket_state)


def test_version_1_state_still_loads() -> None:
    """A state as the version 1 code wrote it (no kind, history or records_crc32)."""
    ref = KINDS["chunk-sampler"].make(1, 3, False)
    ref.set_epoch(EPOCH)
    full = list(ref)
    v2 = ref.state_dict(consumed_samples=20)
    v1 = {k: v2[k] for k in v2 if k not in ("kind", "history", "records_crc32")} | {"version": 1}
    for world in (3, 2):
        fresh = KINDS["chunk-sampler"].make(1, world, False)
        fresh.load_state_dict(v1)
        if world == 3:
            assert list(fresh) == full[20:]
        else:
            assert fresh.history
            assert len(fresh) == -(-(N_SAMPLES - 3 * 20) // 2)


# ------------------------------------------------------------------ the pure functions


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("world", SIZES)
def test_unconsumed_positions_against_a_plain_reference(world: int, drop: bool) -> None:
    for n, k in [(0, 0), (1, 1), (5, 0), (7, 1), (50, 3), (50, -1)]:
        per = (n // world) if drop else -(-n // world)
        k = per if k < 0 else min(k, per)
        padded = [p % n for p in range(per * world)] if n else []
        consumed = {padded[r * per + j] for r in range(world) for j in range(k)}
        planned = sorted(set(padded))
        expected = [p for p in planned if p not in consumed]
        got = unconsumed_positions(n, world_size=world, drop_last=drop, consumed=k).tolist()
        assert got == expected
        fn = unconsumed_positions(
            n, world_size=world, drop_last=drop, consumed=lambda r, length, k=k: np.arange(k)
        )
        assert fn.tolist() == expected
    assert rest_positions(10, (), drop_last=False) is None


def test_unconsumed_positions_rejects_positions_beyond_a_share() -> None:
    with pytest.raises(ValueError, match="exceeds the 4 units"):
        unconsumed_positions(10, world_size=3, drop_last=False, consumed=5)


# ------------------------------------------------------------------ a real DataLoader


def test_elastic_resume_through_a_paddle_dataloader_with_workers() -> None:
    paddle = pytest.importorskip("paddle")

    class PaddleIds(paddle.io.Dataset):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.inner = IdDataset()
            self.shard_bounds = self.inner.shard_bounds
            self.index = self.inner.index

        def __len__(self) -> int:
            return N_SAMPLES

        def __getitem__(self, i: int) -> np.ndarray:
            return np.array([i], dtype=np.int64)

    ds = PaddleIds()

    def makers(world: int) -> list[Any]:
        return [
            [
                ChunkShuffleBatchSampler(ds, batch_size=8, seed=5, rank=r, world_size=world),
                BucketBatchSampler(ds, 8, buckets=3, seed=5, rank=r, world_size=world),
            ][which]
            for r in range(world)
            for which in (0, 1)
        ]

    def ids(sampler: Any, stop: int | None = None) -> list[list[int]]:
        loader = paddle.io.DataLoader(ds, batch_sampler=sampler, num_workers=2)
        out = []
        for j, batch in enumerate(loader):
            if stop is not None and j == stop:
                break
            out.append(batch.numpy()[:, 0].tolist())
        return out

    saved, loaded, k = 2, 3, 4
    before = makers(saved)
    for which in (0, 1):
        samplers = before[which::2]
        consumed = {i for s in samplers for b in ids(s, stop=k) for i in b}
        state = samplers[0].state_dict(consumed_batches=k)
        resumed = makers(loaded)[which::2]
        for s in resumed:
            s.load_state_dict(state)
        rests = [ids(s) for s in resumed]
        assert len({len(r) for r in rests}) == 1, "the same number of batches on every rank"
        got = Counter(i for r in rests for b in r for i in b)
        assert set(got) == set(range(N_SAMPLES)) - consumed
        assert sum(got.values()) - len(got) <= (loaded - 1) * 8, "repeats only as padding"


def test_mix_batch_elastic_resume_through_a_paddle_dataloader_with_workers() -> None:
    """mix="batch" over a ConcatDataset of two paddle datasets: 2 ranks consume 3 batches
    each through DataLoaders with 2 workers; 3 ranks then read exactly the rest, every batch
    still 4 + 2 samples of the two sources."""
    paddle = pytest.importorskip("paddle")

    class Source(paddle.io.Dataset):  # type: ignore[misc,name-defined]
        def __init__(self, n: int, base: int, source: int) -> None:
            super().__init__()
            self.inner = IdDataset(n, [0, n], salt=source, base=base)
            self.shard_bounds = self.inner.shard_bounds
            self.index = self.inner.index
            self.source = source

        def __len__(self) -> int:
            return self.inner.n

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return np.array([self.inner[i][0]]), np.array([self.source])

    ds = ConcatDataset([Source(120, 0, 0), Source(60, 120, 1)])

    def make(rank: int, world: int) -> ChunkShuffleBatchSampler:
        return ChunkShuffleBatchSampler(
            ds, batch_size=6, weights=[2, 1], mix="batch", seed=5, rank=rank, world_size=world
        )

    def batches(sampler: Any, stop: int | None = None) -> list[list[int]]:
        loader = paddle.io.DataLoader(ds, batch_sampler=sampler, num_workers=2)
        out = []
        for j, (ids, source) in enumerate(loader):
            if stop is not None and j == stop:
                break
            assert np.bincount(source.numpy()[:, 0], minlength=2).tolist() == [4, 2]
            out.append(ids.numpy()[:, 0].tolist())
        return out

    k = 3
    saved = [make(r, 2) for r in range(2)]
    consumed = Counter(i for s in saved for b in batches(s, stop=k) for i in b)
    state = saved[0].state_dict(consumed_batches=k)
    resumed = [make(r, 3) for r in range(3)]
    for s in resumed:
        s.load_state_dict(json.loads(json.dumps(state)))
    rests = [batches(s) for s in resumed]
    assert {len(r) for r in rests} == {len(resumed[0])} == {(30 - 2 * k) // 3}
    assert consumed.total() == 2 * k * 6
    got = Counter(i for r in rests for b in r for i in b)
    assert got == Counter(range(180)) - consumed, "exactly the unconsumed samples, once each"


def test_shard_stream_of_a_real_lmdb_resumes_on_fewer_ranks_with_other_workers(
    packed: Path,  # noqa: F811 - the fixture imported above
    truth: dict[str, Any],  # noqa: F811
) -> None:
    """Two ranks read 3 batches each through DataLoaders with 2 workers; one rank with 3
    workers and another batch size then reads exactly the rest."""
    from tests.readers.test_stream import loader_ids

    paddle = pytest.importorskip("paddle")

    def loader(stream: ShardStream, workers: int, batch_size: int) -> Any:
        return paddle.io.DataLoader(stream, batch_size=batch_size, num_workers=workers)

    kw: dict[str, Any] = {"chunk_size": 8, "shuffle_buffer": 16, "seed": 5}
    consumed: set[int] = set()
    state: dict[str, Any] = {}
    for rank in range(2):
        s = ShardStream(packed, rank=rank, world_size=2, **kw)
        s.set_epoch(1)
        consumed |= {i for b in loader_ids(loader(s, 2, 8), truth, stop=3) for i in b}
        if rank == 0:
            state = s.state_dict(consumed_batches=3, loader=loader(s, 2, 8))
    resumed = ShardStream(packed, rank=0, world_size=1, **kw)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert resumed.start_batch == 0
    rest = [i for b in loader_ids(loader(resumed, 3, 5), truth) for i in b]
    assert len(consumed) == 2 * 3 * 8
    assert sorted(rest) == sorted(set(range(len(truth["labels"]))) - consumed)


@pytest.mark.slow
def test_recipe_two_processes_then_one(tmp_path: Path) -> None:
    """scripts/recipe_mix_buckets.py as the README runs it: paddle.distributed.launch with 2
    CPU processes, interrupted, resumed in 1 process; the epoch sees every drawn sample."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = str(root / "scripts" / "recipe_mix_buckets.py")
    data = tmp_path / "recipe"

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    run(script, "make-data", str(data))
    launch = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    run(
        *launch, "--log_dir", str(tmp_path / "log"), script, "train", str(data), "--stop-after", "3"
    )
    state = json.loads((data / "ckpt.json").read_text())["sampler"]
    assert (state["world_size"], state["position"]) == (2, 3)
    run(script, "train", str(data), "--resume")
    out = run(script, "check", str(data))
    # ratio_list [0.5, 1.0] of 300 + 120: 150 + 120 draws, each seen once
    assert "270 of 270 drawn samples seen (150 synthetic, 120 real); missing []" in out


def test_another_epoch_and_back_forgets_the_elastic_rest() -> None:
    kind = KINDS["chunk-sampler"]
    state = kind.save(_ranks(kind, 2, False)[0], 30)
    s = kind.make(0, 3, False)
    s.load_state_dict(state)
    assert len(s.rank_order()) < len(s) + 1 < 69
    s.set_epoch(EPOCH + 1)
    s.set_epoch(EPOCH)
    fresh = kind.make(0, 3, False)
    fresh.set_epoch(EPOCH)
    assert s.rank_order().tolist() == fresh.rank_order().tolist()
    assert len(s) == len(fresh) == 68


def _mix_batch(rank: int, world: int, ds: ConcatDataset | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = {"weights": [2, 1], "mix": "batch", "epoch_samples": 180} | kw
    return ChunkShuffleBatchSampler(
        _mixed() if ds is None else ds, batch_size=6, rank=rank, world_size=world, **KW | args
    )


def test_mix_batch_state_inside_a_batch_resumes_only_at_its_world_size() -> None:
    """A position inside a mixed batch (ChunkShuffleSampler's own state) continues at the
    saved world size; at another it would split a batch, so it is refused saying why."""
    saved = _mix_batch(0, 2).sampler
    saved.set_epoch(EPOCH)
    full = list(saved)
    state = saved.state_dict(consumed_samples=15)
    assert (state["version"], state["mix"], state["mix_batch_size"]) == (3, "batch", 6)
    same = _mix_batch(0, 2).sampler
    same.load_state_dict(state)
    assert list(same) == full[15:]
    with pytest.raises(
        ValueError,
        match=r"the saved position \(15 samples, saved with "
        r"world_size=2\) falls inside a mixed batch of 6",
    ):
        _mix_batch(0, 3).sampler.load_state_dict(state)
    whole = _mix_batch(0, 3).sampler
    whole.load_state_dict(saved.state_dict(consumed_samples=18))  # 3 whole batches: fine
    assert whole.history[0].position == 18
    assert len(whole) == -(-(30 - 2 * 3) // 3) * 6
    bad = saved.state_dict(consumed_samples=18) | {"history": [{"world_size": 4, "position": 5}]}
    with pytest.raises(ValueError, match=r"a history entry's position \(5 samples"):
        _mix_batch(0, 2).sampler.load_state_dict(bad)


def test_mix_batch_state_of_other_sources_or_mixing_is_refused() -> None:
    state = _mix_batch(0, 2).state_dict(consumed_batches=2)
    smaller = ConcatDataset([IdDataset(120, [0, 40, 120]), IdDataset(30, [0, 30], base=120)])
    with pytest.raises(
        ValueError,
        match=r"is of another dataset \(.*source_sizes: saved \[120, 60\], now \[120, 30\] "
        r"\(other sources, or another selection of them\)",
    ):
        _mix_batch(0, 3, smaller, epoch_samples=150).load_state_dict(state)
    with pytest.raises(ValueError, match=r"different parameters \(mix: saved 'batch', now 'epoch'"):
        _mix_batch(0, 3, mix="epoch").load_state_dict(state)
    with pytest.raises(ValueError, match=r"weights: saved \[2.0, 1.0\], now \[1.0, 1.0\]"):
        _mix_batch(0, 2, weights=[1, 1]).load_state_dict(state)


def test_a_version_2_mix_batch_state_loads_at_any_size() -> None:
    """Version 2 wrote the same layout (its mix="batch" states never had a history); a state
    of an unknown version is refused naming the versions this one reads."""
    state = _mix_batch(1, 2).state_dict(consumed_batches=2) | {"version": 2}
    resumed = _mix_batch(0, 1)
    resumed.load_state_dict(state)
    assert len(resumed) == 30 - 2 * 2
    with pytest.raises(
        ValueError, match=r"version 5 is not supported \(this version reads 1, 2, 3, 4\)"
    ):
        resumed.load_state_dict(state | {"version": 5})
