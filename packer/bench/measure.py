"""One timed setting: a real ``paddle.io.DataLoader`` over a dataset.

One timed setting: a real ``paddle.io.DataLoader`` over a dataset, run as one endless epoch and
timed after warm-up in rounds, until the rounds agree (`more_rounds`); :class:`BenchConfig`
says what to time, :class:`BenchRow` holds the result and its spread.
"""

from __future__ import annotations

import contextlib
import pickle
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.bench.batches import batch_len, collate, make_transform, nbytes_of
from packer.bench.system import cpu_seconds
from packer.config import usable_cores
from packer.errors import ConfigError
from readers.decode import check_mode

DEFAULT_SECONDS = 1.0
"""Seconds a round lasts when neither ``--seconds`` nor ``--batches`` is given."""
NEAR_BEST = 0.95
"""The recommended setting is the smallest num_workers within this share of the best (or
within the best's spread, when that is wider)."""
MIN_ROUNDS = 3
"""Timed rounds per setting at least: their spread says whether the figure can be trusted."""
STABLE_SPREAD = 0.10
"""Rounds whose (max - min) / median is above this are repeated (up to `max_rounds`)."""


def spread(rates: Sequence[float]) -> float:
    """``(max - min) / median`` of the rounds' samples/s (0.0 for fewer than two rounds)."""
    if len(rates) < 2:
        return 0.0
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else 0.0


def more_rounds(rates: Sequence[float], *, least: int = MIN_ROUNDS) -> bool:
    """Whether to time another round: fewer than `least`, or a spread above `STABLE_SPREAD`.

    Never more than ``3 * least`` rounds: a machine that stays that noisy is reported as too
    busy to tell, rather than timed for ever.
    """
    if len(rates) < least:
        return True
    return len(rates) < 3 * least and spread(rates) > STABLE_SPREAD


@dataclass(frozen=True)
class BenchConfig:
    """What ``packer bench`` measures.

    ``workers`` empty means ``0..usable cores``; values above twice the usable cores are timed
    at that cap (`worker_cap`). A setting is timed in ``rounds`` rounds or more
    (`more_rounds`); a round stops after ``batches`` batches or ``seconds`` seconds, whichever
    comes first; with neither, after :data:`DEFAULT_SECONDS`.
    """

    path: Path
    batch_size: int = 64
    workers: tuple[int, ...] = ()
    batches: int | None = None
    seconds: float | None = None
    warmup: int | None = None
    decode: str = "rgb"
    transform: str = "none"
    compare: Path | None = None
    shared_memory: bool = True
    prefetch_factor: int = 2
    seed: int = 0
    decode_samples: int = 256
    draft: int = 256
    rounds: int = MIN_ROUNDS

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}: must be at least 1")
        if any(w < 0 for w in self.workers):
            raise ConfigError(f"--workers {self.workers}: must be >= 0")
        if self.batches is not None and self.batches < 1:
            raise ConfigError(f"--batches {self.batches}: must be at least 1")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigError(f"--seconds {self.seconds}: must be positive")
        if self.warmup is not None and self.warmup < 0:
            raise ConfigError(f"--warmup {self.warmup}: must be >= 0")
        if self.decode_samples < 0:
            raise ConfigError(f"--decode-samples {self.decode_samples}: must be >= 0 (0 skips)")
        if self.draft < 1:
            raise ConfigError(f"--draft {self.draft}: must be at least 1 (a shorter side)")
        if self.rounds < 2:
            raise ConfigError(f"--rounds {self.rounds}: must be at least 2 (to see the spread)")
        if self.prefetch_factor < 1:
            raise ConfigError(f"--prefetch-factor {self.prefetch_factor}: must be at least 1")
        try:
            check_mode(self.decode)
        except ValueError as exc:
            raise ConfigError(f"--decode: {exc}") from None
        make_transform(self.transform)
        if self.decode == "bytes" and self.transform != "none":
            raise ConfigError("--decode bytes gives undecoded bytes: use --transform none")
        if self.compare is not None and not self.compare.is_dir():
            raise ConfigError(f"--compare {self.compare}: not a directory")

    @property
    def worker_cap(self) -> int:
        """The most num_workers timed: twice the usable cores.

        Above the cores workers compete for them (which the report shows, and which slow
        storage can repay); far above, each costs a process and its memory for nothing, so
        ``--workers 1000000`` is timed at this cap rather than forking a million processes.
        """
        return 2 * usable_cores()

    @property
    def worker_counts(self) -> tuple[int, ...]:
        """The num_workers values to time: those given (each once, at most `worker_cap`).

        Without ``workers``: 0 to the usable cores.
        """
        if not self.workers:
            return tuple(range(usable_cores() + 1))
        return tuple(dict.fromkeys(min(w, self.worker_cap) for w in self.workers))

    @property
    def limit_seconds(self) -> float | None:
        """Seconds a timed round lasts; None when a batch count limits it."""
        if self.seconds is None and self.batches is None:
            return DEFAULT_SECONDS
        return self.seconds

    def warmup_for(self, workers: int) -> int:
        """Batches thrown away first: enough for every worker to start and fill its queue."""
        if self.warmup is not None:
            return self.warmup
        return self.prefetch_factor * max(1, workers) + 1


