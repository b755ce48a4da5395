"""BucketBatchSampler: bucket purity, coverage, equal batches per rank, determinism, locality,
per-bucket batch sizes, resume, real packed datasets (and a concatenation) through a DataLoader."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest

from readers import ConcatDataset, LmdbDataset, RecordIODataset, bucket_order
from readers.buckets import (
    BucketBatchSampler,
    assign_buckets,
    bucket_batch_sizes,
    bucket_edges,
    key_codes,
    key_values,
)
from readers.mixing import epoch_draws, mix_counts
from tests.conftest import build_packed
from tests.readers.test_order import EPOCHS, SEEDS, WORLD_SIZES

N = 301


class WidthDataset:
    """Sized, with shard bounds and an index of widths and heights, and no records."""

    def __init__(self, n: int = N, *, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.shard_bounds = np.array([0, n // 3, n // 3, n], dtype=np.int64)
        width = rng.integers(16, 400, n).astype(np.int64)
        width[::7] = 100  # many ties
        self.index = SimpleNamespace(
            nbytes=(width * 10).astype(np.uint32),
            crc32=rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
            extra={"width": width, "height": rng.integers(20, 40, n).astype(np.int64)},
            root=None,
        )

    @property
    def width(self) -> np.ndarray:
        return np.asarray(self.index.extra["width"])

    def __len__(self) -> int:
        return self.n


def make(ds: Any, **kw: Any) -> BucketBatchSampler:
    kw.setdefault("chunk_size", 8)
    kw.setdefault("window", 2)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("buckets", 5)
    return BucketBatchSampler(ds, kw.pop("batch_size", 6), **kw)


def rank_batches(ds: Any, world: int, epoch: int, **kw: Any) -> list[list[list[int]]]:
    out = []
    for rank in range(world):
        s = make(ds, rank=rank, world_size=world, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


# ------------------------------------------------------------------ pure functions


def test_bucket_edges_are_quantiles_of_the_values() -> None:
    values = np.arange(1, 101)
    assert bucket_edges(values, 4).tolist() == [26, 51, 76]
    assert np.bincount(assign_buckets(values, bucket_edges(values, 4))).tolist() == [25] * 4
    # the counting path (small integers) and the partition path (floats) agree
    rng = np.random.default_rng(1)
    ints = rng.integers(0, 5000, 10_000)
    for k in (1, 2, 7, 64):
        assert bucket_edges(ints, k).tolist() == bucket_edges(ints.astype(float), k).tolist()
    assert bucket_edges(np.full(50, 9), 8).tolist() == [], "equal values: one bucket"
    edges = bucket_edges(np.array([1, 1, 1, 1, 2, 3]), 3)
    assert edges.tolist() == [2.0], "repeats merged, no empty bucket"
    assert bucket_edges(np.zeros(0), 4).tolist() == []
    assert bucket_edges(values, [10, 20.5]).tolist() == [10.0, 20.5]
    for bad in ([20, 10], [1, 1], [float("nan")], "wide"):
        with pytest.raises(ValueError, match=r"buckets|boundaries"):
            bucket_edges(values, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="buckets must be an integer >= 1"):
        bucket_edges(values, 0)


def test_assign_buckets_by_lookup_equals_binary_search() -> None:
    rng = np.random.default_rng(2)
    values = rng.integers(-50, 3000, 5000)
    edges = np.array([-10.0, 0.0, 99.5, 100.0, 2999.0])
    expected = np.searchsorted(edges, values.astype(float), side="right")
    assert assign_buckets(values, edges).tolist() == expected.tolist()
    assert assign_buckets(values.astype(float), edges).tolist() == expected.tolist()
    assert assign_buckets(np.array([5, 10, 20]), np.array([10.0, 20.0])).tolist() == [0, 1, 2]


def test_per_bucket_batch_sizes() -> None:
    values = np.array([10, 20, 20, 40, 80, 80])
    bucket = assign_buckets(values, np.array([15.0, 30.0, 50.0]))
    kw: dict[str, Any] = {"num_buckets": 4, "batch_size": 8}
    assert bucket_batch_sizes(values, bucket, **kw).tolist() == [8] * 4
    assert bucket_batch_sizes(values, bucket, scale_batch=True, **kw).tolist() == [64, 32, 16, 8]
    assert bucket_batch_sizes(values, bucket, batch_sizes=[4, 3, 2, 1], **kw).tolist() == [
        4,
        3,
        2,
        1,
    ]
    with pytest.raises(ValueError, match="one integer per bucket"):
        bucket_batch_sizes(values, bucket, batch_sizes=[4, 3], **kw)
    with pytest.raises(ValueError, match="not both"):
        bucket_batch_sizes(values, bucket, batch_sizes=[1] * 4, scale_batch=True, **kw)
    with pytest.raises(ValueError, match=">= 1"):
        bucket_batch_sizes(values, bucket, batch_sizes=[1, 0, 1, 1], **kw)


# ------------------------------------------------------------------ the coded fast path


def sized(n: int, heights: tuple[int, ...], seed: int) -> WidthDataset:
    """A WidthDataset whose heights are drawn from `heights`."""
    ds = WidthDataset(n, seed=seed)
    rng = np.random.default_rng(seed + 100)
    ds.index.extra["height"] = rng.choice(np.array(heights, dtype=np.int64), n)
    return ds


@pytest.mark.parametrize("key", ["width", "height", "aspect"])
@pytest.mark.parametrize(
    ("heights", "every", "buckets"),
    [
        ((32,), 1, 16),
        ((17, 32, 48, 64), 1, 7),
        ((1, 2, 3, 40), 3, 5),
        ((32,), 2, [0.5, 4.0, 9.25]),
    ],
)
def test_coded_keys_give_what_the_plain_values_give(
    key: str, heights: tuple[int, ...], every: int, buckets: Any
) -> None:
    """`key_codes` (one count and one table lookup per sample) against the plain path on the
    same values as floats (a partition and a binary search per sample): the same values bit
    for bit, boundaries, buckets, batch sizes and epochs."""
    ds = sized(2000, heights, seed=len(heights))
    ids = np.arange(0, 2000, every) if every > 1 else None
    values = key_values(ds, key).astype(np.float64)
    assert key_codes(ds, values) is None, "a float array takes the plain path"
    coded = key_codes(ds, key, ids)
    assert coded is not None
    picked = values if ids is None else values[ids]
    np.testing.assert_array_equal(coded.table[coded.codes], picked)  # bit for bit
    if key == "height" and not isinstance(buckets, int):
        buckets = [20.0, 40.0]
    for scale in (False, True):
        kw: dict[str, Any] = {"buckets": buckets, "scale_batch": scale, "indices": ids, "seed": 4}
        fast, plain = make(ds, key=key, **kw), make(ds, key=values, **kw)
        assert fast.boundaries == plain.boundaries
        assert fast.bucket_counts == plain.bucket_counts
        assert fast.batch_sizes == plain.batch_sizes
        fast.set_epoch(3)
        plain.set_epoch(3)
        assert list(fast) == list(plain)


def test_coded_keys_fall_back_and_refuse_as_the_plain_path() -> None:
    ds = sized(500, (32, 64), seed=1)
    assert key_codes(ds, "aspect") is not None
    ds.index.extra["width"][::50] = 3_000_000  # a table far larger than the samples
    assert key_codes(ds, "aspect") is None
    assert key_codes(ds, "width") is None
    aspect = ds.index.extra["width"] / ds.index.extra["height"]
    s = make(ds, key="aspect", buckets=4)
    assert s.boundaries == make(ds, key=aspect, buckets=4).boundaries
    for b in s:
        assert len(set(np.searchsorted(s.boundaries, aspect[b], "right").tolist())) == 1
    bad = sized(500, (32, 64), seed=1)
    bad.index.extra["height"][[7, 9]] = -1  # the index does not know them
    assert key_codes(bad, "aspect") is not None
    with pytest.raises(
        ValueError, match=r"2 selected samples have no aspect in the index \(ids \[7, 9\]"
    ):
        make(bad, key="aspect")
    make(bad, key="aspect", indices=np.setdiff1d(np.arange(500), [7, 9]))  # left out: fine


def test_coded_quantiles_see_only_the_values_samples_hold() -> None:
    """The aspect table holds every (width, height) pair of the ranges, most held by no
    sample: here its smallest entry (16 / 32) is held by none, and the smallest held value
    (16 / 17) by 30% of the samples, so it is a quantile and no boundary."""
    ds = WidthDataset(1000, seed=3)
    width, height = ds.index.extra["width"], ds.index.extra["height"]
    height[:] = np.where(width >= 200, 32, 17)
    width[:300], height[:300] = 16, 17
    values = key_values(ds, "aspect")
    fast, plain = make(ds, key="aspect", buckets=8), make(ds, key=values, buckets=8)
    assert fast.boundaries == plain.boundaries
    assert fast.boundaries[0] > 16 / 17
    assert fast.bucket_counts == plain.bucket_counts
    assert min(fast.bucket_counts) > 0, "no empty bucket"


def ref_shuffle_blocks(values: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    """The in-block shuffle written plainly: one (rows, width) draw of 32-bit keys, each row
    argsorted by (key, column), padding last."""
    rng = np.random.default_rng(seed)
    width = int(lengths.max())
    keys = rng.integers(0, 2**32, size=(lengths.size, width), dtype=np.uint64)
    out, start = [], 0
    for row, size in zip(keys.tolist(), lengths.tolist(), strict=True):
        cols = sorted(range(size), key=lambda c: (row[c], c))
        out += [values[start + c] for c in cols]
        start += size
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("piece", [1, 7, 1 << 19])
def test_block_shuffle_and_runs_equal_plain_references(
    piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the scratch pieces: the same permutation as the plain reference (and the
    same generator state after it), and the runs of `_runs` / `_gather_runs`."""
    monkeypatch.setattr(bucket_order, "_PIECE", piece)
    rng = np.random.default_rng(9)
    for lengths in ([5], [3, 3, 3], [4, 1, 4, 2, 4], [1] * 9, [6, 0, 6]):
        size = np.array(lengths, dtype=np.int64)
        size = size[size > 0]  # blocks are never empty
        values = rng.permutation(int(size.sum()) * 3)[: int(size.sum())].astype(np.int64)
        gen = np.random.default_rng(5)
        got = bucket_order._shuffle_blocks(values, size, gen)
        np.testing.assert_array_equal(got, ref_shuffle_blocks(values, size, 5))
        after = np.random.default_rng(5)
        after.integers(0, 2**32, size=(size.size, int(size.max())), dtype=np.uint64)
        assert gen.random() == after.random(), "the draws of one (rows, width) call"
        via = rng.permutation(values.size)
        gen = np.random.default_rng(5)
        np.testing.assert_array_equal(
            bucket_order._shuffle_blocks(values, size, gen, via=via),
            ref_shuffle_blocks(values[via], size, 5),
        )
    starts = np.array([10, 0, 40, 7, 3], dtype=np.int64)
    lens = np.array([3, 0, 2, 1, 4], dtype=np.int64)
    plain = np.concatenate([np.arange(a, a + n) for a, n in zip(starts, lens, strict=True)])
    np.testing.assert_array_equal(bucket_order._runs(starts, lens), plain)
    table = np.arange(100, 150, dtype=np.int64)
    outer = np.arange(200, dtype=np.int64)[::-1].copy()
    np.testing.assert_array_equal(bucket_order._gather_runs(table, starts, lens), table[plain])
    np.testing.assert_array_equal(
        bucket_order._gather_runs(table, starts, lens, outer), outer[table[plain]]
    )


