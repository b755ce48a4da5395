"""readers.readahead: the sequential-read detector (pure logic), coalescing, hints in pieces,
and on real packed datasets: hints for sequential reads, none for random reads."""

from __future__ import annotations

import ctypes
import itertools
import mmap
import multiprocessing
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from readers import open_dataset
from readers.formats import FORMATS
from readers.io import handles
from readers.io.hints import ids_within_bytes
from readers.io.readahead import (
    FIRST_WINDOW_BYTES,
    FileAhead,
    Readahead,
    SequentialDetector,
    coalesce,
    hint_piece,
    make_detector,
    one_at_a_time,
    willneed,
)
from tests.conftest import build_packed, encode, make_image


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
    d = make_detector(5_000.0)  # the defaults: 5 KB records
    assert run(d, ids.tolist()) == []


@pytest.mark.parametrize("seed", range(3))
def test_random_order_of_a_small_dataset_is_hardly_hinted(seed: int) -> None:
    ids = np.random.default_rng(seed).permutation(8_813).tolist()
    hints = run(make_detector(5_400.0), ids * 3)
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
    d = make_detector(5_000.0)
    assert d.first_window == FIRST_WINDOW_BYTES // 5_000
    assert d.max_window == (32 << 20) // 5_000
    big = make_detector(10e6)  # 10 MB records: still a few ids
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

    begin, end = piece + 1000, (10 << 20) - 5
    n = willneed(str(path), begin, end, advise=advise)
    assert n == len(calls) == len(range(begin // piece, (end - 1) // piece + 1))
    assert calls[0] == (begin, piece - 1000)  # up to the next multiple of the piece size
    assert all(offset % piece == 0 for offset, _ in calls[1:])  # then aligned pieces
    assert all(length <= piece for _, length in calls)
    assert sum(length for _, length in calls) == end - begin
    ends = [o + length for o, length in calls]
    assert [o for o, _ in calls[1:]] == ends[:-1]
    calls.clear()  # a range of one piece or less goes out whole, even across a boundary
    assert willneed(str(path), piece - 100, 2 * piece - 200, advise=advise) == 1
    assert calls == [(piece - 100, piece - 100)]
    assert willneed(str(path), 50, 50, advise=advise) == 0


def _hint_and_report(path: str, out: Any) -> None:
    """Child: send one hint and report when its fadvise call ran."""

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        out.put(time.monotonic())

    willneed(path, 0, 4096, advise=advise)


def test_hints_to_one_file_go_out_one_at_a_time_across_processes(tmp_path: Path) -> None:
    # Two workers hinting the same range at once insert its pages in turns and split each
    # other's disk requests to record size; a hint waits while another process holds the
    # file's hint lock. The child is forked while this thread holds the in-process lock too,
    # so the child must not inherit that lock held.
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 16))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    with one_at_a_time(handles.shared_fd(str(path))):
        child = ctx.Process(target=_hint_and_report, args=(str(path), out))
        child.start()
        time.sleep(0.5)
        released = time.monotonic()
    called = out.get(timeout=20)
    child.join(30)
    assert child.exitcode == 0
    assert called >= released

    # Released: this process and a new child both get it again (a leaked lock would hang).
    with one_at_a_time(handles.shared_fd(str(path))):
        pass
    again = ctx.Process(target=_hint_and_report, args=(str(path), out))
    again.start()
    assert out.get(timeout=30) > released
    again.join(30)
    assert again.exitcode == 0


# ------------------------------------------------------------------ real datasets


def resident(path: str, begin: int = 0, end: int | None = None) -> int:
    """Pages of ``path[begin:end]`` in the page cache (a fresh mapping + mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    end = size if end is None else min(end, size)
    start = begin - begin % mmap.PAGESIZE
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = np.frombuffer(m, dtype=np.uint8)
        pages = -(-(end - start) // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(view.ctypes.data + start, end - start, vec) == 0
        return sum(v & 1 for v in vec)
    finally:
        del view
        m.close()


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture(scope="module", params=FORMATS)
def big(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 noise PNGs of 5 KB (incompressible) in each registered format."""
    src = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    for i in range(300):
        folder = src / f"c{i % 3}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i:03d}.png").write_bytes(encode(make_image(rng, 40, 40), ".png"))
    fmt = str(request.param)
    return build_packed(src, tmp_path_factory.mktemp("out") / f"d.{fmt}", fmt)


