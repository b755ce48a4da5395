"""readers.readahead: the sequential-read detector (pure logic), coalescing, hints in pieces,
and on real packed datasets: hints for sequential reads, none for random reads."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from readers.readahead import (
    SequentialDetector,
    coalesce,
    detector_for,
    hint_piece,
    willneed,
)


def run(detector: SequentialDetector, ids: Iterable[int]) -> list[tuple[int, int, int]]:
    """``(position, start, stop)`` of every hint while reading `ids` in order."""
    out = []
    for pos, i in enumerate(ids):
        found = detector.observe(i)
        if found is not None:
            out.append((pos, *found))
    return out


def hinted_ids(hints: list[tuple[int, int, int]]) -> set[int]:
    return {i for _, a, b in hints for i in range(a, b)}


def small() -> SequentialDetector:
    return SequentialDetector(first_window=8, max_window=64, max_gap=200)


# ------------------------------------------------------------------ the detector


def test_sequential_reads_are_hinted_ahead_in_growing_windows() -> None:
    d = small()
    hints = run(d, range(2000))
    assert hints[0] == (3, 4, 12)  # the third step of 1 triggers; the first window follows
    sizes = [b - a for _, a, b in hints]
    assert sizes[:3] == [8, 16, 32]  # doubling ...
    assert max(sizes) <= 64
    assert min(sizes[3:]) >= 32
    for (_, _, stop), (_, start, _) in itertools.pairwise(hints):
        assert start == stop  # contiguous, never the same ids twice
    assert hinted_ids(hints) == set(range(4, hints[-1][2]))
    for pos, start, stop in hints:
        assert start > pos
        assert stop - (pos + 1) <= 64
    # every read after the first few finds its id hinted earlier
    first_hint_of = {i: pos for pos, a, b in hints for i in range(a, b)}
    assert all(first_hint_of[i] < i for i in range(4, 2000))


def test_hints_keep_ahead_until_the_end_of_a_long_run() -> None:
    d = small()
    hints = run(d, range(100_000))
    assert hints[-1][2] >= 100_000 - 1  # reached the end
    assert len(hints) < 100_000 / 32 + 10  # one hint per half window at most


@pytest.mark.parametrize("seed", range(5))
def test_random_order_is_never_hinted(seed: int) -> None:
    ids = np.random.default_rng(seed).permutation(100_000)
    d = detector_for(5_000.0)  # the defaults: 5 KB records
    assert run(d, ids.tolist()) == []


@pytest.mark.parametrize("seed", range(3))
def test_random_order_of_a_small_dataset_is_hardly_hinted(seed: int) -> None:
    ids = np.random.default_rng(seed).permutation(8_813).tolist()
    hints = run(detector_for(5_400.0), ids * 3)
    assert len(hints) <= 1


@pytest.mark.parametrize(("workers", "world"), [(1, 1), (2, 1), (4, 1), (2, 4)])
def test_each_worker_of_a_batched_pass_is_detected(workers: int, world: int) -> None:
    """paddle's BatchSampler (or one rank of DistributedBatchSampler) with workers: worker w
    reads batches w, w + workers, ... of its rank's share."""
    batch, n = 64, 40_000
    batches = [list(range(s, min(n, s + batch))) for s in range(0, n, batch)]
    rank_batches = batches[0::world]
    mine = [i for b in rank_batches[0::workers] for i in b]
    d = SequentialDetector(first_window=100, max_window=6_000, max_gap=1_600)
    hints = run(d, mine)
    covered = hinted_ids(hints)
    late = [i for i in mine[batch:] if i not in covered]
    # while the window grows to the stride, a few batches start before their hint
    assert set(late) <= set(mine[: 4 * batch : batch]), f"not hinted: {late}"
    # what the hints read that no worker of this rank reads: only the other ranks' batches
    rank_ids = {i for b in rank_batches for i in b}
    if world == 1:
        assert covered <= set(range(n + 6_000))
        assert len(covered - rank_ids) <= 6_000  # at most one window past the end
    else:
        assert len(covered) <= n + 6_000


