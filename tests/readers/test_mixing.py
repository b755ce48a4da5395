"""readers.mixing: invariants of weighted mixing over seeds x epochs x world sizes x weights."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from readers.mixing import (
    MixSource,
    check_weights,
    draws,
    epoch_draws,
    mix_counts,
    pass_order,
    rank_share,
)
from readers.mixture import Mixture
from readers.order import split_for_rank
from tests.readers.test_order import EPOCHS, SEEDS, WORLD_SIZES

# Per-source shard bounds (local ids): uneven shards, a source smaller than one chunk, a
# one-sample source.
LAYOUTS = {
    "two": [[0, 50, 100], [0, 30]],
    "three": [[0, 7], [0, 200, 200, 333], [0, 1]],
}
WEIGHTS = {
    "two": [(1, 1), (1, 3), (0.3, 0.7), (5, 0.01)],
    "three": [(1, 1, 1), (2, 1, 7), (0.1, 0.1, 0.8)],
}
CHUNK = 16


def make_sources(layout: str, selections: list[Any] | None = None) -> tuple[MixSource, ...]:
    out, offset = [], 0
    for k, b in enumerate(LAYOUTS[layout]):
        bounds = np.asarray(b, dtype=np.int64)
        ids = None if selections is None else selections[k]
        out.append(MixSource(bounds, ids, CHUNK + 3 * k, offset))
        offset += int(bounds[-1])
    return tuple(out)


def source_of(sources: tuple[MixSource, ...], ids: np.ndarray) -> np.ndarray:
    offsets = np.array([s.offset for s in sources])
    return np.searchsorted(offsets, ids, side="right") - 1


def cases() -> list[tuple[str, tuple[float, ...], int]]:
    """(layout, weights, epoch_samples): the default N, fewer, and many more than the sizes."""
    out = []
    for layout, ws in WEIGHTS.items():
        total = sum(b[-1] for b in LAYOUTS[layout])
        for w, n in itertools.product(ws, (total, 37, 3 * total + 1)):
            out.append((layout, tuple(float(x) for x in w), n))
    return out


# ------------------------------------------------------------------ counts


def ref_largest_remainder(n: int, weights: list[float]) -> list[int]:
    """Hamilton's method, written plainly in exact fractions."""
    quotas = [Fraction(n) * Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
    counts = [int(q) for q in quotas]
    rest = sorted(range(len(weights)), key=lambda i: (counts[i] - quotas[i], i))
    for i in rest[: n - sum(counts)]:
        counts[i] += 1
    return counts


@pytest.mark.parametrize("weights", [(1, 1, 1), (0.3, 0.7), (1, 2), (5, 0.01, 3), (1e-9, 1)])
def test_counts_are_exact_largest_remainder(weights: tuple[float, ...]) -> None:
    for n in (0, 1, 2, 3, 7, 10, 99, 1000, 12345):
        counts = mix_counts(n, weights)
        assert counts.sum() == n
        assert counts.tolist() == ref_largest_remainder(n, list(weights))
        quota = np.array(weights) * n / sum(weights)
        assert np.all(counts >= np.floor(quota) - 1e-9)
        assert np.all(counts <= np.ceil(quota) + 1e-9)
    assert mix_counts(10, (1, 1, 1)).tolist() == [4, 3, 3]  # the tie goes to the lower source
    assert mix_counts(1000, (0.3, 0.7)).tolist() == [300, 700]


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ((1, 0), r"weights\[1\] is 0; every weight must be a finite number > 0"),
        ((1, -2), r"weights\[1\] is -2"),
        ((float("nan"), 1), r"weights\[0\] is nan"),
        ((1, float("inf")), r"weights\[1\] is inf"),
        ((1, "2"), r"weights\[1\] is '2'"),
        ((True, 1), r"weights\[0\] is True"),
        ((1, 2, 3), r"one entry per source \(2 sources\), got 3"),
        ((1,), r"one entry per source \(2 sources\), got 1"),
        (1.0, r"one entry per source \(2 sources\), got a single value"),
    ],
)
def test_bad_weights_are_clear_errors(weights: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_weights(weights, 2)
    with pytest.raises(ValueError, match=match):
        Mixture(make_sources("two"), weights, 100)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epoch_samples": 0}, r"epoch_samples must be an integer >= 1, got 0"),
        ({"epoch_samples": -5}, r"epoch_samples must be an integer >= 1"),
        ({"mix": "sample"}, r"mix='sample': expected 'epoch' or 'batch'"),
        ({"mix": "batch"}, r"mix='batch' .* needs the batch size"),
        ({"mix": "batch", "batch_size": 8, "epoch_samples": 7}, r"less than one batch of 8"),
        (
            {"mix": "batch", "batch_size": 4, "weights": (1, 100)},
            r"give source 0 no sample in a batch of 4 \(per-batch counts \[0, 4\]\)",
        ),
    ],
)
def test_bad_mixture_parameters_are_clear_errors(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"weights": (1, 1), "epoch_samples": 100} | kwargs
    with pytest.raises(ValueError, match=match):
        Mixture(make_sources("two"), **args)


