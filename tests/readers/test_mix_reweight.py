"""load_state_dict(state, weights=[...]): new mixture weights at a checkpoint (readers.reweight).

The consumed samples stay consumed; the rest of the epoch (its N draws minus those consumed by
any rank) is drawn with the new weights, exact largest-remainder counts per source, split over
the ranks now running; over seeds x saved world sizes x loaded world sizes x mix modes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from readers.buckets import BucketBatchSampler
from readers.concat import ConcatDataset
from readers.mixing import mix_counts
from readers.samplers import ChunkShuffleBatchSampler, ChunkShuffleSampler
from readers.stream import ShardStream
from tests.readers.test_elastic_resume import STREAM_LOADER, IdDataset, _stream_units

OLD, NEW = (2.0, 1.0), (1.0, 3.0)
N = 60  # draws per epoch: each source stays inside one pass, so no id may repeat in an epoch
BATCH = 6
EPOCH = 1
SIZES = (1, 2, 3)


def _dataset() -> ConcatDataset:
    """Sources of 120 and 90 samples; items name their global id."""
    return ConcatDataset(
        [IdDataset(120, [0, 40, 120], salt=1), IdDataset(90, [0, 50, 90], salt=2, base=120)]
    )


def _make(mix: str, rank: int, world: int, *, weights: Any = OLD, seed: int = 0, **kw: Any) -> Any:
    args = {"weights": list(weights), "epoch_samples": N, "mix": mix, "chunk_size": 8, "seed": seed}
    args |= {"rank": rank, "world_size": world} | kw
    if mix == "batch":
        return ChunkShuffleBatchSampler(_dataset(), batch_size=BATCH, **args)
    return ChunkShuffleSampler(_dataset(), **args)


def _units(s: Any) -> list[list[int]]:
    """One pass of a rank: batches (mix="batch") or single samples."""
    return [list(b) for b in s] if isinstance(s, ChunkShuffleBatchSampler) else [[i] for i in s]


def _save(s: Any, k: int) -> dict[str, Any]:
    if isinstance(s, ChunkShuffleBatchSampler):
        return s.state_dict(consumed_batches=k)  # type: ignore[no-any-return]
    return s.state_dict(consumed_samples=k)  # type: ignore[no-any-return]


def _source(ids: list[int]) -> list[int]:
    return np.bincount(np.asarray(ids) >= 120, minlength=2).tolist()  # type: ignore[no-any-return]


def _consume(mix: str, saved: int, seed: int, k: int) -> tuple[dict[str, Any], Counter[int]]:
    """`saved` ranks each consume `k` units of epoch EPOCH; rank 0's state and the ids taken."""
    ranks = [_make(mix, r, saved, seed=seed) for r in range(saved)]
    consumed: Counter[int] = Counter()
    for s in ranks:
        s.set_epoch(EPOCH)
        consumed.update(i for u in _units(s)[:k] for i in u)
    return json.loads(json.dumps(_save(ranks[0], k))), consumed


def _rest(mix: str, state: dict[str, Any], loaded: int, **kw: Any) -> list[list[list[int]]]:
    out = []
    for r in range(loaded):
        s = _make(mix, r, loaded, **kw)
        s.load_state_dict(state, weights=list(NEW))
        out.append(_units(s))
    return out


