"""Read-ahead for (nearly) increasing reads, per process, and page-cache hints in large pieces.

Datasets open their shards with the kernel's read-ahead off (a random read must stay one
record), so a plain ``DataLoader(ds, shuffle=False)`` would read a sequential pass 4 KiB at a
time. `SequentialDetector` watches the sample ids one process reads, like the kernel's
read-ahead window: after a few forward steps it asks for the next samples ahead, and the
window grows (to a cap) while the reads keep going forward; a backward step or a long jump
resets it. Forward jumps up to a gap keep a detection alive, so that a DataLoader worker (one
batch in every ``num_workers``) and a rank of ``DistributedBatchSampler`` (one in every
``world_size``) count as sequential. A uniformly random order never sees several forward steps
of one or two samples in a row, so it stays one record per read.

`willneed` passes a byte range to the OS as ``POSIX_FADV_WILLNEED`` calls of at most
`hint_piece` bytes: Linux reads at most max(read_ahead_kb, max_sectors_kb) of one such call
and drops the rest silently (measured: a 30 MB hint read 8 MB, the other 22 MB came back as
4 KiB faults). `coalesce` turns the scattered extents of one run of samples into few ranges.

Nothing here imports paddle or knows a format: datasets map ids to byte ranges.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import numpy as np

from readers.io import handles
from readers.io.hints import CHUNK_BYTES, ids_within_bytes, mean_record_bytes

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "FIRST_WINDOW_BYTES",
    "MAX_GAP_BYTES",
    "MAX_WINDOW_BYTES",
    "FileAhead",
    "Readahead",
    "SequentialDetector",
    "coalesce",
    "hint_piece",
    "one_at_a_time",
    "willneed",
]

FIRST_WINDOW_BYTES = 8 * CHUNK_BYTES
"""A run's first read-ahead, in stored bytes counted in the index from its next id: 8 default
chunks, what the chunked sampler hints ahead (512 KiB by the mean size before: a fresh
DataLoader worker waited on the disk while that window grew)."""
MAX_WINDOW_BYTES = 32 << 20
"""The most bytes hinted ahead of the read position (larger hints stalled the reads of a
100 MB/s disk for seconds: bench_orders.py --sweep)."""
MAX_GAP_BYTES = 8 << 20
"""A forward jump up to this far keeps a sequential run alive (the batches that other workers
or ranks read in between)."""
EXPLICIT_KEPT = 16
"""How many of a caller's latest hinted ranges `Readahead` leaves to the caller: more than the
runs a stream announces ahead of the one it reads (8 for a dataset in object storage,
``RecordIODataset.prefetch_runs``), else the run being read falls out and is hinted again, past
its end, by the detector (with 4, a stream of a 100 MB dataset on S3 fetched 26x its bytes)."""
DEFAULT_RECORD_BYTES = 64 << 10
"""The record size assumed when a dataset does not know its sizes."""
GAP_BYTES = 256 << 10
"""`coalesce` reads across holes up to this size: on a hard disk one more request costs about
as much time as reading 256-512 KiB (100 MB/s, 300 IOPS)."""


class SequentialDetector:
    """Which ids to read ahead, given the ids one process reads, in order (pure logic).

    A *step* is the difference between an id and the previous one. Steps of 1..`near` count
    toward a run; forward steps up to `max_gap` keep the run (they skip the samples other
    workers or ranks read); anything else (backward, a long jump) ends it. From the
    `trigger`-th counted step on, `observe` returns ``(start, stop)``, ids to hint, whenever
    fewer than half a window is hinted ahead; each such hint doubles the window, up to
    `max_window`, and never reaches more than `max_window` ids past the read position.

    Args:
        first_window: ids hinted by the first hint of a run.
        max_window: the most ids hinted ahead of the read position.
        max_gap: the longest forward step that keeps a run.
        trigger: counted steps before the first hint.
        near: the longest step that counts toward `trigger` (a skipped bad sample, a sampler
            that leaves out a few ids).
        first: the ids of a run's first hint from its first id on; default `first_window`.
    """

    def __init__(
        self,
        *,
        first_window: int,
        max_window: int,
        max_gap: int,
        trigger: int = 3,
        near: int = 2,
        first: Callable[[int], int] | None = None,
    ) -> None:
        if not 1 <= first_window <= max_window:
            raise ValueError(
                f"need 1 <= first_window <= max_window, got {first_window}, {max_window}"
            )
        if trigger < 1 or near < 1 or max_gap < near:
            raise ValueError(
                f"need trigger >= 1 and 1 <= near <= max_gap, got {trigger}, {near}, {max_gap}"
            )
        self.first_window = int(first_window)
        self.max_window = int(max_window)
        self.max_gap = int(max_gap)
        self.trigger = int(trigger)
        self.near = int(near)
        self.first = first
        self.reset()

    def reset(self) -> None:
        """Forget the run: the next reads start a new detection."""
        self.last: int | None = None
        self.streak = 0
        self.window = self.first_window
        self.frontier = 0
        """One past the last id hinted (0: nothing hinted in this run)."""

    def observe(self, i: int) -> tuple[int, int] | None:
        """Note a read of id `i`; the ids ``[start, stop)`` to hint now, or None."""
        i = int(i)
        last, self.last = self.last, i
        if last is None or i == last:
            return None
        step = i - last
        if not 0 < step <= self.max_gap:
            self.streak, self.window, self.frontier = 0, self.first_window, 0
            return None
        if step <= self.near:
            self.streak += 1
        if self.streak < self.trigger:
            return None
        ahead = self.frontier - (i + 1)
        if ahead <= 0:  # nothing hinted past here: a new run, or the reads jumped past it
            start = i + 1
            if self.frontier:  # the window was too short for the jumps: grow it
                self.window = min(2 * self.window, self.max_window)
            elif self.first is not None:  # a new run: its first window as the caller sizes it
                self.window = min(self.max_window, max(1, int(self.first(start))))
        elif ahead <= self.window // 2:
            start = self.frontier
            self.window = min(2 * self.window, self.max_window)
        else:
            return None
        stop = min(start + self.window, i + 1 + self.max_window)
        if stop <= start:
            return None
        self.frontier = stop
        return start, stop


def make_detector(
    mean_bytes: float, *, first: Callable[[int], int] | None = None
) -> SequentialDetector:
    """Return a `SequentialDetector` with windows sized in bytes.

    A `SequentialDetector` whose windows are sized in bytes for records of `mean_bytes`;
    `first` sizes the first window of each run (`first_window_of` counts it in an index).
    """

    def ids(nbytes: int, least: int) -> int:
        return max(least, int(nbytes / max(1.0, mean_bytes)))

    start = ids(FIRST_WINDOW_BYTES, 8)
    most = max(start, ids(MAX_WINDOW_BYTES, 8))
    return SequentialDetector(
        first_window=start, max_window=most, max_gap=ids(MAX_GAP_BYTES, 64), first=first
    )


def first_window_of(dataset: Any, most: int) -> Callable[[int], int] | None:
    """Return the first window of a run from id `start`, or None.

    The first window of a run from id `start` of `dataset`: the ids whose stored bytes in
    its index add up to `FIRST_WINDOW_BYTES` (at most `most`); None without an index.
    """
    if ids_within_bytes(dataset, 0, 1, most=1) is None:
        return None

    def first(start: int) -> int:
        found = ids_within_bytes(dataset, start, FIRST_WINDOW_BYTES, most=most)
        return most if found is None else found

    return first


class Readahead:
    """A process's `SequentialDetector` for one dataset, and the hints it sends.

    A dataset keeps one and calls ``note(i, self)`` once per sample it reads; hints go to
    ``dataset.prefetch(start, stop)`` (ids; the dataset maps them to byte ranges). A caller
    that hints its own order (ShardStream announces each run it reads) tells ``covered``, and
    reads inside the ranges it hinted last are left to it. The state is per process: a copy
    made by ``fork`` or by pickling starts afresh, and hinting never raises.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._detector: SequentialDetector | None = None
        self._explicit: list[tuple[int, int]] = []
        self._hit = (0, 0)  # the caller's range that held the last read: checked first
        self._own = False
        self.hints = 0
        """Hints sent by this process (for tests and benchmarks)."""

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_pid": -1,
            "_detector": None,
            "_explicit": [],
            "_hit": (0, 0),
            "_own": False,
            "hints": 0,
        }

    def _this_process(self) -> None:
        if self._pid != os.getpid():  # new, or a copy made by fork: start afresh
            self._pid = os.getpid()
            self._detector = None
            self._explicit = []
            self._hit = (0, 0)
            self.hints = 0

    def covered(self, start: int, stop: int) -> None:
        """The ids ``[start, stop)`` were hinted by the caller (not by this detector)."""
        if not self._own:
            self._this_process()
            self._explicit = [*self._explicit[-(EXPLICIT_KEPT - 1) :], (int(start), int(stop))]

    def note(self, i: int, dataset: Any) -> None:
        """Note a read of sample `i` of `dataset`; hint the samples ahead when due."""
        try:
            self._this_process()
            if self._detector is None:
                mean = mean_record_bytes(dataset, DEFAULT_RECORD_BYTES)
                self._detector = make_detector(mean)
                self._detector.first = first_window_of(dataset, self._detector.max_window)
            lo, hi = self._hit
            if lo <= i < hi:
                return
            for lo, hi in self._explicit:
                if lo <= i < hi:
                    self._hit = (lo, hi)
                    return
            found = self._detector.observe(i)
            if found is None:
                return
            start, stop = found
            stop = min(stop, len(dataset))
            if start < stop:
                self.hints += 1
                self._own = True
                try:
                    dataset.prefetch(start, stop)
                finally:
                    self._own = False
        except Exception:  # a hint must never fail a read
            return