def test_a_source_without_selected_samples_is_refused() -> None:
    sources = make_sources("two", [np.zeros(0, dtype=np.int64), None])
    with pytest.raises(ValueError, match="source 0 has no selected samples, but weights"):
        Mixture(sources, (1, 1), 10)


# ------------------------------------------------------------------ epoch orders


@pytest.mark.parametrize(("layout", "weights", "n"), cases())
def test_exact_counts_determinism_and_rank_split(
    layout: str, weights: tuple[float, ...], n: int
) -> None:
    sources = make_sources(layout)
    mixture = Mixture(sources, weights, n)
    want = mix_counts(n, weights)
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        order = mixture.order(epoch, window=4, seed=seed)
        assert order.size == n
        got = np.bincount(source_of(sources, order), minlength=len(sources))
        assert got.tolist() == want.tolist(), "each source gives exactly its count"
        np.testing.assert_array_equal(order, mixture.order(epoch, window=4, seed=seed))
        for world, drop_last in itertools.product(WORLD_SIZES, (False, True)):
            shares = [
                rank_share(order, rank=r, world_size=world, drop_last=drop_last)
                for r in range(world)
            ]
            assert len({s.size for s in shares}) == 1
            assert shares[0].size == mixture.rank_length(world_size=world, drop_last=drop_last)
            for r, share in enumerate(shares):
                ref = split_for_rank(order, rank=r, world_size=world, drop_last=drop_last)
                np.testing.assert_array_equal(share, ref)
            # positions of one global order: disjoint slices (padding cycles from its start)
            joined = np.concatenate(shares)
            if drop_last:
                np.testing.assert_array_equal(joined, order[: joined.size])
            else:
                np.testing.assert_array_equal(joined, np.resize(order, joined.size))