def test_a_backward_jump_resets_and_a_new_run_is_detected() -> None:
    d = small()
    first = run(d, range(500))
    assert first
    hints = run(d, [0, 1, 2, 3, 4, 5])  # a new epoch
    assert hints == [(3, 4, 12)]  # starts again with the first window
    assert d.window == 8


def test_a_long_forward_jump_resets() -> None:
    d = small()
    run(d, range(100))
    assert d.observe(100 + 500) is None  # beyond max_gap: the run ends
    assert d.streak == 0
    assert d.frontier == 0
    assert [h[1:] for h in run(d, range(601, 605))] == [(604, 612)]  # 3 steps from 600


def test_forward_gaps_keep_a_run_but_do_not_count_toward_it() -> None:
    d = small()
    ids = [0, 50, 100, 150, 200, 250]  # strided: every 50th sample
    assert run(d, ids) == []  # hinting everything in between would read 50x too much
    assert d.observe(251) is None
    assert d.observe(252) is None
    assert d.observe(253) == (254, 262)


def test_rereading_a_sample_changes_nothing() -> None:
    d = small()
    assert run(d, [0, 0, 1, 1, 2, 2, 3, 3]) == [(6, 4, 12)]


def test_reads_that_overtake_the_hints_restart_from_the_read_position() -> None:
    d = small()
    run(d, range(5))  # hinted up to 12
    assert d.observe(5 + 100) == (106, 122)  # a jump within max_gap past the hints: the
    assert d.window == 16  # window was too short for this pattern, so it grows


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="first_window"):
        SequentialDetector(first_window=10, max_window=5, max_gap=10)
    with pytest.raises(ValueError, match="max_gap"):
        SequentialDetector(first_window=1, max_window=5, max_gap=1, near=2)


def test_detector_windows_follow_the_record_size() -> None:
    d = detector_for(5_000.0)
    assert d.first_window == (512 << 10) // 5_000
    assert d.max_window == (32 << 20) // 5_000
    big = detector_for(10e6)  # 10 MB records: still a few ids
    assert big.first_window >= 8
    assert big.max_gap >= 64


# ------------------------------------------------------------------ coalesce and willneed


def test_coalesce_merges_near_ranges_and_sorts() -> None:
    begin = np.array([1000, 0, 5000, 100_000, 2000])
    end = np.array([1500, 900, 6000, 100_100, 4000])
    assert coalesce(begin, end, gap=2000) == [(0, 6000), (100_000, 100_100)]
    assert coalesce(begin, end, gap=0) == [
        (0, 900),
        (1000, 1500),
        (2000, 4000),
        (5000, 6000),
        (100_000, 100_100),
    ]
    assert coalesce(np.array([]), np.array([])) == []
    nested = coalesce(np.array([0, 10]), np.array([100, 20]), gap=0)
    assert nested == [(0, 100)]


def test_willneed_splits_a_range_into_pieces_the_kernel_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(10 << 20))
    piece = hint_piece(str(path))
    assert (128 << 10) <= piece <= (2 << 20)
    calls: list[tuple[int, int]] = []

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        os.posix_fadvise(fd, offset, length, advice)
        calls.append((offset, length))

    n = willneed(str(path), 1000, (10 << 20) - 5, advise=advise)
    assert n == len(calls) == -(-((10 << 20) - 1005) // piece)
    assert calls[0][0] == 1000
    assert all(length <= piece for _, length in calls)
    assert sum(length for _, length in calls) == (10 << 20) - 1005
    ends = [o + length for o, length in calls]
    assert [o for o, _ in calls[1:]] == ends[:-1]
    assert willneed(str(path), 50, 50, advise=advise) == 0


# ------------------------------------------------------------------ real datasets


def batches_of(ids: list[int], size: int) -> Iterator[list[int]]:
    for s in range(0, len(ids), size):
        yield ids[s : s + size]


def _count_prefetch(ds: Any) -> list[tuple[int, int]]:
    """Record the dataset's real prefetch calls (they still go to the OS)."""
    log: list[tuple[int, int]] = []
    real = ds.prefetch

    def logged(start: int, stop: int) -> None:
        log.append((start, stop))
        real(start, stop)

    ds.prefetch = logged
    return log