def data_file(ds: Any) -> str:
    """The file holding the stored bytes (the benchmark and tests pack one shard)."""
    return str(ds._byte_ranges(0, 0, 1)[0][0])


def cold(ds: Any) -> str:
    handles.close_all()
    path = data_file(ds)
    evict(path)
    if resident(path):
        pytest.skip("the page cache of this file system cannot be dropped (tmpfs?)")
    return path


def sample_pages(ds: Any, lo: int, hi: int) -> int:
    return sum(resident(p, b, e) for p, b, e in ds._byte_ranges(0, lo, hi))


def test_reading_in_order_reads_ahead(big: Path) -> None:
    ds = open_dataset(big, decode="bytes")
    cold(ds)
    for i in range(10):
        ds[i]
    assert ds._ahead.hints >= 1
    deadline = time.monotonic() + 5
    while sample_pages(ds, 20, 60) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the hint's read is asynchronous
    assert sample_pages(ds, 20, 60) > 0, "samples ahead of the reads were not read ahead"


def test_random_reads_read_one_record_each(big: Path) -> None:
    ds = open_dataset(big, decode="bytes")
    path = cold(ds)
    ids = np.random.default_rng(1).permutation(len(ds))[:30].tolist()
    for i in ids:
        ds[i]
    assert ds._ahead.hints == 0
    pages = resident(path)
    own = sum(
        -(-(e - b) // mmap.PAGESIZE) + 1 for i in ids for _, b, e in ds._byte_ranges(0, i, i + 1)
    )
    # each record's pages, plus LMDB's B-tree pages on the way; no read-around (MADV_RANDOM)
    assert pages <= own + 24, f"{pages} pages resident after reading {len(ids)} records ({own})"


class HintCount:
    """A transform that reports the hints its worker's dataset copy has sent so far."""

    def __init__(self) -> None:
        self.ds: Any = None

    def __call__(self, image: Any) -> np.ndarray:
        return np.asarray([self.ds._ahead.hints], dtype=np.int64)


@pytest.mark.parametrize("shuffle", [False, True])
def test_dataloader_workers_read_ahead_only_in_order(big: Path, shuffle: bool) -> None:
    import paddle

    count = HintCount()
    ds = open_dataset(big, decode="bytes", transform=count)
    count.ds = ds
    cold(ds)
    paddle.seed(3)
    loader = paddle.io.DataLoader(ds, batch_size=16, shuffle=shuffle, num_workers=2)
    hints = max(int(np.max(batch[0].numpy())) for batch in loader)
    if shuffle:
        assert hints == 0
    else:
        assert hints >= 1  # each worker saw its own batches go forward


def test_stream_run_hints_leave_the_detector_quiet(big: Path) -> None:
    """A caller that hints the run it reads (ShardStream) is not doubled by the detector."""
    ds = open_dataset(big, decode="bytes")
    ds.prefetch(0, 64)
    for i in range(64):
        ds[i]
    assert ds._ahead.hints == 0
    for i in range(64, 80):  # past the caller's run: the detector takes over
        ds[i]
    assert ds._ahead.hints >= 1


def test_file_ahead_keeps_a_window_ahead(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
        os.fsync(f.fileno())  # dirty pages cannot be dropped
    evict(str(path))
    if resident(str(path)):
        pytest.skip("the page cache of this file system cannot be dropped (tmpfs?)")
    ahead = FileAhead(str(path), first=256 << 10, most=2 << 20)
    for position in range(0, 4 << 20, 64 << 10):
        ahead.at(position)
        assert ahead.frontier - position <= 2 << 20
        assert ahead.frontier > position
    deadline = time.monotonic() + 5
    while resident(str(path), 4 << 20, 5 << 20) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert resident(str(path), 4 << 20, 5 << 20) > 0  # ahead of the last position
    assert resident(str(path), 7 << 20, 8 << 20) == 0  # but not the whole file


def test_stream_announces_the_next_run_before_reading_this_one(big: Path) -> None:
    """ShardStream's reader hints one run ahead; the dataset leaves those runs to it."""
    from readers.stream_reader import RunReader

    ds = open_dataset(big, decode="bytes")
    log = _record_prefetch(ds)
    ids = np.concatenate([np.arange(64, 96), np.arange(0, 32), np.arange(200, 232)])
    reader = RunReader(ds, ids, np.array([0, 32, 64, 96, 128, 160, 200, 232]))
    reader.read(0)
    assert log == [(64, 96), (0, 32)]  # this run, and the next one, before the first read
    for p in range(1, 33):
        reader.read(p)
    assert log == [(64, 96), (0, 32), (200, 232)]  # each run announced once
    for p in range(33, ids.size):
        reader.read(p)
    assert len(log) == 3
    assert ds._ahead.hints == 0  # the detector stayed out of the announced runs


def _record_prefetch(ds: Any) -> list[tuple[int, int]]:
    """Log the dataset's prefetch calls; they still reach the OS."""
    log: list[tuple[int, int]] = []
    real = ds.prefetch

    def logged(start: int, stop: int) -> None:
        log.append((start, stop))
        real(start, stop)

    ds.prefetch = logged
    return log


# ------------------------------------------------------------------ first hints from the index


def test_a_runs_first_window_is_what_the_caller_sizes() -> None:
    d = SequentialDetector(first_window=8, max_window=640, max_gap=200, first=lambda s: 100 + s)
    hints = run(d, range(2000))
    assert hints[0] == (3, 4, 4 + 104)  # sized for its start, not first_window
    assert [b - a for _, a, b in hints[1:3]] == [208, 416]  # and doubling from there
    assert run(d, [0, 1, 2, 3])[0][1:] == (4, 108)  # a new run (backward step): sized again
    capped = SequentialDetector(first_window=8, max_window=64, max_gap=200, first=lambda s: 10**6)
    assert run(capped, range(10))[0][1:] == (4, 4 + 64)


class Sized:
    """A dataset stand-in: ``index.nbytes`` and ``prefetch`` calls logged (nothing read)."""

    def __init__(self, nbytes: np.ndarray) -> None:
        self.index = type("Index", (), {"nbytes": nbytes})()
        self.calls: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.index.nbytes)

    def prefetch(self, start: int, stop: int) -> None:
        self.calls.append((start, stop))


def test_the_first_hint_counts_the_next_records_bytes_in_the_index() -> None:
    """100 records of 100 kB, then 20,000 of 1 kB: the first hint of a run holds about
    FIRST_WINDOW_BYTES of the records it starts at, whatever the mean size (1.5 kB)."""
    nbytes = np.concatenate([np.full(100, 100_000), np.full(20_000, 1_000)]).astype(np.uint32)
    for begin in (0, 1_000):
        ds = Sized(nbytes)
        ahead = Readahead()
        for i in range(begin, begin + 5):
            ahead.note(i, ds)
        start, stop = ds.calls[0]
        assert start == begin + 4
        hinted = int(nbytes[start:stop].sum(dtype=np.int64))
        assert FIRST_WINDOW_BYTES <= hinted < FIRST_WINDOW_BYTES + int(nbytes[start])
    assert ids_within_bytes(ds, 20_095, FIRST_WINDOW_BYTES, most=10**6) == 5  # the ids left
    assert ids_within_bytes(object(), 0, 1, most=1) is None


def test_a_fresh_process_hints_the_next_8_mib_at_once(big: Path) -> None:
    """On a cold dataset of 1.5 MB, the first hint after 5 reads covers it to the end (it was
    512 KiB, about the first 100 samples)."""
    ds = open_dataset(big, decode="bytes")
    cold(ds)
    for i in range(5):
        ds[i]
    assert ds._ahead.hints == 1
    whole = sum(-(-(e - b) // mmap.PAGESIZE) for _, b, e in ds._byte_ranges(0, 250, 300))
    deadline = time.monotonic() + 5
    while sample_pages(ds, 250, 300) < whole and time.monotonic() < deadline:
        time.sleep(0.05)  # the hint's read is asynchronous
    assert sample_pages(ds, 250, 300) >= whole, "the last samples were not in the first hint"


class Frontier:
    """A transform that reports how far its worker's read-ahead has hinted."""

    def __init__(self) -> None:
        self.ds: Any = None

    def __call__(self, image: Any) -> np.ndarray:
        detector = self.ds._ahead._detector
        return np.asarray([0 if detector is None else detector.frontier], dtype=np.int64)


def test_each_fresh_worker_hints_ahead_of_the_others_from_its_first_batch(big: Path) -> None:
    import paddle

    frontier = Frontier()
    ds = open_dataset(big, decode="bytes", transform=frontier)
    frontier.ds = ds
    cold(ds)
    loader = paddle.io.DataLoader(ds, batch_size=16, shuffle=False, num_workers=2)
    firsts = [int(np.max(batch[0].numpy())) for _, batch in zip(range(2), loader, strict=False)]
    assert firsts == [len(ds), len(ds)]  # worker 0's first batch and worker 1's