class FileAhead:
    """Hints for one file read front to back.

    For a caller that knows it reads the file that way (``packer verify``):
    `at` keeps up to `most` bytes ahead of the read position hinted, in windows that start at
    `first` bytes and double.
    """

    def __init__(
        self, path: str, *, first: int = FIRST_WINDOW_BYTES, most: int = MAX_WINDOW_BYTES
    ) -> None:
        self.path = path
        self.size = os.path.getsize(path)
        self.window = max(1, first)
        self.most = max(self.window, most)
        self.frontier = 0
        self.hints = 0

    def at(self, position: int) -> None:
        """The caller reads at byte `position` now; hint ahead of it when due. Never raises."""
        if self.frontier >= self.size or self.frontier - position > self.window // 2:
            return
        start = max(self.frontier, int(position))
        stop = min(self.size, start + self.window, int(position) + self.most)
        self.window = min(2 * self.window, self.most)
        if stop <= start:
            return
        self.frontier = stop
        try:
            willneed(self.path, start, stop)
            self.hints += 1
        except OSError:
            return


def coalesce(begin: np.ndarray, end: np.ndarray, *, gap: int = GAP_BYTES) -> list[tuple[int, int]]:
    """Merge byte ranges into the few reads that fetch them all.

    The byte ranges ``[begin[k], end[k])`` merged where they overlap or lie at most `gap`
    bytes apart, sorted: the few reads that fetch them all.
    """
    if len(begin) == 0:
        return []
    b = np.asarray(begin, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    order = np.argsort(b, kind="stable")
    b, e = b[order], np.maximum.accumulate(e[order])
    cut = np.flatnonzero(b[1:] > e[:-1] + gap) + 1
    starts = np.concatenate(([0], cut))
    stops = np.concatenate((cut, [len(b)])) - 1
    return [(int(b[s]), int(e[t])) for s, t in zip(starts, stops, strict=True)]


def _sysfs_kb(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


@lru_cache(maxsize=64)
def _device_cap(dev: int) -> int:
    """max(read_ahead_kb, max_sectors_kb) in bytes of the device `dev`, 0 when unknown."""
    major, minor = os.major(dev), os.minor(dev)
    block = f"/sys/dev/block/{major}:{minor}"
    for queue in (f"{block}/queue", f"{block}/../queue"):
        kb = max(_sysfs_kb(f"{queue}/read_ahead_kb"), _sysfs_kb(f"{queue}/max_sectors_kb"))
        if kb:
            return kb << 10
    return _sysfs_kb(f"/sys/class/bdi/{major}:{minor}/read_ahead_kb") << 10


PIECE_LEAST = 128 << 10
PIECE_MOST = 2 << 20
PIECE_UNKNOWN = 512 << 10
"""Piece size where sysfs does not tell (overlay or network file systems)."""


def hint_piece(path: str) -> int:
    """Return the bytes per ``WILLNEED`` call for the file `path`.

    Bytes per ``WILLNEED`` call for the file `path`: what its device reads of one call
    (max(read_ahead_kb, max_sectors_kb)), within [128 KiB, 2 MiB]; 512 KiB when unknown.
    Larger pieces did not make larger requests (a request holds at most ~1 MiB of pages).
    """
    try:
        cap = _device_cap(os.stat(path).st_dev)
    except OSError:
        cap = 0
    return min(PIECE_MOST, max(PIECE_LEAST, cap)) if cap else PIECE_UNKNOWN


_in_process = threading.Lock()


def _fresh_lock() -> None:
    global _in_process
    _in_process = threading.Lock()  # the parent's may have been held by another thread at fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock)


@contextlib.contextmanager
def one_at_a_time(fd: int) -> Iterator[None]:
    """Hold the file's hint lock.

    Hold the file's hint lock: an exclusive ``flock`` on `fd` (this process's own open of
    the file, see `readers.handles`) and a lock between this process's threads.

    Two processes hinting overlapping ranges at the same moment (DataLoader workers or ranks
    reading one sequential pass in turns, whose windows grow in step) insert the pages in
    turns, and each one's requests end where the other's pages begin: measured on the
    emulated hard disk, 2 workers read a shuffle=False pass in 183 KB requests, 1 worker in
    883 KB. Taken one at a time, the second call finds the pages in the cache and reads only
    what is new, in whole requests. A lock that cannot be taken (a file system without
    ``flock``) is skipped: the hint still goes out.
    """
    with _in_process:
        locked = False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                locked = True
            except OSError:
                pass
        try:
            yield
        finally:
            if locked:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)


def willneed(path: str, begin: int, end: int, *, advise: Callable[..., Any] | None = None) -> int:
    """Ask the OS to read bytes ``[begin, end)`` of `path` into the page cache.

    Ask the OS to read bytes ``[begin, end)`` of `path` into the page cache, in pieces of
    at most `hint_piece` bytes (aligned to it when there are several), under the file's hint
    lock (`one_at_a_time`); returns the number of calls. Does nothing where posix_fadvise is
    missing. `advise` replaces ``os.posix_fadvise`` (tests count the calls).

    Raises:
        OSError: the file cannot be opened (callers treat hints as optional).
    """
    call = advise if advise is not None else getattr(os, "posix_fadvise", None)
    if call is None or end <= begin:
        return 0
    fd = handles.shared_fd(path)
    piece = hint_piece(path)
    calls = 0
    at, end = int(begin), int(end)
    with one_at_a_time(fd):
        while at < end:
            # A range of one piece or less goes out whole; a longer one in pieces aligned to
            # the piece size (a piece starting mid-way was read as a 4 KiB bio plus the rest).
            stop = end if end - at <= piece else min(end, (at // piece + 1) * piece)
            call(fd, at, stop - at, os.POSIX_FADV_WILLNEED)
            calls += 1
            at = stop
    return calls
