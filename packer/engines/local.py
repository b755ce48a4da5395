"""The local engine: the planned shards written on this machine.

- One shard to write (or ``--workers 1``): the shard task runs in this process while a
  process pool reads, checks and transforms its images ahead of it (`prepared`), in order.
- Several shards and several workers: each pool process runs the shard task (`packer.task`)
  end to end for one shard at a time, as a Ray task would, with the provisional first id
  ``shard.start``; the merge renumbers where earlier shards skipped inputs.

Either way the dataset is the same byte for byte, for any number of workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packer.config import BuildConfig
from packer.encode import Transform, _read_all, prepare
from packer.engines import progress_bar
from packer.errors import PackerError
from packer.plan import ShardPlan
from packer.problems import CHANGED, Problem
from packer.records import Entry, Record
from packer.task import PortableError, Prepared, portable, rebuild, run_shard, write_shard
from packer.task import prepared as task_prepared
from packer.writers.part import index_row, read_done

_BATCH = 64  # images per task sent to a worker process: amortises the IPC
_POOLED = 64  # fewer images than this are prepared in this process
_IN_FLIGHT = 4  # tasks queued per worker: enough to keep each busy, and memory bounded


def _warm() -> None:
    """In a new pool process: import what reading and writing images needs (OpenCV), while
    the process that started the pool goes on scanning and planning."""
    import cv2  # noqa: F401


def start_pool(workers: int) -> Any:
    """A pool of `workers` processes for `run_local`, started now (by fork where there is
    fork: they share what this process imported) and warming up in the background."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method).Pool(workers, initializer=_warm)


@contextlib.contextmanager
def _pool(workers: int, pool: Any | None) -> Iterator[Any]:
    """`pool` when the caller started one, else a pool of `workers` for this call.

    Either way a failure stops the pool's processes before it propagates: a shard task
    still writing would otherwise race the removal of the build directory.
    """
    active = start_pool(workers) if pool is None else pool
    try:
        yield active
    except BaseException:
        active.terminate()
        active.join()
        raise
    if pool is None:
        stop_pool(active)


def stop_pool(pool: Any) -> None:
    """Let the idle processes of `pool` exit on their own (no signal: a signal handler that
    a library installed, paddle's, could hang a process it interrupts)."""
    pool.close()
    pool.join()


def _with_data(r: Record, data: bytes) -> Record:
    """`r` with other bytes (the constructor called directly: dataclasses.replace took 4 us)."""
    return Record(r.rel, r.label, data, r.format, r.width, r.height, r.channels, r.crc32, r.notes)


def _prepare_batch(
    batch: list[tuple[str, str, Any]],
    decode_check: bool,
    transform: Transform,
    strip: bool = False,
) -> list[Prepared]:
    """In a pool process: each image prepared, with its index row (encoded here, not in the
    writing process); with `strip`, without the bytes (the writer reads them again)."""
    results: list[Prepared] = []
    for rel, path, label in batch:
        item = prepare(rel, path, label, decode_check=decode_check, transform=transform)
        if isinstance(item, Record):
            row = index_row(item)
            results.append((_with_data(item, b"") if strip else item, row))
        else:
            results.append((item, None))
    return results


def restore(item: Record | Problem, path: str) -> Record | Problem:
    """A record whose bytes a worker left out gets them again, from the page cache.

    Sending every image through a pipe cost more than reading it twice: with the bytes
    piped back, two workers were only 1.2x one. The CRC-32 the worker computed proves the
    bytes read now are the bytes it checked.
    """
    if not isinstance(item, Record) or item.data:
        return item
    try:  # a plain read: the worker already vetted the file (regular, readable, an image)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            got = _read_all(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    except OSError as exc:
        return Problem(item.rel, CHANGED, f"cannot be read again after its check ({exc})")
    if zlib.crc32(got) != item.crc32:
        return Problem(item.rel, CHANGED, "changed between its check and its packing")
    return _with_data(item, got)


