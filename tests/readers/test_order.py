"""readers.order: invariants of the pure order functions over seeds x epochs x ranks x workers."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from readers.order import (
    buffer_order,
    check_nonneg,
    chunk_order,
    chunk_ranges,
    loader_batches,
    rank_share,
    rank_span,
    sequential_runs,
    split_for_rank,
    worker_counts,
    worker_slice,
)

SEEDS = (0, 1, 12345)
EPOCHS = (0, 1, 7)
WORLD_SIZES = (1, 2, 3, 8)
LAYOUTS = {
    "one-shard": [0, 1000],
    "uneven-shards": [0, 5, 5, 300, 301, 777, 1000],  # with an empty and a 1-sample shard
    "n-below-world": [0, 2],
    "one-sample": [0, 1],
    "empty": [0],
}


def ref_chunks(bounds: list[int], chunk: int, ids: list[int] | None = None) -> list[list[int]]:
    """Reference chunking, written plainly: selected ids of each shard in groups of `chunk`."""
    selected = set(range(bounds[-1])) if ids is None else set(ids)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        members = [i for i in range(lo, hi) if i in selected]
        out += [members[k : k + chunk] for k in range(0, len(members), chunk)]
    return out


def round_robin(per_worker: list[list[Any]], batch_size: int, drop_last: bool) -> list[list[Any]]:
    """paddle's dispatch, written plainly: requests go to workers in a cycle that skips the
    ones that ran out; each worker batches its own items."""
    batches = [
        [items[s : s + batch_size] for s in range(0, len(items), batch_size)]
        for items in per_worker
    ]
    if drop_last:
        batches = [[b for b in bs if len(b) == batch_size] for bs in batches]
    out: list[list[Any]] = []
    alive = [True] * len(batches)
    w = 0
    while any(alive):
        if alive[w]:
            if batches[w]:
                out.append(batches[w].pop(0))
            else:
                alive[w] = False
        w = (w + 1) % len(batches)
    return out


# ------------------------------------------------------------------ pure order functions


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_invariants(layout: str, world: int, drop_last: bool) -> None:
    bounds = LAYOUTS[layout]
    n = bounds[-1]
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        order = chunk_order(bounds, chunk_size=16, window=4, seed=seed, epoch=epoch)
        assert sorted(order.tolist()) == list(range(n))
        again = chunk_order(bounds, chunk_size=16, window=4, seed=seed, epoch=epoch)
        np.testing.assert_array_equal(order, again)

        shares = [
            split_for_rank(order, rank=r, world_size=world, drop_last=drop_last)
            for r in range(world)
        ]
        assert len({s.size for s in shares}) == 1, "every rank gets the same count"
        union = np.concatenate(shares).tolist()
        if drop_last:
            assert len(union) == n // world * world
            assert len(set(union)) == len(union)
            assert set(union) <= set(range(n))
        else:
            padded = -(-n // world) * world
            assert len(union) == padded
            assert set(union) == set(range(n))
            extra = sum(c - 1 for c in Counter(union).values())
            assert extra == padded - n
        # contiguous slices of the global order (padding cycles from its start)
        if n:
            np.testing.assert_array_equal(np.concatenate(shares), np.resize(order, len(union)))


@pytest.mark.parametrize("layout", ["one-shard", "uneven-shards"])
def test_orders_differ_across_epochs_and_seeds(layout: str) -> None:
    bounds = LAYOUTS[layout]
    orders = {
        (seed, epoch): chunk_order(bounds, chunk_size=16, window=4, seed=seed, epoch=epoch)
        for seed, epoch in itertools.product(SEEDS, EPOCHS)
    }
    as_tuples = {tuple(o.tolist()) for o in orders.values()}
    assert len(as_tuples) == len(orders)


def assert_concatenated_chunks(order: np.ndarray, chunks: list[list[int]]) -> None:
    """`order` is the chunks, each kept whole and ascending, in some order."""
    by_first = {c[0]: c for c in chunks}
    pos, seen = 0, []
    values = order.tolist()
    while pos < len(values):
        chunk = by_first.get(values[pos])
        assert chunk is not None, f"position {pos}: id {values[pos]} does not start a chunk"
        assert values[pos : pos + len(chunk)] == chunk
        seen.append(chunk[0])
        pos += len(chunk)
    assert sorted(seen) == sorted(by_first)


@pytest.mark.parametrize("layout", ["one-shard", "uneven-shards", "n-below-world", "empty"])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_window_zero_keeps_chunks_whole_and_inside_shards(layout: str, chunk: int) -> None:
    bounds = LAYOUTS[layout]
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        order = chunk_order(bounds, chunk_size=chunk, window=0, seed=seed, epoch=epoch)
        assert_concatenated_chunks(order, ref_chunks(bounds, chunk))


def test_chunks_over_a_subset_stay_inside_shards() -> None:
    bounds = LAYOUTS["uneven-shards"]
    ids = sorted(np.random.default_rng(3).choice(1000, size=400, replace=False).tolist())
    for seed in SEEDS:
        order = chunk_order(bounds, chunk_size=9, window=0, seed=seed, epoch=2, ids=ids)
        assert_concatenated_chunks(order, ref_chunks(bounds, 9, ids))
        lo, hi = chunk_ranges(bounds, chunk_size=9, ids=ids)
        expected = [(c[0], c[-1] + 1) for c in ref_chunks(bounds, 9, ids)]
        assert list(zip(lo.tolist(), hi.tolist(), strict=True)) == expected


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("layout", ["one-shard", "uneven-shards"])
def test_window_bounds_distance_from_chunk_order(layout: str, window: int) -> None:
    bounds, chunk = LAYOUTS[layout], 10
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        before = chunk_order(bounds, chunk_size=chunk, window=0, seed=seed, epoch=epoch)
        after = chunk_order(bounds, chunk_size=chunk, window=window, seed=seed, epoch=epoch)
        assert not np.array_equal(before, after), "the window shuffle moved nothing"
        pos_before = np.empty_like(before)
        pos_before[before] = np.arange(before.size)
        pos_after = np.empty_like(after)
        pos_after[after] = np.arange(after.size)
        assert int(np.abs(pos_after - pos_before).max()) < window * chunk


def test_window_mixes_exactly_blocks_of_chunks() -> None:
    # One shard of full chunks: block k is exactly positions [k*w*c, (k+1)*w*c).
    chunk, window, n = 8, 4, 8 * 4 * 10
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        before = chunk_order(n, chunk_size=chunk, window=0, seed=seed, epoch=epoch)
        after = chunk_order(n, chunk_size=chunk, window=window, seed=seed, epoch=epoch)
        width = chunk * window
        for k in range(0, n, width):
            assert set(after[k : k + width].tolist()) == set(before[k : k + width].tolist())
            # mixed across chunks: the first `chunk` samples of a block are not one chunk
            assert len({i // chunk for i in after[k : k + chunk].tolist()}) > 1


def test_no_shuffle_is_ascending() -> None:
    bounds = LAYOUTS["uneven-shards"]
    order = chunk_order(bounds, chunk_size=16, window=4, seed=3, epoch=3, shuffle=False)
    assert order.tolist() == list(range(1000))
    ids = [3, 5, 400, 999]
    order = chunk_order(bounds, chunk_size=2, window=1, seed=0, epoch=0, shuffle=False, ids=ids)
    assert order.tolist() == ids


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    chunk=st.integers(1, 12),
    window=st.integers(0, 5),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 100),
    keep=st.floats(0.0, 1.0),
)
def test_order_properties_random_layouts(
    sizes: list[int], chunk: int, window: int, seed: int, epoch: int, keep: float
) -> None:
    bounds = [0, *itertools.accumulate(sizes)]
    n = bounds[-1]
    rng = np.random.default_rng(seed)
    ids = np.flatnonzero(rng.random(n) < keep)
    order = chunk_order(bounds, chunk_size=chunk, window=window, seed=seed, epoch=epoch, ids=ids)
    assert sorted(order.tolist()) == ids.tolist()
    before = chunk_order(bounds, chunk_size=chunk, window=0, seed=seed, epoch=epoch, ids=ids)
    assert_concatenated_chunks(before, ref_chunks(bounds, chunk, ids.tolist()))
    where = {v: p for p, v in enumerate(before.tolist())}
    for p, v in enumerate(order.tolist()):
        assert abs(p - where[v]) < max(window, 1) * chunk


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
        ({"window": -1}, "window must be an integer >= 0"),
        ({"seed": -5}, "seed must be an integer >= 0"),
        ({"epoch": -1}, "epoch must be an integer >= 0"),
        ({"bounds": [0, 5, 3]}, "never decrease"),
        ({"bounds": [1, 5]}, "start at 0"),
        ({"ids": [3, 2]}, "strictly increasing"),
        ({"ids": [3, 10]}, r"ids must lie in \[0, 10\)"),
    ],
)
def test_chunk_order_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"bounds": [0, 10], "chunk_size": 4, "window": 2, "seed": 0, "epoch": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        chunk_order(args.pop("bounds"), **args)


# ------------------------------------------------------------------ pure functions


def reference_buffer(m: int, buffer: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, buffer, size=m - buffer) if m > buffer else np.zeros(0, np.int64)
    slots: list[int] = []
    out = []
    for t in range(m):
        if t < buffer:
            slots.append(t)
        else:
            j = int(draws[t - buffer])
            out.append(slots[j])
            slots[j] = t
    return out + [slots[j] for j in rng.permutation(len(slots))]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_buffer_order_is_the_plain_shuffle_buffer(m: int, buffer: int, seed: int) -> None:
    order = buffer_order(m, buffer=buffer, rng=np.random.default_rng(seed))
    assert order.tolist() == reference_buffer(m, buffer, seed)
    assert np.all(order < np.arange(m) + buffer)  # emitted only once read: bounded memory


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=5),
    st.integers(1, 9),
    st.booleans(),
)
def test_loader_batches_is_paddles_round_robin(
    counts: list[int], batch_size: int, drop_last: bool
) -> None:
    worker, _, size = loader_batches(counts, batch_size=batch_size, drop_last=drop_last)
    items = [[(w, i) for i in range(c)] for w, c in enumerate(counts)]
    expected = round_robin(items, batch_size, drop_last)
    assert worker.tolist() == [b[0][0] for b in expected]
    assert size.tolist() == [len(b) for b in expected]


def test_worker_counts_split_evenly() -> None:
    assert worker_counts(10, 0).tolist() == [10]
    assert worker_counts(10, 3).tolist() == [4, 3, 3]
    assert worker_counts(2, 4).tolist() == [1, 1, 0, 0]


# ------------------------------------------------------------------ ranks and workers together


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("layout", ["one-shard", "uneven-shards", "n-below-world", "empty"])
def test_rank_then_worker_split_is_a_disjoint_cover(layout: str, drop_last: bool) -> None:
    bounds = LAYOUTS[layout]
    n = bounds[-1]
    for seed, epoch, world in itertools.product(SEEDS, EPOCHS, WORLD_SIZES):
        order = chunk_order(bounds, chunk_size=8, window=2, seed=seed, epoch=epoch)
        shares = []
        for rank in range(world):
            kw: dict[str, Any] = {"rank": rank, "world_size": world, "drop_last": drop_last}
            share = rank_share(bounds, chunk_size=8, window=2, seed=seed, epoch=epoch, **kw)
            np.testing.assert_array_equal(share, split_for_rank(order, **kw))
            start, stop = rank_span(n, **kw)
            assert share.size == stop - start
            shares.append(share)
            for num_workers in (0, 1, 2, 5):
                spans = [
                    share[worker_slice(share.size, worker=w, num_workers=num_workers)]
                    for w in range(max(num_workers, 1))
                ]
                # contiguous, in order, nothing lost or repeated
                np.testing.assert_array_equal(np.concatenate(spans), share)
                sizes = [s.size for s in spans]
                assert sizes == worker_counts(share.size, num_workers).tolist()
                assert max(sizes) - min(sizes) <= 1
        union = Counter(np.concatenate(shares).tolist())
        if drop_last:
            assert max(union.values(), default=1) == 1
            assert sum(union.values()) == n // world * world
        else:
            assert set(union) == set(range(n))
            assert sum(union.values()) == -(-n // world) * world


def test_worker_slice_rejects_a_worker_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"need 0 <= worker < 3, got 3"):
        worker_slice(10, worker=3, num_workers=3)
    with pytest.raises(ValueError, match="rank < world_size"):
        rank_span(10, rank=2, world_size=2, drop_last=False)
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        worker_counts(-1, 2)
    with pytest.raises(ValueError, match="flag must be an integer >= 0"):
        check_nonneg("flag", True)  # type: ignore[arg-type]


@pytest.mark.parametrize("buffer", [1, 2, 16, 64])
def test_buffer_order_is_a_deterministic_bounded_permutation(buffer: int) -> None:
    for seed, epoch, m in itertools.product(SEEDS, EPOCHS, (0, 1, 15, 16, 17, 200)):
        key = [seed, epoch, 0, 1]  # as ShardStream seeds a worker: (seed, epoch, rank, worker)
        first = buffer_order(m, buffer=buffer, rng=np.random.default_rng(key))
        again = buffer_order(m, buffer=buffer, rng=np.random.default_rng(key))
        assert sorted(first.tolist()) == list(range(m))
        np.testing.assert_array_equal(first, again)
        assert np.all(first < np.arange(m) + buffer)
        if buffer == 1:
            assert first.tolist() == list(range(m))


def test_sequential_runs_split_at_gaps_and_chunk_starts() -> None:
    lo, _ = chunk_ranges([0, 10, 20], chunk_size=4)  # chunks start at 0 4 8 10 14 18
    ids = np.array([1, 2, 3, 4, 5, 9, 10, 11, 7, 12], dtype=np.int64)
    run, last = sequential_runs(ids, lo)
    # runs: [1 2 3] | [4 5] | [9] | [10 11] | [7] | [12]
    assert run.tolist() == [0, 0, 0, 1, 1, 2, 3, 3, 4, 5]
    assert last.tolist() == [2, 4, 5, 7, 8, 9]
    empty_run, empty_last = sequential_runs(np.zeros(0, dtype=np.int64), lo)
    assert empty_run.size == empty_last.size == 0