@dataclass(frozen=True)
class BenchRow:
    """One measured setting."""

    source: str  # "packed" or "loose"
    num_workers: int
    batches: int
    samples: int
    seconds: float
    samples_per_s: float
    cpu_cores: float | None  # CPU seconds (process + workers) per wall second
    mean_wait_ms: float  # time inside next() per batch
    batch_bytes: int
    stacked: bool = True  # images came as one array (False: a list, they differ in size)
    rounds: int = 1  # timed rounds; samples_per_s is their median
    spread: float = 0.0  # (max - min) / median of the rounds' samples/s
    round_samples_per_s: tuple[float, ...] = ()


class EndlessBatches:
    """A batch sampler's epochs one after another, as one endless epoch.

    paddle's persistent DataLoader workers sleep 0.5 s at the start of every epoch
    (``_DataLoaderIterMultiProcess._reset``); one endless epoch times the steady state instead.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Iterator[list[int]]:
        epoch = 0
        while True:
            if hasattr(self.batch_sampler, "set_epoch"):
                self.batch_sampler.set_epoch(epoch)
            empty = True
            for batch in self.batch_sampler:
                empty = False
                yield batch
            if empty:
                return  # an empty dataset: the loader stops at once
            epoch += 1


EPOCH_RESTART_S = 0.5
"""What paddle's persistent workers sleep at the start of each epoch (paddle 2.6 to 3.3)."""


class SampleFailure:
    """A sample's exception, carried to the timing loop in a batch (see :class:`SampleGuard`)."""

    def __init__(self, error: Exception) -> None:
        try:  # a worker's batch is pickled to the main process
            pickle.loads(pickle.dumps(error))
        except Exception:
            error = RuntimeError(f"{type(error).__name__}: {error}")
        self.error = error


class SampleGuard:
    """The dataset and collate the loader runs: a sample's exception reaches the caller.

    paddle does not hand it on (2.6 to 3.3): with ``num_workers=0`` the reading thread dies
    and the loader waits forever; with workers the main process gets a ``SystemError`` about
    a killed blocking queue. Here the exception travels in the batch as a
    :class:`SampleFailure`, and :func:`_next` raises it.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        try:
            return self.dataset[i]
        except Exception as exc:  # raised again in the timing loop
            return SampleFailure(exc)

    def collate(self, batch: list[Any]) -> list[Any]:
        """Collate a batch; a failed sample is passed on in place of the batch."""
        for sample in batch:
            if isinstance(sample, SampleFailure):
                return [np.zeros(1, np.uint8), sample]  # paddle wants an array in every batch
        return collate(batch)


def _next(batches: Iterator[Any]) -> Any:
    try:
        batch = next(batches)
    except StopIteration:
        raise ConfigError("the dataset gives no batches: is it empty?") from None
    if isinstance(batch, list) and len(batch) == 2 and isinstance(batch[1], SampleFailure):
        raise batch[1].error
    return batch


def _shutdown(iterator: Any) -> None:
    """Stop a loader iterator's workers now rather than at garbage collection."""
    stop = getattr(iterator, "_try_shutdown_all", None)
    if callable(stop):
        with contextlib.suppress(Exception):
            stop()


