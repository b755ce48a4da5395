"""The local engine: the planned shards written on this machine.

- One shard to write (or ``--workers 1``): the shard task runs in this process while a
  process pool reads, checks and transforms its images ahead of it (`prepare_entries`), in
  order.
- Several shards and several workers: each pool process runs the shard task (`packer.task`)
  end to end for one shard at a time, as a Ray task would, with the provisional first id
  ``shard.start``; the merge renumbers where earlier shards skipped inputs.

Either way the dataset is the same byte for byte, for any number of workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from packer.engines import progress_bar
from packer.errors import PackerError
from packer.feedback import ProgressCounter, test_delay
from packer.job import BuildJob, ShardSettings
from packer.plan import ShardPlan
from packer.prepare import prepare_entries
from packer.records import Entry
from packer.ring import ByteRing, use_ring
from packer.task import PortableError, make_portable, rebuild, run_shard, write_shard
from packer.writers.part import read_done

_POOLED = 64  # fewer images than this are prepared in this process
_IN_FLIGHT = 4  # batches queued per worker: enough to keep each busy, and memory bounded


class LocalPool(NamedTuple):
    """The local engine's process pool, and the shared memory its processes hand bytes back in.

    `ring` has a slot for each batch that `_shards_here` keeps in flight (None where processes
    are spawned, not forked: see `packer.ring`); `done` counts the images that the shard tasks
    in the pool have handled (a shared `multiprocessing.Value`, for the progress bar).
    """

    processes: Any  # a multiprocessing.pool.Pool
    ring: ByteRing | None
    done: Any = None


_done: Any = None  # in a pool process: the pool's shared count of images handled


def _start_worker(ring: ByteRing | None, done: Any = None) -> None:
    """In a new pool process: its ring, and the import of what checking images needs (OpenCV).

    This runs while the process that started the pool goes on scanning and planning. Ctrl-C
    is left to that process, which stops the pool (no traceback from every process).
    """
    global _done
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _done = done
    use_ring(ring)
    import cv2  # noqa: F401


def start_pool(workers: int) -> LocalPool:
    """Start a pool of `workers` processes for `run_local`, warming up in the background.

    The pool is started now, by fork where there is fork (its processes share what this
    process imported, and its ring).
    """
    fork = "fork" in multiprocessing.get_all_start_methods()
    ring = ByteRing(workers * _IN_FLIGHT) if fork else None
    context = multiprocessing.get_context("fork" if fork else "spawn")
    done = context.Value("q", 0)
    processes = context.Pool(workers, initializer=_start_worker, initargs=(ring, done))
    return LocalPool(processes, ring, done)


@contextlib.contextmanager
def _pool(workers: int, pool: LocalPool | None) -> Iterator[LocalPool]:
    """`pool` when the caller started one, else a pool of `workers` for this call.

    Either way a failure stops the pool's processes before it propagates: a shard task
    still writing would otherwise race the removal of the build directory.
    """
    active = start_pool(workers) if pool is None else pool
    try:
        yield active
    except BaseException:
        kill_pool(active)
        raise
    if pool is None:
        stop_pool(active)


def stop_pool(pool: LocalPool) -> None:
    """Let the idle processes of `pool` exit on their own.

    No signal is sent: a signal handler that a library installed (paddle's) could hang a
    process it interrupts.
    """
    pool.processes.close()
    pool.processes.join()
    if pool.ring is not None:
        pool.ring.close()


def kill_pool(pool: LocalPool) -> None:
    """Stop the processes of `pool` now (a failure: their work is not wanted)."""
    pool.processes.terminate()
    pool.processes.join()
    if pool.ring is not None:
        pool.ring.close()


def _shard_job(
    job: tuple[ShardSettings, Path, ShardPlan, list[Entry]],
) -> dict[str, Any] | PortableError:
    """The shard task in a pool process: its completion marker, or its error.

    Each image handled is added to the pool's shared count (in batches, for the bar).
    """
    counter = ProgressCounter(_done) if _done is not None else None
    try:
        return run_shard(*job, advance=counter)
    except PackerError as exc:
        return make_portable(exc)
    finally:
        if counter is not None:
            counter.flush()


def run_local(job: BuildJob, *, started: float, pool: LocalPool | None = None) -> None:
    """Write the planned shards of `job` that are not finished.

    `pool` is the `start_pool` of ``job.cfg.workers`` processes to use (None: one is started
    if needed).

    Raises:
        InputError: a bad input with ``on_error="fail"`` (the first in entry order).
        OSError: the disk is full, ...: the shards finished so far are kept.
    """
    todo = job.todo
    with progress_bar(len(job.entries), job.cfg.progress) as bar:
        bar.update(len(job.entries) - sum(s.stop - s.start for s in todo))
        if job.cfg.workers > 1 and len(todo) > 1:
            _shards_in_pool(job, bar, started, pool)
        else:
            _shards_here(job, bar, started, pool)


def _shards_here(job: BuildJob, bar: Any, started: float, pool: LocalPool | None) -> None:
    """Run the shard task in this process, shard after shard, fed by `prepare_entries`.

    `prepare_entries` runs in a pool when there are workers and enough images; each shard is
    written with its final first id (the counts of the shards before it).
    """
    todo = [e for s in job.todo for e in job.entries_of(s)]
    settings = job.settings
    workers = job.cfg.workers
    written = 0
    unshown = 0  # images written since the bar last moved: updating it costs ~10 us
    shown_at = time.monotonic()
    delay = test_delay()

    def advance(stored: int) -> None:
        nonlocal written, unshown, shown_at
        if delay:
            time.sleep(delay)
        written += stored
        unshown += 1
        if unshown >= 64 or time.monotonic() - shown_at >= 0.1:
            bar.update(unshown)
            unshown = 0
            shown_at = time.monotonic()
            rate = written / max(shown_at - started, 1e-9) / 1e6
            bar.set_postfix_str(f"{rate:.1f} MB/s")

    pooled = workers > 1 and len(todo) >= _POOLED
    with _pool(workers, pool) if pooled else contextlib.nullcontext() as active:
        results = prepare_entries(
            todo,
            settings,
            pool=None if active is None else active.processes,
            in_flight=workers * _IN_FLIGHT,
            ring=None if active is None else active.ring,
        )
        first_id = 0
        for shard in job.shards:
            if shard.number in job.finished:  # kept by --resume
                done = read_done(job.tmp, shard.number)
                assert done is not None
            else:
                done = write_shard(
                    job.tmp,
                    shard,
                    job.entries_of(shard),
                    results,
                    settings,
                    first_id=first_id,
                    advance=advance,
                )
            first_id += int(done["count"])
    bar.update(unshown)


def _shards_in_pool(job: BuildJob, bar: Any, started: float, pool: LocalPool | None) -> None:
    """Run one shard task per pool process.

    Results are taken in plan order, so a bad input with ``on_error="fail"`` is reported as
    the first one in entry order. While waiting, the bar shows the images that the pool's
    processes report (`packer.feedback.ProgressCounter`), every tenth of a second.
    """
    todo = job.todo
    settings = job.settings
    jobs = ((settings, job.tmp, s, job.entries_of(s)) for s in todo)
    written = 0
    with _pool(min(job.cfg.workers, len(todo)), pool) as workers:
        base = shown = _count(workers)
        results = workers.processes.imap(_shard_job, jobs)
        for _shard in todo:
            while True:
                try:
                    result = results.next(timeout=0.1)
                    break
                except multiprocessing.TimeoutError:
                    shown = _show(bar, workers, shown)
            if isinstance(result, tuple):
                raise rebuild(result)
            written += int(result["bytes"])
            shown = _show(bar, workers, shown)
            rate = written / max(time.perf_counter() - started, 1e-9) / 1e6
            bar.set_postfix_str(f"{rate:.1f} MB/s")
        bar.update(sum(s.stop - s.start for s in todo) - (shown - base))


def _count(pool: LocalPool) -> int:
    """The images that the shard tasks in `pool` have reported (0 without a count)."""
    return int(pool.done.value) if pool.done is not None else 0


def _show(bar: Any, pool: LocalPool, shown: int) -> int:
    """Move `bar` by the images `pool` reported since `shown`; return the new count."""
    now = _count(pool)
    if now > shown:
        bar.update(now - shown)
    return now
