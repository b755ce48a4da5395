"""Watch a training loop: per epoch, time spent waiting for data vs time spent in the step.

No paddle import: :class:`LoaderStats` wraps any iterable of batches (a ``paddle.io.DataLoader``,
a ``ShardStream`` loader, a list) and measures only wall-clock time around ``next()``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["EpochStats", "LoaderStats"]

DEFAULT_IDLE_THRESHOLD = 0.10
"""Above this idle fraction the summary line suggests how to feed the accelerator faster."""


@dataclass(frozen=True)
class EpochStats:
    """What one pass over a loader cost.

    Attributes:
        epoch: The epoch number (counted from 0 unless given to ``wrap``).
        batches: Batches the loop received.
        samples: Samples in them (the first dimension of each batch's first field), or None
            when a batch has no length.
        wait_s: Seconds spent inside ``next()`` before each batch arrived (data loading the
            step did not hide), the first batch included.
        step_s: Seconds between receiving a batch and asking for the next one (the training
            step, logging, ...).
        first_wait_s: The wait for the first batch alone: it includes starting the workers.
        wall_s: Seconds from the first ``next()`` to the end of the epoch.
        complete: False when the loop stopped before the loader was exhausted.
        num_workers: The loader's ``num_workers`` when it has one, else None.
    """

    epoch: int
    batches: int
    samples: int | None
    wait_s: float
    step_s: float
    first_wait_s: float
    wall_s: float
    complete: bool = True
    num_workers: int | None = None

    @property
    def idle_fraction(self) -> float:
        """Return the share of the loop the accelerator would sit idle: wait / (wait + step)."""
        busy = self.wait_s + self.step_s
        return self.wait_s / busy if busy > 0 else 0.0

    @property
    def mean_wait_s(self) -> float:
        """Mean wait per batch, the first (worker start-up) batch excluded when there are more."""
        if self.batches > 1:
            return (self.wait_s - self.first_wait_s) / (self.batches - 1)
        return self.wait_s

    @property
    def mean_step_s(self) -> float:
        """Mean step time per batch (0.0 before the first batch)."""
        return self.step_s / self.batches if self.batches else 0.0

    @property
    def samples_per_s(self) -> float | None:
        """Samples read per second of wall time, or None when unknown."""
        if self.samples is None or self.wall_s <= 0:
            return None
        return self.samples / self.wall_s

    def as_dict(self) -> dict[str, Any]:
        """The fields and derived figures, for JSON logs and metric trackers."""
        return asdict(self) | {
            "idle_fraction": self.idle_fraction,
            "mean_wait_s": self.mean_wait_s,
            "mean_step_s": self.mean_step_s,
            "samples_per_s": self.samples_per_s,
        }

    def line(self, *, idle_threshold: float = DEFAULT_IDLE_THRESHOLD) -> str:
        """A one-line summary with a hint when the loader cannot keep up."""
        idle = self.idle_fraction
        text = (
            f"epoch {self.epoch}: {self.batches} batches"
            + ("" if self.complete else " (stopped early)")
            + f", data wait {idle:.0%} of the loop (mean {self.mean_wait_s * 1e3:.1f} ms/batch"
            + (f", first {self.first_wait_s:.2f} s" if self.first_wait_s >= 0.5 else "")
            + f"), step {self.mean_step_s * 1e3:.1f} ms/batch"
        )
        if idle < idle_threshold:
            return text + " -> data loading keeps up"
        return text + f" -> the GPU would idle {idle:.0%} of the time; {self._hint()}"

    def _hint(self) -> str:
        if self.batches > 1 and self.first_wait_s > 0.5 * self.wait_s:
            return (
                "most of it is the first batch (workers starting, or the 0.5 s that paddle's "
                "persistent workers pause at each epoch start); longer epochs hide it"
            )
        cores = _usable_cores()
        if self.num_workers is None:
            return "try a DataLoader with num_workers > 0"
        if self.num_workers < cores:
            return f"try more num_workers (now {self.num_workers}, {cores} cores)"
        return (
            f"num_workers={self.num_workers} already uses every core: pack resized images, "
            "a cheaper transform, or the data on /dev/shm or a local SSD"
        )


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _batch_len(batch: Any) -> int | None:
    """The number of samples in a batch: the first dimension of its first field."""
    first = batch
    if isinstance(batch, list | tuple) and batch:
        first = batch[0]
    elif isinstance(batch, dict) and batch:
        first = next(iter(batch.values()))
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(first, list | tuple):
        return len(first)
    return None


def _print_line(stats: EpochStats) -> None:
    print(stats.line(), flush=True)


class LoaderStats:
    """Measure how long a training loop waits for data, per epoch.

    ::

        stats = LoaderStats()                      # prints one line per epoch
        for epoch in range(epochs):
            for images, labels in stats.wrap(loader, epoch=epoch):
                loss = train_step(images, labels)  # synchronise (loss.item()) for GPU time

    ``wait`` is the time spent inside the loader's ``next()``; ``step`` is the time between
    receiving a batch and asking for the next. ``wait / (wait + step)`` is the share of time an
    accelerator running the steps would have idled. At the end of each pass (or when the loop
    leaves it early) the epoch's :class:`EpochStats` goes to ``on_epoch_end``.

    Args:
        loader: What ``iter(stats)`` iterates; optional when you call :meth:`wrap`.
        on_epoch_end: Called with each epoch's :class:`EpochStats`; default prints its
            :meth:`EpochStats.line`. Pass ``lambda s: None`` to stay silent and read
            :attr:`history` instead.
        clock: Seconds as a float (default ``time.perf_counter``).
    """

    def __init__(
        self,
        loader: Iterable[Any] | None = None,
        *,
        on_epoch_end: Callable[[EpochStats], object] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.loader = loader
        self.on_epoch_end: Callable[[EpochStats], object] = on_epoch_end or _print_line
        self.history: list[EpochStats] = []
        """Every finished epoch's stats, oldest first."""
        self._clock = clock
        self._next_epoch = 0
        self._running: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        if self.loader is None:
            raise TypeError("LoaderStats() was made without a loader; use stats.wrap(loader)")
        return self.wrap(self.loader)

    def wrap(self, loader: Iterable[Any], *, epoch: int | None = None) -> Iterator[Any]:
        """Yield the batches of one pass over `loader`, timing it.

        Args:
            loader: Any iterable of batches.
            epoch: The number to report; default one more than the last (from 0).
        """
        number = self._next_epoch if epoch is None else int(epoch)
        self._next_epoch = number + 1
        return self._timed(loader, number)

    def _timed(self, loader: Iterable[Any], epoch: int) -> Iterator[Any]:
        clock = self._clock
        run: dict[str, Any] = {
            "epoch": epoch,
            "batches": 0,
            "samples": 0,
            "wait_s": 0.0,
            "step_s": 0.0,
            "first_wait_s": 0.0,
            "start": clock(),
            "pending": None,  # when the batch now in the loop body arrived
            "num_workers": getattr(loader, "num_workers", None),
        }
        self._running = run
        complete = False
        try:
            it = iter(loader)
            while True:
                asked = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    complete = True
                    return
                got = clock()
                if run["batches"] == 0:
                    # iter() itself may start the workers: count it with the first wait
                    run["first_wait_s"] = got - run["start"]
                    run["wait_s"] += got - run["start"]
                else:
                    run["wait_s"] += got - asked
                run["batches"] += 1
                n = _batch_len(batch)
                run["samples"] = None if n is None or run["samples"] is None else run["samples"] + n
                run["pending"] = got
                yield batch
                run["pending"] = None
                run["step_s"] += clock() - got
        finally:
            self._finish(run, complete=complete)

    def _snapshot(self, run: dict[str, Any], *, complete: bool) -> EpochStats:
        workers = run["num_workers"]
        return EpochStats(
            epoch=run["epoch"],
            batches=run["batches"],
            samples=run["samples"] if run["batches"] else None,
            wait_s=run["wait_s"],
            step_s=run["step_s"],
            first_wait_s=run["first_wait_s"],
            wall_s=self._clock() - run["start"],
            complete=complete,
            num_workers=workers if isinstance(workers, int) else None,
        )

    def _finish(self, run: dict[str, Any], *, complete: bool) -> None:
        if run["pending"] is not None:  # the loop left during a step: that step counts
            run["step_s"] += self._clock() - run["pending"]
            run["pending"] = None
        stats = self._snapshot(run, complete=complete)
        if self._running is run:
            self._running = None
        self.history.append(stats)
        self.on_epoch_end(stats)

    def epoch_summary(self) -> EpochStats | None:
        """The epoch in progress so far, else the last finished one, else None."""
        if self._running is not None:
            return self._snapshot(self._running, complete=False)
        return self.history[-1] if self.history else None