# ------------------------------------------------------------------ invariants


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("scale", [False, True])
def test_invariants_over_seeds_epochs_and_ranks(world: int, drop_last: bool, scale: bool) -> None:
    ds = WidthDataset()
    kw: dict[str, Any] = {"drop_last": drop_last, "scale_batch": scale}
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        ranks = rank_batches(ds, world, epoch, seed=seed, **kw)
        ref = make(ds, seed=seed, **kw)
        edges, sizes = np.asarray(ref.boundaries), ref.batch_sizes
        # every rank the same number of batches, as len() says
        assert {len(r) for r in ranks} == {len(make(ds, world_size=world, seed=seed, **kw))}
        batches = [b for r in ranks for b in r]
        for b in batches:  # bucket purity, and the bucket's batch size
            buckets = set(np.searchsorted(edges, ds.width[b], side="right").tolist())
            assert len(buckets) == 1
            assert len(b) <= sizes[buckets.pop()]
            if drop_last:
                assert len(b) == sizes[int(np.searchsorted(edges, ds.width[b[0]], "right"))]
        counts = Counter(i for b in batches for i in b)
        if drop_last:  # each sample at most once; left out: short batches, rank remainder
            assert max(counts.values()) == 1
            assert N - len(counts) < len(sizes) * max(sizes) + (world - 1) * max(sizes)
        else:  # each sample once, plus padding: the first batches of the epoch again
            assert set(counts) == set(range(N))
            global_batches = len(ref)
            padded = -(-global_batches // world) * world - global_batches
            repeated = [b for b in batches if any(counts[i] > 1 for i in b)]
            assert len(repeated) == 2 * padded
        # deterministic for (seed, epoch); another epoch is another order
        assert ranks == rank_batches(ds, world, epoch, seed=seed, **kw)
        assert ranks != rank_batches(ds, world, epoch + 1, seed=seed, **kw)


def test_ranks_take_contiguous_slices_of_one_global_list() -> None:
    ds = WidthDataset()
    ref = make(ds, seed=4)
    ref.set_epoch(1)
    flat, bounds, bucket = ref.epoch_batches()
    everything = [flat[bounds[j] : bounds[j + 1]].tolist() for j in range(bucket.size)]
    assert list(ref) == everything
    for world in (2, 3):
        joined = [b for r in rank_batches(ds, world, 1, seed=4) for b in r]
        assert joined[: len(everything)] == everything, "independent of the world size"
        assert joined[len(everything) :] == everything[: len(joined) - len(everything)]


@pytest.mark.parametrize("window", [0, 3])
def test_batches_are_chunks_of_a_bucket(window: int) -> None:
    """Inside a bucket, samples come in chunks of neighbouring members (window 0), or in blocks
    of `window` such chunks, shuffled inside (reads stay near-sequential)."""
    ds = WidthDataset()
    s = make(ds, window=window, chunk_size=8, seed=9)
    flat, bounds, bucket = s.epoch_batches()
    members = assign_buckets(ds.width, np.asarray(s.boundaries))
    for b in range(len(s.batch_sizes)):
        ordered = np.flatnonzero(members == b)
        chunk_of = {int(i): j // 8 for j, i in enumerate(ordered)}
        seq = [int(i) for j in np.flatnonzero(bucket == b) for i in flat[bounds[j] : bounds[j + 1]]]
        assert sorted(seq) == ordered.tolist()
        size = Counter(chunk_of.values())
        per_block = max(window, 1)
        pos = 0
        while pos < len(seq):  # walk block by block: whole chunks, `per_block` at a time
            opened: set[int] = set()
            start, need = pos, 0
            while pos < len(seq):
                c = chunk_of[seq[pos]]
                if c not in opened:
                    opened.add(c)
                    need += size[c]
                    assert len(opened) <= per_block, "a block mixes at most `window` chunks"
                pos += 1
                if pos - start == need and len(opened) == per_block:
                    break
            if window == 0:
                assert seq[start:pos] == sorted(seq[start:pos]), "a chunk keeps id order"


def test_unshuffled_order_is_ascending_bucket_by_bucket() -> None:
    ds = WidthDataset()
    s = make(ds, shuffle=False, batch_size=10)
    batches = list(s)
    bucket = [int(np.searchsorted(s.boundaries, ds.width[b[0]], "right")) for b in batches]
    assert bucket == sorted(bucket)
    flat = [i for b in batches for i in b]
    edges = np.asarray(s.boundaries)
    expected = np.argsort(np.searchsorted(edges, ds.width, "right"), kind="stable")
    assert flat == expected.tolist()


def test_key_aspect_height_and_arrays() -> None:
    ds = WidthDataset()
    aspect = ds.index.extra["width"] / ds.index.extra["height"]
    np.testing.assert_allclose(key_values(ds, "aspect"), aspect)
    s = make(ds, key="aspect", buckets=[2.0, 5.0, 9.0])
    for b in s:
        assert len(set(np.searchsorted([2.0, 5.0, 9.0], aspect[b], "right").tolist())) == 1
    by_height = make(ds, key="height", buckets=3)
    assert by_height.boundaries == bucket_edges(ds.index.extra["height"], 3).tolist()
    custom = make(ds, key=-ds.width, buckets=2)  # any numbers, negative too
    assert custom.boundaries[0] < 0


def test_selection_and_labels() -> None:
    ds = WidthDataset()
    keep = np.arange(N) % 3 == 0
    s = make(ds, indices=keep, buckets=4)
    seen = sorted(i for b in s for i in b)
    assert seen == np.flatnonzero(keep).tolist()
    assert s.boundaries == bucket_edges(ds.width[keep], 4).tolist()


# ------------------------------------------------------------------ weighted mixture


def two_sources() -> Any:
    """A ConcatDataset of 120 + 60 samples with widths and heights in their indexes."""
    return ConcatDataset([WidthDataset(120, seed=1), WidthDataset(60, seed=2)])


@pytest.mark.parametrize(("weights", "n"), [((1, 1), 180), ((1, 2), 150), ((5, 1), 37)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_weighted_buckets_over_seeds_epochs_and_ranks(
    weights: tuple[float, ...], n: int, drop_last: bool
) -> None:
    """Each epoch buckets exactly the mixture's draws (source i: round(N w_i / sum w)), every
    batch of one bucket; the epoch is one list of batches split into equal rank shares;
    deterministic for (seed, epoch); len() follows the epoch (its draws fill the buckets)."""
    ds = two_sources()
    width = key_values(ds, "width")
    counts = mix_counts(n, weights)
    lengths = set()
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        kw: dict[str, Any] = {"weights": weights, "epoch_samples": n, "seed": seed}
        kw |= {"drop_last": drop_last, "scale_batch": True}
        probe = make(ds, **kw)
        probe.set_epoch(epoch)
        flat, bounds, batch_bucket = probe.epoch_batches()
        mixture = probe.mixture
        assert mixture is not None
        draws = epoch_draws(mixture.sources, counts, seed=seed, epoch=epoch)
        if drop_last:
            assert Counter(flat.tolist()) <= Counter(draws.tolist())
            assert draws.size - flat.size < sum(probe.batch_sizes)
        else:
            assert sorted(flat.tolist()) == sorted(draws.tolist()), "exactly the draws"
            assert np.bincount(flat >= 120, minlength=2).tolist() == counts.tolist()
        edges = np.asarray(probe.boundaries)
        for j in range(batch_bucket.size):
            batch = flat[bounds[j] : bounds[j + 1]]
            assert set(np.searchsorted(edges, width[batch], "right").tolist()) == {batch_bucket[j]}
        lengths.add(probe.num_batches)
        for world in WORLD_SIZES:
            shares = []
            for rank in range(world):
                s = make(ds, rank=rank, world_size=world, **kw)
                s.set_epoch(epoch)
                shares.append(list(s))
                assert len(s) == len(shares[-1])
            assert len({len(x) for x in shares}) == 1, "every rank the same number of batches"
            joined = [b for share in shares for b in share]
            ref = [flat[bounds[j] : bounds[j + 1]].tolist() for j in range(batch_bucket.size)]
            want = len(joined)
            assert joined == (ref * (world + 1))[:want], "contiguous slices of one list"
    assert len(lengths) > 1, "the number of batches follows the epoch's draws"


def test_weighted_buckets_need_a_concat_and_good_weights() -> None:
    with pytest.raises(ValueError, match=r"mix the sources of a readers\.ConcatDataset"):
        make(WidthDataset(), weights=[1])
    with pytest.raises(ValueError, match=r"one entry per source \(2 sources\), got 3"):
        make(two_sources(), weights=[1, 2, 3])
    with pytest.raises(ValueError, match=r"weights\[0\] is 0"):
        make(two_sources(), weights=[0, 2])
    with pytest.raises(ValueError, match="epoch_samples must be an integer >= 1, got 0"):
        make(two_sources(), weights=[1, 2], epoch_samples=0)
    state = make(two_sources(), weights=[1, 2], epoch_samples=90).state_dict(consumed_batches=1)
    with pytest.raises(ValueError, match=r"weights: saved \[1.0, 2.0\], now \[2.0, 1.0\]"):
        make(two_sources(), weights=[2, 1], epoch_samples=90).load_state_dict(state)
    with pytest.raises(ValueError, match=r"epoch_samples: saved 90, now 91"):
        make(two_sources(), weights=[1, 2], epoch_samples=91).load_state_dict(state)


# ------------------------------------------------------------------ resume


@pytest.mark.parametrize("world", [1, 3])
def test_resume_at_the_same_size_equals_the_uninterrupted_pass(world: int) -> None:
    ds = WidthDataset()
    rng = np.random.default_rng(0)
    for rank in range(world):
        ref = make(ds, seed=2, rank=rank, world_size=world, scale_batch=True)
        ref.set_epoch(3)
        full = list(ref)
        for k in [0, len(full), *rng.integers(0, len(full), 4).tolist()]:
            state = json.loads(json.dumps(ref.state_dict(consumed_batches=k)))
            fresh = make(ds, seed=2, rank=rank, world_size=world, scale_batch=True)
            fresh.load_state_dict(state)
            assert fresh.start_batch == k
            fresh.set_epoch(3)  # the usual loop sets the epoch again: the position holds
            assert list(fresh) == full[k:]
            assert list(fresh) == full, "the resume offset is used once"
    tracked = make(ds, seed=2)
    it = iter(tracked)
    head = list(itertools.islice(it, 5))
    state = tracked.state_dict()
    assert state["position"] == 5
    fresh = make(ds, seed=2)
    fresh.load_state_dict(state)
    assert head + list(fresh) == list(make(ds, seed=2))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"buckets": 4}, "boundaries: saved"),
        ({"batch_size": 7}, "batch_sizes: saved"),
        ({"key": "height"}, "key: saved 'width', now 'height'"),
        ({"seed": 1}, "seed: saved 0, now 1"),
        ({"indices": np.arange(N) > 0}, "num_selected: saved 301, now 300"),
    ],
)
def test_state_with_other_parameters_is_refused(change: dict[str, Any], match: str) -> None:
    ds = WidthDataset()
    state = make(ds).state_dict(consumed_batches=2)
    with pytest.raises(ValueError, match=match):
        make(ds, **change).load_state_dict(state)
    with pytest.raises(ValueError, match="exceeds this rank's"):
        make(ds).state_dict(consumed_batches=10_000)