def measure_loader(
    dataset: Any,
    batch_sampler: Any,
    *,
    num_workers: int,
    cfg: BenchConfig,
    source: str = "packed",
) -> BenchRow:
    """Run a real ``paddle.io.DataLoader`` over `dataset` and time it after warm-up."""
    import paddle

    # paddle's annotations want its own Dataset, BatchSampler and collate types; any works
    guard = SampleGuard(dataset)
    options: dict[str, Any] = {
        "dataset": guard,
        "batch_sampler": EndlessBatches(batch_sampler),
        "collate_fn": guard.collate,
    }
    loader = paddle.io.DataLoader(
        num_workers=num_workers,
        use_shared_memory=cfg.shared_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=cfg.prefetch_factor,
        **options,
    )
    batches = iter(loader)
    clock = time.perf_counter
    try:
        batch_bytes, stacked = 0, True
        for _ in range(cfg.warmup_for(num_workers)):
            batch = _next(batches)
            batch_bytes = max(batch_bytes, nbytes_of(batch))
            stacked = stacked and _stacked(batch)
        limit_s, limit_n = cfg.limit_seconds, cfg.batches
        cpu0, start = cpu_seconds(), clock()
        wait, n, samples = 0.0, 0, 0
        rates: list[float] = []
        while more_rounds(rates, least=cfg.rounds):
            round_start, round_n, round_samples = clock(), 0, 0
            while True:
                asked = clock()
                batch = _next(batches)
                got = clock()
                wait += got - asked
                round_n += 1
                round_samples += batch_len(batch)
                if not batch_bytes:
                    batch_bytes = nbytes_of(batch)
                    stacked = _stacked(batch)
                del batch
                if (limit_n is not None and round_n >= limit_n) or (
                    limit_s is not None and got - round_start >= limit_s
                ):
                    break
            round_wall = clock() - round_start
            rates.append(round_samples / round_wall if round_wall > 0 else 0.0)
            n, samples = n + round_n, samples + round_samples
        wall = clock() - start
        cpu1 = cpu_seconds()
    finally:
        _shutdown(batches)
        del batches
    cpu = (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None and wall > 0 else None
    return BenchRow(
        source=source,
        num_workers=num_workers,
        batches=n,
        samples=samples,
        seconds=wall,
        samples_per_s=statistics.median(rates),
        cpu_cores=cpu,
        mean_wait_ms=1e3 * wait / n,
        batch_bytes=batch_bytes,
        stacked=stacked,
        rounds=len(rates),
        spread=spread(rates),
        round_samples_per_s=tuple(rates),
    )


def _stacked(batch: Any) -> bool:
    images = batch[0] if isinstance(batch, list | tuple) else batch
    return getattr(images, "shape", None) is not None


def tolerance(rows: Sequence[BenchRow]) -> float:
    """How far below the best a setting may be and still count as as fast: the noise.

    ``1 - NEAR_BEST``, or the best setting's own spread when that is wider.
    """
    best = max(rows, key=lambda r: r.samples_per_s)
    return max(1 - NEAR_BEST, best.spread)


def recommend(rows: Sequence[BenchRow]) -> BenchRow:
    """The smallest num_workers whose samples/s is within the noise of the best (`tolerance`)."""
    best = max(r.samples_per_s for r in rows)
    floor = (1 - tolerance(rows)) * best
    return min((r for r in rows if r.samples_per_s >= floor), key=lambda r: r.num_workers)


def too_noisy(rows: Sequence[BenchRow]) -> BenchRow | None:
    """The noisiest setting when its rounds still disagree by more than `STABLE_SPREAD`."""
    noisiest = max(rows, key=lambda r: r.spread)
    return noisiest if noisiest.spread > STABLE_SPREAD else None