def prepared(entries: list[Entry], cfg: BuildConfig, pool: Any | None = None) -> Iterator[Prepared]:
    """Each entry read, checked and transformed, in entry order.

    With several workers the images are processed in a process pool while this process
    writes; at most ``workers * _IN_FLIGHT`` batches are in flight, so memory stays bounded
    whatever the tree size, and results come back in order, so the output is identical for
    any number of workers.
    """
    tasks = [(e.file.rel, e.file.path, e.label) for e in entries]
    batches = (tasks[i : i + _BATCH] for i in range(0, len(tasks), _BATCH))
    if cfg.workers <= 1 or len(entries) < _POOLED:
        yield from task_prepared(entries, cfg)
        return
    strip = cfg.transform.identity  # original bytes: re-read here rather than piped back
    with _pool(cfg.workers, pool) as workers:
        pending: deque[tuple[Any, list[tuple[str, str, Any]]]] = deque()

        def collect() -> Iterator[Prepared]:
            result, batch = pending.popleft()
            for (item, row), (_, path, _) in zip(result.get(), batch, strict=True):
                yield restore(item, path), row

        for batch in batches:
            args = (batch, cfg.decode_check, cfg.transform, strip)
            pending.append((workers.apply_async(_prepare_batch, args), batch))
            if len(pending) >= cfg.workers * _IN_FLIGHT:
                yield from collect()
        while pending:
            yield from collect()


def _shard_job(
    job: tuple[BuildConfig, Path, ShardPlan, list[Entry]],
) -> dict[str, Any] | PortableError:
    """The shard task in a pool process: its completion marker, or its error."""
    try:
        return run_shard(*job)
    except PackerError as exc:
        return portable(exc)


def run_local(
    cfg: BuildConfig,
    tmp: Path,
    entries: list[Entry],
    shards: list[ShardPlan],
    finished: set[int],
    *,
    started: float,
    pool: Any | None = None,
) -> None:
    """Write the planned shards of the build in `tmp` that are not in `finished`; `pool`:
    the `start_pool` of ``cfg.workers`` processes to use (None: one is started if needed).

    Raises:
        InputError: a bad input with ``on_error="fail"`` (the first in entry order).
        OSError: the disk is full, ...: the shards finished so far are kept.
    """
    todo = [s for s in shards if s.number not in finished]
    with progress_bar(len(entries), cfg.progress) as bar:
        bar.update(len(entries) - sum(s.stop - s.start for s in todo))
        if cfg.workers > 1 and len(todo) > 1:
            _shards_in_pool(cfg, tmp, entries, todo, bar, started, pool)
        else:
            _shards_here(cfg, tmp, entries, shards, finished, bar, started, pool)


def _shards_here(
    cfg: BuildConfig,
    tmp: Path,
    entries: list[Entry],
    shards: list[ShardPlan],
    finished: set[int],
    bar: Any,
    started: float,
    pool: Any | None,
) -> None:
    """The shard task in this process, shard after shard, fed by `prepared`; each shard is
    written with its final first id (the counts of the shards before it)."""
    todo = [e for s in shards if s.number not in finished for e in entries[s.start : s.stop]]
    results = prepared(todo, cfg, pool)
    written = 0
    unshown = 0  # images written since the bar last moved: updating it costs ~10 us

    def advance(stored: int) -> None:
        nonlocal written, unshown
        written += stored
        unshown += 1
        if unshown == 256:
            bar.update(unshown)
            unshown = 0
            rate = written / max(time.perf_counter() - started, 1e-9) / 1e6
            bar.set_postfix_str(f"{rate:.1f} MB/s")

    first_id = 0
    for shard in shards:
        if shard.number in finished:  # kept by --resume
            done = read_done(tmp, shard.number)
            assert done is not None
        else:
            shard_entries = entries[shard.start : shard.stop]
            done = write_shard(
                tmp, shard, shard_entries, results, cfg, first_id=first_id, advance=advance
            )
        first_id += int(done["count"])
    bar.update(unshown)


def _shards_in_pool(
    cfg: BuildConfig,
    tmp: Path,
    entries: list[Entry],
    todo: list[ShardPlan],
    bar: Any,
    started: float,
    pool: Any | None,
) -> None:
    """One shard task per pool process; results are taken in plan order, so a bad input
    with ``on_error="fail"`` is reported as the first one in entry order."""
    jobs = ((cfg, tmp, s, entries[s.start : s.stop]) for s in todo)
    written = 0
    with _pool(min(cfg.workers, len(todo)), pool) as workers:
        for shard, result in zip(todo, workers.imap(_shard_job, jobs), strict=True):
            if isinstance(result, tuple):
                raise rebuild(result)
            written += int(result["bytes"])
            bar.update(shard.stop - shard.start)
            rate = written / max(time.perf_counter() - started, 1e-9) / 1e6
            bar.set_postfix_str(f"{rate:.1f} MB/s")