@pytest.mark.parametrize(("layout", "weights", "n"), cases())
def test_passes_continue_across_epochs_without_replacement(
    layout: str, weights: tuple[float, ...], n: int
) -> None:
    """Source i's draws of epochs 0, 1, 2, ... are one sequence of whole passes: every sample
    seen once before any twice, and epoch e computed alone equals its slice of the sequence."""
    sources = make_sources(layout)
    counts = mix_counts(n, weights)
    for seed in SEEDS:
        for i, src in enumerate(sources):
            c, m = int(counts[i]), src.size
            per_epoch = [
                draws(src, count=c, seed=seed, source=i, epoch=e, shuffle=True)[0] for e in range(4)
            ]
            seq = np.concatenate(per_epoch)
            for p in range(seq.size // m):
                one_pass = seq[p * m : (p + 1) * m]
                assert sorted(one_pass.tolist()) == list(range(m)), "a pass is a permutation"
                ref = pass_order(src, seed=seed, source=i, pass_=p, shuffle=True)
                np.testing.assert_array_equal(one_pass, ref)
            tail = seq[seq.size // m * m :]
            assert len(set(tail.tolist())) == tail.size, "a partial pass repeats nothing"
            # the mixed epoch order holds exactly these draws of each source
            for e in (0, 3):
                order = Mixture(sources, weights, n).order(e, window=4, seed=seed)
                mine = np.sort(order[source_of(sources, order) == i]) - src.offset
                np.testing.assert_array_equal(mine, np.sort(per_epoch[e]))


@pytest.mark.parametrize(("layout", "weights", "n"), cases())
def test_epoch_draws_are_the_draws_grouped_by_source_and_pass(
    layout: str, weights: tuple[float, ...], n: int
) -> None:
    """What the bucket sampler chunks: each source's draws of the epoch, pass by pass, ids
    ascending inside a pass (so a sample drawn in two passes sits in two places)."""
    sources = make_sources(layout)
    counts = mix_counts(n, weights)
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        got = epoch_draws(sources, counts, seed=seed, epoch=epoch)
        pos = 0
        for i, (src, c) in enumerate(zip(sources, counts.tolist(), strict=True)):
            mine = got[pos : pos + c] - src.offset
            pos += c
            ids, _ = draws(src, count=c, seed=seed, source=i, epoch=epoch, shuffle=True)
            first, m = epoch * c, src.size
            expected = []
            for p in range(first // m, (first + c - 1) // m + 1) if c else []:
                taken = ids[max(p * m - first, 0) : min((p + 1) * m - first, c)]
                expected += sorted(taken.tolist())
            assert mine.tolist() == expected
        assert pos == got.size == n


def test_passes_differ_per_source_and_epoch() -> None:
    sources = (MixSource(np.array([0, 64]), None, 8, 0), MixSource(np.array([0, 64]), None, 8, 64))
    a = pass_order(sources[0], seed=1, source=0, pass_=0, shuffle=True)
    b = pass_order(sources[1], seed=1, source=1, pass_=0, shuffle=True)
    assert a.tolist() != b.tolist(), "equal layouts, different sources: different orders"
    m = Mixture(sources, (1, 1), 128)
    orders = {(s, e): tuple(m.order(e, window=2, seed=s).tolist()) for s in SEEDS for e in EPOCHS}
    assert len(set(orders.values())) == len(orders)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_segments_are_chunk_pieces_and_the_window_only_mixes_inside_blocks(layout: str) -> None:
    sources = make_sources(layout)
    weights = WEIGHTS[layout][1]
    n = 2 * sum(s.size for s in sources) + 5
    m = Mixture(sources, weights, n)
    lo = np.concatenate([s.chunk_lo() + s.offset for s in sources])
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        plain = m.order(epoch, window=0, seed=seed)
        # window 0: runs of consecutive ascending ids inside one chunk of one source
        chunk = np.searchsorted(lo, plain, side="right")
        breaks = (plain[1:] != plain[:-1] + 1) | (chunk[1:] != chunk[:-1])
        runs = int(breaks.sum()) + 1
        segments = sum(
            int(draws(s, count=int(c), seed=seed, source=i, epoch=epoch, shuffle=True)[1].sum())
            for i, (s, c) in enumerate(zip(sources, m.counts, strict=True))
        )
        assert runs <= segments, "every segment is read sequentially"
        # window 4: the same samples, shuffled inside blocks of segments
        mixed = m.order(epoch, window=4, seed=seed)
        assert sorted(mixed.tolist()) == sorted(plain.tolist())
        assert mixed.tolist() != plain.tolist()


@pytest.mark.parametrize(("layout", "weights", "n"), cases())
def test_proportions_hold_over_every_stretch_of_the_epoch(
    layout: str, weights: tuple[float, ...], n: int
) -> None:
    sources = make_sources(layout)
    m = Mixture(sources, weights, n)
    counts = m.counts
    chunk = max(s.chunk_size for s in sources)
    for seed in SEEDS:
        order = m.order(3, window=0, seed=seed)
        member = source_of(sources, order)
        for i, c in enumerate(counts.tolist()):
            so_far = np.cumsum(member == i)
            expected = np.arange(1, n + 1) * c / n
            # evenly spread segments: off by at most a few segments of any source
            assert np.max(np.abs(so_far - expected)) <= 3 * chunk * len(sources)


def test_shuffle_false_reads_passes_in_id_order() -> None:
    sources = make_sources("two")
    m = Mixture(sources, (1, 1), 130)
    order = m.order(0, window=4, seed=0, shuffle=False)
    first = order[source_of(sources, order) == 0]
    assert first.tolist() == list(range(65))
    src1 = order[source_of(sources, order) == 1] - sources[1].offset
    assert src1.tolist() == [*range(30), *range(30), *range(5)]
    second = m.order(1, window=4, seed=0, shuffle=False)
    src1 = second[source_of(sources, second) == 1] - sources[1].offset
    assert src1.tolist() == [*range(5, 30), *range(30), *range(10)], "epoch 1 goes on from 0"


def test_selected_ids_only() -> None:
    sel = [np.arange(0, 100, 3, dtype=np.int64), np.array([2, 5, 7], dtype=np.int64)]
    sources = make_sources("two", sel)
    m = Mixture(sources, (1, 1), 40)
    for epoch in EPOCHS:
        order = m.order(epoch, window=2, seed=4)
        assert set(order[order < 100].tolist()) <= set(sel[0].tolist())
        assert set((order[order >= 100] - 100).tolist()) == {2, 5, 7}
        assert (order >= 100).sum() == 20


# ------------------------------------------------------------------ mix="batch"


@pytest.mark.parametrize("batch_size", [4, 10, 33])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_mix_gives_every_batch_the_counts(layout: str, batch_size: int) -> None:
    sources = make_sources(layout)
    for weights in WEIGHTS[layout]:
        comp = mix_counts(batch_size, weights)
        if np.any(comp == 0):
            continue
        n = 5 * batch_size + 3
        m = Mixture(sources, weights, n, "batch", batch_size)
        assert m.num_ordered == 5 * batch_size
        assert m.counts.tolist() == (comp * 5).tolist()
        for seed, epoch in itertools.product(SEEDS, EPOCHS):
            order = m.order(epoch, window=3, seed=seed)
            member = source_of(sources, order).reshape(-1, batch_size)
            for row in member:
                assert np.bincount(row, minlength=len(sources)).tolist() == comp.tolist()
            for world, drop_last in itertools.product(WORLD_SIZES, (False, True)):
                shares = [
                    rank_share(
                        order, rank=r, world_size=world, drop_last=drop_last, batch_size=batch_size
                    )
                    for r in range(world)
                ]
                size = m.rank_length(world_size=world, drop_last=drop_last)
                assert {s.size for s in shares} == {size}
                assert size % batch_size == 0, "ranks get whole batches"
                for share in shares:
                    rows = source_of(sources, share).reshape(-1, batch_size)
                    for row in rows:
                        assert np.bincount(row, minlength=len(sources)).tolist() == comp.tolist()
                joined = np.concatenate(shares)
                ref = order[: joined.size] if drop_last else np.resize(order, joined.size)
                np.testing.assert_array_equal(joined, ref)