def test_errors_name_the_fix() -> None:
    ds = WidthDataset()
    with pytest.raises(ValueError, match="expected one of"):
        make(ds, key="area")

    class Bare:
        def __len__(self) -> int:
            return 10

    with pytest.raises(ValueError, match=r"needs width .* pass key=<an array"):
        make(Bare())
    ds.index.extra["width"][[3, 5]] = -1  # the index does not know them
    with pytest.raises(ValueError, match=r"2 selected samples have no width in the index \(ids"):
        make(ds)
    with pytest.raises(ValueError, match="one number per sample"):
        make(WidthDataset(), key=np.arange(3))


# ------------------------------------------------------------------ real datasets


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two packed datasets (LMDB, RecordIO) of text-line-like images, 12..200 pixels wide."""
    root = tmp_path_factory.mktemp("lines")
    rng = np.random.default_rng(7)
    out = {}
    for fmt, count in (("lmdb", 37), ("recordio", 23)):
        src = root / f"src-{fmt}"
        (src / "c").mkdir(parents=True)
        for i in range(count):
            w = int(rng.integers(12, 200))
            ok, buf = cv2.imencode(".png", rng.integers(0, 256, (16, w, 3), dtype=np.uint8))
            assert ok
            (src / "c" / f"{i:03d}.png").write_bytes(buf.tobytes())
        out[fmt] = build_packed(src, root / f"lines.{fmt}", fmt, shard_size=3000)
    return out


def width_of(image: np.ndarray) -> np.ndarray:
    return np.array([image.shape[1]], dtype=np.int64)


def test_widths_come_from_the_index_without_reading_records(
    lines: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = LmdbDataset(lines["lmdb"])
    truth = [ds[i][0].shape[1] for i in range(len(ds))]
    assert ds.index is not None
    assert "width" not in ds.index.extra, "encoded images: widths are not loaded by default"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the sampler read a record")

    monkeypatch.setattr(type(ds), "_read", refuse)
    monkeypatch.setattr(type(ds), "__getitem__", refuse)
    assert key_values(ds, "width").tolist() == truth
    s = BucketBatchSampler(ds, 4, buckets=3, seed=1, rank=0, world_size=1)
    assert sorted(i for b in s for i in b) == list(range(len(ds)))


def test_packed_datasets_and_a_concatenation_through_a_dataloader(lines: dict[str, Path]) -> None:
    paddle = pytest.importorskip("paddle")
    parts = [
        LmdbDataset(lines["lmdb"], transform=width_of),
        RecordIODataset(lines["recordio"], transform=width_of),
    ]
    cases = [(parts[0], None), (parts[1], None), (ConcatDataset(parts), [0, 37, 60])]
    for ds, offsets in cases:
        if offsets is not None:
            assert np.asarray(ds.offsets).tolist() == offsets
        widths = key_values(ds, "width")
        assert widths.size == len(ds)
        for world in (1, 2):
            seen: list[int] = []
            for rank in range(world):
                s = BucketBatchSampler(
                    ds, 5, buckets=4, scale_batch=True, seed=3, rank=rank, world_size=world
                )
                s.set_epoch(1)
                expected = list(s)
                loader = paddle.io.DataLoader(ds, batch_sampler=s, num_workers=2)
                assert len(loader) == len(expected)
                for ids, (got_w, _) in zip(expected, loader, strict=True):
                    got = got_w.numpy()[:, 0]
                    assert got.tolist() == widths[ids].tolist(), "decoded widths = the index's"
                    bucket = np.searchsorted(s.boundaries, got, side="right")
                    assert len(set(bucket.tolist())) == 1
                    seen += ids
            assert set(seen) == set(range(len(ds)))


def test_a_weighted_mixture_of_packed_datasets_through_a_dataloader(
    lines: dict[str, Path],
) -> None:
    """PaddleOCR's ratio_list with width buckets: each epoch buckets exactly 20 draws of the
    LMDB set and 40 of the RecordIO one (23 samples: some twice); decoded widths agree."""
    paddle = pytest.importorskip("paddle")
    ds = ConcatDataset(
        [
            LmdbDataset(lines["lmdb"], transform=width_of),
            RecordIODataset(lines["recordio"], transform=width_of),
        ]
    )
    widths = key_values(ds, "width")
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        for rank in range(2):
            s = BucketBatchSampler(
                ds, 5, buckets=3, seed=3, rank=rank, world_size=2, weights=[1, 2], epoch_samples=60
            )
            s.set_epoch(epoch)
            expected = list(s)
            loader = paddle.io.DataLoader(ds, batch_sampler=s, num_workers=2)
            assert len(loader) == len(expected) == len(s)
            for ids, (got_w, _) in zip(expected, loader, strict=True):
                got = got_w.numpy()[:, 0]
                assert got.tolist() == widths[ids].tolist()
                assert len(set(np.searchsorted(s.boundaries, got, side="right").tolist())) == 1
                seen.update(ids)
        flat = s.epoch_batches()[0]
        assert Counter(flat.tolist()) <= seen, "every draw of the epoch, padding aside"
        assert np.bincount(flat >= 37, minlength=2).tolist() == [20, 40]
        # 40 draws of 23 cover a whole pass: every one, some twice or three times
        assert set(flat[flat >= 37].tolist()) == set(range(37, 60))