@pytest.mark.parametrize("mix", ["epoch", "batch"])
@pytest.mark.parametrize("loaded", SIZES)
@pytest.mark.parametrize("saved", SIZES)
@pytest.mark.parametrize("seed", [0, 7])
def test_rest_is_drawn_with_the_new_weights_and_never_repeats_a_consumed_sample(
    seed: int, saved: int, loaded: int, mix: str
) -> None:
    unit = BATCH if mix == "batch" else 1
    per_rank = -(-(N // unit) // saved)
    k = max(1, per_rank // 3)
    state, consumed = _consume(mix, saved, seed, k)
    assert max(consumed.values()) == 1
    rests = _rest(mix, state, loaded, seed=seed)
    assert len({len(r) for r in rests}) == 1, "every rank yields the same number of units"
    joined = [u for r in rests for u in r]  # the rest, then padding that repeats its start
    left = (N - consumed.total()) // unit  # units of the epoch nobody consumed
    rest, pad = joined[:left], joined[left:]
    assert pad == rest[: len(pad)]
    assert len(pad) < loaded
    ids = [i for u in rest for i in u]
    assert not set(ids) & set(consumed), "a consumed sample is never drawn again"
    assert len(set(ids)) == len(ids) == N - consumed.total()
    if mix == "batch":
        comp = mix_counts(BATCH, NEW).tolist()
        assert all(_source(u) == comp for u in rest), "every batch holds the new counts"
    else:
        assert _source(ids) == mix_counts(left, NEW).tolist(), "exact largest remainder"


@pytest.mark.parametrize("mix", ["epoch", "batch"])
@pytest.mark.parametrize(("saved", "loaded"), [(2, 3), (3, 2), (2, 2)])
def test_drop_last_keeps_the_epoch_total_and_drops_only_the_split_remainder(
    mix: str, saved: int, loaded: int
) -> None:
    """With drop_last the units the saved split left out are drawn anew too (N stays); the
    new split drops fewer than `loaded` units of the rest."""
    unit = BATCH if mix == "batch" else 1
    ranks = [_make(mix, r, saved, drop_last=True) for r in range(saved)]
    consumed: Counter[int] = Counter()
    for s in ranks:
        s.set_epoch(EPOCH)
        consumed.update(i for u in _units(s)[:2] for i in u)
    state = _save(ranks[0], 2)
    rests = [u for r in _rest(mix, state, loaded, drop_last=True) for u in r]
    ids = [i for u in rests for i in u]
    left = (N - consumed.total()) // unit
    assert left - loaded < len(rests) <= left
    assert not set(ids) & set(consumed)
    assert len(set(ids)) == len(ids)
    (one,) = _rest(mix, state, 1, drop_last=True)  # one rank: the whole rest, in order
    assert len(one) == left
    assert ids == [i for u in one[: len(rests)] for i in u], "the rest's order, cut to shares"


@pytest.mark.parametrize("mix", ["epoch", "batch"])
def test_a_state_saved_after_the_change_resumes_elastically_and_later_epochs_use_new_weights(
    mix: str,
) -> None:
    unit = BATCH if mix == "batch" else 1
    state, consumed = _consume(mix, 2, 3, 2)
    first = [_make(mix, r, 3, seed=3) for r in range(3)]
    for s in first:
        s.load_state_dict(state, weights=list(NEW))
    rests = [_units(s) for s in first]
    for units in rests:
        consumed.update(i for u in units[:1] for i in u)
    again = json.loads(json.dumps(_save(first[0], 1)))
    assert again["version"] == 4
    assert again["weights"] == list(NEW)
    assert again["history"] == [{"world_size": 2, "position": 2 * unit, "weights": list(OLD)}]
    # A sampler built with the new weights loads it without weights=, at another size.
    second = [_make(mix, r, 2, weights=NEW, seed=3) for r in range(2)]
    for s in second:
        s.load_state_dict(again)
    got = [i for s in second for u in _units(s) for i in u]
    expected = {i for units in rests for u in units for i in u} - set(consumed)
    left = (N - consumed.total()) // unit
    assert len(expected) == left * unit
    assert Counter(got[: left * unit]) == Counter(expected), "exactly the rest of the rest"
    # Later epochs are those of a sampler built with the new weights.
    for s, fresh in zip(
        second, [_make(mix, r, 2, weights=NEW, seed=3) for r in range(2)], strict=True
    ):
        s.set_epoch(EPOCH + 1)
        fresh.set_epoch(EPOCH + 1)
        assert _units(s) == _units(fresh)


def test_without_weights_a_state_of_other_weights_is_refused() -> None:
    state, _ = _consume("epoch", 2, 0, 3)
    s = _make("epoch", 0, 2, weights=NEW)
    with pytest.raises(
        ValueError, match=r"different parameters \(.*weights: saved \[2\.0, 1\.0\], now \[1\.0, 3"
    ):
        s.load_state_dict(state)


def test_the_saved_weights_again_is_a_plain_resume() -> None:
    """weights= equal to the saved ones continues every rank's share where it stopped."""
    state, _ = _consume("epoch", 2, 0, 5)
    plain, same = _make("epoch", 1, 2), _make("epoch", 1, 2, weights=NEW)
    plain.load_state_dict(state)
    same.load_state_dict(state, weights=list(OLD))
    assert same.start_position == 5
    assert same.mixture.weights == OLD
    assert list(same) == list(plain)
    assert same.state_dict(consumed_samples=5)["version"] == 3


def test_bad_requests_are_clear_errors() -> None:
    state, _ = _consume("batch", 2, 0, 1)
    s = _make("batch", 0, 2).sampler
    inside = s.state_dict(consumed_samples=3)
    with pytest.raises(ValueError, match=r"cannot change the weights: the saved position \(3 "):
        _make("batch", 0, 2).load_state_dict(inside, weights=list(NEW))
    with pytest.raises(ValueError, match=r"mix='batch': weights \[1\.0, 100\.0\] give source 0"):
        _make("batch", 0, 2).load_state_dict(state, weights=[1, 100])
    with pytest.raises(ValueError, match=r"one entry per source \(2 sources\), got 3"):
        _make("batch", 0, 2).load_state_dict(state, weights=[1, 1, 1])
    plain = ChunkShuffleSampler(_dataset(), rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"this sampler mixes no sources"):
        plain.load_state_dict(plain.state_dict(), weights=[1, 1])


def _stream(rank: int, world: int, seed: int, weights: Any = OLD) -> ShardStream:
    return ShardStream(
        _dataset().datasets,
        weights=list(weights),
        epoch_samples=N,
        shuffle_buffer=16,
        chunk_size=8,
        seed=seed,
        rank=rank,
        world_size=world,
    )


@pytest.mark.parametrize("loaded", SIZES)
@pytest.mark.parametrize("saved", SIZES)
@pytest.mark.parametrize("seed", [0, 5])
def test_shard_stream_rest_is_drawn_with_the_new_weights(
    seed: int, saved: int, loaded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ShardStream(weights=...): each saved rank's loader (2 workers, batches of 5) yielded 2
    batches; the loaded ranks' loaders yield exactly the other draws, in the new counts."""
    consumed: Counter[int] = Counter()
    ranks = [_stream(r, saved, seed) for r in range(saved)]
    for s in ranks:
        s.set_epoch(EPOCH)
        consumed.update(i for b in _stream_units(s, monkeypatch)[:2] for i in b)
    state = ranks[0].state_dict(consumed_batches=2, loader=STREAM_LOADER)
    got: Counter[int] = Counter()
    for r in range(loaded):
        s = _stream(r, loaded, seed)
        s.load_state_dict(json.loads(json.dumps(state)), weights=list(NEW))
        got.update(i for b in _stream_units(s, monkeypatch, workers=1 + r % 2) for i in b)
    left = N - consumed.total()
    assert not set(got) & set(consumed), "no consumed sample again"
    assert len(got) == left, "every unconsumed draw"
    assert got.total() - left < loaded, "repeats only as padding"
    assert _source(list(got)) == mix_counts(left, NEW).tolist()
    again = s.state_dict(consumed_samples=0)
    assert again["version"] == 3
    assert again["weights"] == list(NEW)
    assert again["history"][-1]["weights"] == list(OLD)
    fresh = _stream(0, 1, seed, weights=NEW)  # built with the new weights: no weights=
    fresh.load_state_dict(json.loads(json.dumps(again)))
    assert Counter(i for i, _ in fresh) == Counter(set(got))  # in-process, as it was saved


def _bucket(rank: int, world: int, seed: int, weights: Any = OLD, **kw: Any) -> BucketBatchSampler:
    return BucketBatchSampler(
        _dataset(), 5, key="width", buckets=3, weights=list(weights), epoch_samples=N,
        chunk_size=8, seed=seed, rank=rank, world_size=world, **kw,
    )  # fmt: skip


def _one_bucket(s: BucketBatchSampler, batch: list[int]) -> bool:
    local = np.asarray(batch) - 120 * (np.asarray(batch) >= 120)
    widths = 16 + (local * 37) % 300  # IdDataset's widths
    return len(set(np.searchsorted(s.boundaries, widths, side="right").tolist())) == 1


@pytest.mark.parametrize("loaded", SIZES)
@pytest.mark.parametrize("saved", SIZES)
@pytest.mark.parametrize("seed", [0, 5])
def test_bucket_sampler_rest_is_drawn_with_the_new_weights(
    seed: int, saved: int, loaded: int
) -> None:
    """BucketBatchSampler(weights=...): the consumed batches stay; the rest of the epoch's
    draws, in the new counts, is bucketed anew into bucket-pure batches."""
    ranks = [_bucket(r, saved, seed) for r in range(saved)]
    consumed: Counter[int] = Counter()
    for s in ranks:
        s.set_epoch(EPOCH)
        consumed.update(i for b in list(s)[:2] for i in b)
    state = json.loads(json.dumps(ranks[0].state_dict(consumed_batches=2)))
    resumed = [_bucket(r, loaded, seed) for r in range(loaded)]
    for s in resumed:
        s.load_state_dict(state, weights=list(NEW))
    shares = [list(s) for s in resumed]
    assert len({len(b) for b in shares}) == 1 == len({len(s) for s in resumed})
    joined = [b for share in shares for b in share]
    left, n = N - consumed.total(), 0
    while sum(len(b) for b in joined[:n]) < left:
        n += 1
    rest, pad = joined[:n], joined[n:]
    assert pad == rest[: len(pad)]
    assert len(pad) < loaded
    ids = [i for b in rest for i in b]
    assert len(ids) == len(set(ids)) == left
    assert not set(ids) & set(consumed)
    assert _source(ids) == mix_counts(left, NEW).tolist()
    assert all(_one_bucket(resumed[0], b) for b in joined)
    again = resumed[0].state_dict(consumed_batches=1)
    assert again["version"] == 4
    assert again["history"][-1]["weights"] == list(OLD)
    # a sampler built with the new weights continues it without weights=, at another size
    after = _bucket(0, 1, seed, weights=NEW)
    after.load_state_dict(json.loads(json.dumps(again)))
    taken = {i for share in shares for b in share[:1] for i in b}
    assert Counter(i for b in after for i in b) == Counter(set(ids) - taken)


def test_reweight_through_a_paddle_dataloader_with_workers() -> None:
    """2 ranks consume 3 batches each through DataLoaders with 2 workers; 3 ranks continue
    with new weights: the rest is the unconsumed draws, in the new proportions."""
    paddle = pytest.importorskip("paddle")

    class Source(paddle.io.Dataset):  # type: ignore[misc,name-defined]
        def __init__(self, inner: IdDataset) -> None:
            super().__init__()
            self.inner = inner
            self.shard_bounds = inner.shard_bounds
            self.index = inner.index

        def __len__(self) -> int:
            return self.inner.n

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return np.array([self.inner[i][0]]), np.array([0])

    ds = ConcatDataset([Source(d) for d in _dataset().datasets])

    def batches(sampler: Any, stop: int | None = None) -> list[int]:
        loader = paddle.io.DataLoader(ds, batch_sampler=sampler, num_workers=2)
        out = []
        for j, (ids, _) in enumerate(loader):
            if j == stop:
                break
            out.extend(ids.numpy()[:, 0].tolist())
        return out

    def make(rank: int, world: int) -> ChunkShuffleBatchSampler:
        return ChunkShuffleBatchSampler(
            ds, batch_size=4, weights=list(OLD), epoch_samples=N, seed=2, rank=rank,
            world_size=world,
        )  # fmt: skip

    saved = [make(r, 2) for r in range(2)]
    consumed = Counter(i for s in saved for i in batches(s, stop=3))
    state = json.loads(json.dumps(saved[0].state_dict(consumed_batches=3)))
    resumed = [make(r, 3) for r in range(3)]
    for s in resumed:
        s.load_state_dict(state, weights=list(NEW))
    got = [i for s in resumed for i in batches(s)]
    left = N - consumed.total()
    assert len(got) == left
    assert not set(got) & set(consumed)
    assert len(set(got)) == left
    assert _source(got) == mix_counts(left, NEW).tolist()


@pytest.mark.parametrize("mix", ["epoch", "batch"])
def test_two_changes_in_one_epoch_at_three_world_sizes(mix: str) -> None:
    """(2, 1) on 2 ranks, then (1, 3) on 3 ranks, then (1, 1) on 1 rank: each stretch's draws
    are new samples, and the last rest holds the last weights' exact counts."""
    unit = BATCH if mix == "batch" else 1
    state, consumed = _consume(mix, 2, 1, 2)
    mid = [_make(mix, r, 3, seed=1) for r in range(3)]
    for s in mid:
        s.load_state_dict(state, weights=list(NEW))
        consumed.update(i for u in _units(s)[:1] for i in u)
    state = json.loads(json.dumps(_save(mid[0], 1)))
    assert [h.get("weights") for h in state["history"]] == [list(OLD)]
    last = _make(mix, 0, 1, seed=1, weights=[5, 5])  # built with yet other weights
    last.load_state_dict(state, weights=[1, 1])
    rest = [i for u in _units(last) for i in u]
    assert len(rest) == N - consumed.total()
    assert not set(rest) & set(consumed)
    assert len(set(rest)) == len(rest)
    assert max(consumed.values()) == 1
    left = len(rest) // unit
    expected = mix_counts(BATCH, (1, 1)) * left if unit > 1 else mix_counts(left, (1, 1))
    assert _source(rest) == expected.tolist()
    saved = last.state_dict(consumed_samples=0)
    assert [h.get("weights") for h in saved["history"]] == [list(OLD), list(NEW)]


def test_a_source_drawn_past_its_size_keeps_exact_counts() -> None:
    """epoch_samples far above the sources' sizes: the rest still has the exact counts."""
    s = ChunkShuffleSampler(_dataset(), weights=[1, 1], epoch_samples=500, chunk_size=8, seed=2,
                            rank=0, world_size=2)  # fmt: skip
    s.set_epoch(3)
    done = list(s)[:100]
    state = s.state_dict(consumed_samples=100)
    t = ChunkShuffleSampler(_dataset(), weights=[1, 1], epoch_samples=500, chunk_size=8, seed=2,
                            rank=0, world_size=1)  # fmt: skip
    t.load_state_dict(state, weights=[1, 9])
    rest = list(t)
    assert len(rest) == 300
    assert _source(rest) == mix_counts(300, (1, 9)).tolist()
    ones = Counter(done) + Counter(list(_other_rank())[:100]) + Counter(rest)
    assert max(ones.values()) <= -(-(100 + 270) // 90) + 1, "repeats only from new passes"


def _other_rank() -> ChunkShuffleSampler:
    s = ChunkShuffleSampler(_dataset(), weights=[1, 1], epoch_samples=500, chunk_size=8, seed=2,
                            rank=1, world_size=2)  # fmt: skip
    s.set_epoch(3)
    return s
