"""``ShardStream``: a packed dataset as a ``paddle.io.IterableDataset``, read in sequential runs.

One epoch, for one rank, is built from pure functions of ``(seed, epoch)`` and the layout:

1. **Global order.** ``samplers.chunk_order`` with the window shuffle off: chunks of
   ``chunk_size`` neighbouring ids (never crossing a shard) in shuffled order, ids ascending
   inside each chunk.
2. **Rank share.** ``samplers.split_for_rank``: a contiguous slice, the same length on every
   rank (padded by repeating the order, or dropped, as ``drop_last`` says).
3. **Worker span.** The share is cut into ``V = max(num_workers, 1)`` contiguous spans of
   ``len // V`` or ``len // V + 1`` samples (the first ``len % V`` spans are the longer ones).
   A span is whole chunks, read one after the other, except where a span boundary splits one
   chunk between two neighbouring workers. Spans are cut by count rather than at chunk
   boundaries so that the per-worker counts, and with them the number of batches a
   ``DataLoader`` forms, are the same on every rank (a rank with one batch more would hang
   collective training at the end of the epoch).
4. **Shuffle buffer.** Each worker reads its span in order and mixes it through a buffer of
   ``shuffle_buffer`` samples (``buffer_order``), seeded with ``(seed, epoch, rank, worker)``.
   The buffer holds the *stored* bytes: decoding and ``transform`` run when a sample leaves
   it, so the memory bound is ``shuffle_buffer`` encoded records per worker.

**How paddle interleaves workers** (paddle 3.3, ``paddle/io/dataloader/dataloader_iter.py``):
the loader hands out batch requests to workers through ``itertools.cycle(range(W))``
(``_init_workers``, line 454; ``_try_put_indices``, lines 789-818), skipping workers that
have reported ``StopIteration``, and yields batches in the order it handed the requests out
(``_rcvd_idx``, lines 701-785). Each worker forms its batches from its own samples
(``fetcher.py`` ``_IterableDatasetFetcher.fetch``: a short last batch, or none with
``drop_last``). So the loader yields batch ``r`` of worker ``w`` at the position of
``(r, w)`` in lexicographic order, over the batches that exist: ``loader_batches``.

**Resume, and why it is exact.** ``state_dict(consumed_batches=k, loader=loader)`` records
``k`` with the loader's ``batch_size``, ``num_workers`` and ``drop_last``. From those,
``loader_batches`` gives every worker's count of consumed samples (its first batches, whole)
and the worker ``w*`` whose batch is next. On resume each worker skips its consumed samples
(the buffer is replayed on ids alone, and only the records still in the buffer at that point
are read again), and DataLoader worker ``j`` plays worker ``(j + w*) % V``. Batch ``(r, w)``
of the old run becomes batch ``(r', j)`` of the new one with ``r' * V + j = r * V + w - c``
for one constant ``c`` (the position key of the first remaining batch), so the lexicographic
order, and hence the loader's output, is the rest of the old run batch for batch.

Paddle 3.3 cannot run an ``IterableDataset`` with ``persistent_workers=True``: the loader
asserts "too many indices have been put to queue" when the first worker runs out
(``dataloader_iter.py`` line 790; ``_get_data`` keeps the finished worker's request
outstanding, lines 759-760) and then hangs. Its ``_reset`` also neither restarts the worker cycle
nor keeps ``drop_last`` (``worker.py`` lines 352-354 recreate the fetcher with ``drop_last=True``).
Use ``persistent_workers=False`` (the default): each epoch forks fresh workers, which see the
epoch chosen by ``set_epoch``. A worker asked for a second pass raises instead of repeating
its first epoch.
"""

from __future__ import annotations

import copy
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import paddle

from readers.decode import check_mode, decode_image
from readers.errors import RecordError
from readers.samplers import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    SizedDataset,
    _check_nonneg,
    _dataset_bounds,
    _rank_span,
    check_saved_params,
    chunk_order,
    chunk_ranges,
    split_for_rank,
)

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "ShardStream",
    "buffer_order",
    "loader_batches",
    "worker_counts",
]

DEFAULT_SHUFFLE_BUFFER = DEFAULT_WINDOW * DEFAULT_CHUNK_SIZE
"""Samples per worker's shuffle buffer: they mix across about as many chunks as the sampler's
window (8 chunks of 64). Held as stored bytes: ~50 MB per worker for ImageNet-sized JPEGs."""

STATE_VERSION = 1

IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- pure functions


def worker_counts(n: int, num_workers: int) -> IntArray:
    """Samples each worker of a rank gets: contiguous spans of ``n // V`` or ``n // V + 1``.

    Args:
        n: Samples in the rank's share.
        num_workers: DataLoader workers; 0 (iteration in the main process) counts as 1.

    Returns:
        ``V = max(num_workers, 1)`` counts; the first ``n % V`` are the larger ones.
    """
    _check_nonneg("n", n)
    _check_nonneg("num_workers", num_workers)
    v = max(int(num_workers), 1)
    counts = np.full(v, n // v, dtype=np.int64)
    counts[: n % v] += 1
    return counts


def buffer_order(m: int, *, buffer: int, rng: np.random.Generator) -> IntArray:
    """The order in which a shuffle buffer of ``buffer`` slots emits inputs ``0 .. m-1``.

    The buffer is the usual one, computed on positions without a Python loop::

        slots = []
        for t in range(m):                       # read input t
            if t < buffer:
                slots.append(t)                  # filling
            else:
                j = draws[t - buffer]            # draws = rng.integers(0, buffer, m - buffer)
                emit(slots[j]); slots[j] = t
        for j in rng.permutation(len(slots)):    # drain
            emit(slots[j])

    Output ``o`` is emitted after inputs ``0 .. min(o + buffer, m) - 1`` have been read, and
    is one of them: ``order[o] < o + buffer``.

    Args:
        m: Number of inputs.
        buffer: Slots; 1 (or 0) keeps the input order.
        rng: The generator the draws come from.

    Returns:
        A permutation of ``0 .. m-1`` (int64).
    """
    _check_nonneg("m", m)
    _check_nonneg("buffer", buffer)
    if buffer <= 1 or m <= 1:
        return np.arange(m, dtype=np.int64)
    steps = m - buffer
    if steps <= 0:
        return rng.permutation(m).astype(np.int64)
    draws = rng.integers(0, buffer, size=steps, dtype=np.int64)
    # Step s (input buffer + s) emits the occupant of slot draws[s]: the input placed there at
    # the previous step that drew the same slot, or the slot's first input (= the slot number).
    by_slot = np.argsort(draws, kind="stable")
    slot = draws[by_slot]
    first = np.ones(steps, dtype=np.bool_)
    first[1:] = slot[1:] != slot[:-1]
    previous = np.empty(steps, dtype=np.int64)
    previous[0] = 0
    previous[1:] = by_slot[:-1] + buffer
    out = np.empty(m, dtype=np.int64)
    out[by_slot] = np.where(first, slot, previous)
    last = np.ones(steps, dtype=np.bool_)
    last[:-1] = slot[1:] != slot[:-1]
    final = np.arange(buffer, dtype=np.int64)
    final[slot[last]] = by_slot[last] + buffer
    out[steps:] = final[rng.permutation(buffer)]
    return out


def loader_batches(
    counts: npt.ArrayLike, *, batch_size: int, drop_last: bool
) -> tuple[IntArray, IntArray, IntArray]:
    """The batches ``paddle.io.DataLoader`` yields from workers with these sample counts.

    Worker ``w`` forms batches of ``batch_size`` from its own samples (the last one short, or
    dropped with ``drop_last``); the loader yields batch ``r`` of worker ``w`` in the
    lexicographic order of ``(r, w)`` (see the module docstring).

    Args:
        counts: Samples per worker (``worker_counts``).
        batch_size: The loader's ``batch_size``.
        drop_last: The loader's ``drop_last``.

    Returns:
        ``(worker, round, size)`` of every batch, in the order the loader yields them.
    """
    _check_nonneg("batch_size", batch_size, 1)
    c = np.asarray(counts, dtype=np.int64)
    v = c.size
    nb = c // batch_size if drop_last else -(-c // batch_size)
    worker = np.repeat(np.arange(v, dtype=np.int64), nb)
    rnd = np.arange(worker.size, dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)
    order = np.argsort(rnd * v + worker, kind="stable")
    worker, rnd = worker[order], rnd[order]
    size = np.minimum(batch_size, c[worker] - rnd * batch_size)
    return worker, rnd, size


def _runs(ids: IntArray, chunk_lo: IntArray) -> tuple[IntArray, IntArray]:
    """Sequential runs of ``ids``: ``run[p]`` for each position, and each run's last position.

    A run is a stretch of consecutive ascending ids inside one chunk.
    """
    if ids.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    chunk = np.searchsorted(chunk_lo, ids, side="right")
    start = np.ones(ids.size, dtype=np.bool_)
    start[1:] = (ids[1:] != ids[:-1] + 1) | (chunk[1:] != chunk[:-1])
    run = np.cumsum(start) - 1
    last = np.flatnonzero(np.append(start[1:], True))
    return run.astype(np.int64), last.astype(np.int64)


# --------------------------------------------------------------------------- the stream


@dataclass(frozen=True)
class _Resume:
    """Where the saved epoch continues: samples each worker skips, and the worker rotation."""

    epoch: int
    num_workers: int  # as the loader had them (0: in-process)
    skip: tuple[int, ...]  # per worker of the saved run
    rotation: int  # DataLoader worker j plays saved worker (j + rotation) % V


def _worker_info() -> Any:
    """paddle's worker info in a DataLoader worker, else None (a seam for tests)."""
    return paddle.io.get_worker_info()


class ShardStream(paddle.io.IterableDataset[Any]):
    """A packed dataset as an ``IterableDataset``: sequential reads, a shuffle buffer, ranks.

    Each DataLoader worker reads its own span of this rank's share in order and mixes it
    through a bounded shuffle buffer (see the module docstring for the order). Items are
    ``(image, label)`` as from the map-style datasets.

    Use ``paddle.io.DataLoader(stream, batch_size=..., num_workers=...)`` with the default
    ``persistent_workers=False``, call ``set_epoch`` before each epoch, and save
    ``state_dict(consumed_batches=step, loader=loader)`` to resume mid-epoch exactly.

    Args:
        source: A dataset directory (opened with ``readers.open_dataset``), or an open
            map-style dataset: ``len``, ``shard_bounds``, ``ds[i] -> (image, label)``. A
            packed dataset (one with ``decode`` and ``transform`` attributes) is read as
            stored bytes from a copy and decoded here; any other is read with ``ds[i]`` and
            its items are passed through untouched.
        transform: Applied to the decoded image. Default: the dataset's own, if ``source``
            is a dataset.
        decode: ``rgb``, ``bgr``, ``gray``, ``unchanged`` or ``bytes``. Default: the
            dataset's own, if ``source`` is a dataset, else ``rgb``.
        chunk_size: Neighbouring samples per chunk of the global order.
        shuffle: False reads the rank's share in id order, without the buffer.
        shuffle_buffer: Samples per worker's shuffle buffer; 1 keeps each worker's read order.
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop the remainder so ranks get ``n // world_size`` samples each, instead
            of padding to ``ceil(n / world_size)``.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | SizedDataset,
        *,
        transform: Callable[[Any], Any] | None = None,
        decode: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        shuffle: bool = True,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        _check_nonneg("chunk_size", chunk_size, 1)
        _check_nonneg("shuffle_buffer", shuffle_buffer, 1)
        _check_nonneg("seed", seed)
        if decode is not None:
            check_mode(decode)
        if rank is None or world_size is None:
            import paddle.distributed as dist

            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        _check_nonneg("world_size", world_size, 1)
        _check_nonneg("rank", rank)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size, got rank={rank} world_size={world_size}")

        dataset: Any = source
        opened = False
        if isinstance(source, str | os.PathLike):
            from readers.datasets import open_dataset

            dataset, opened = open_dataset(source, decode="bytes"), True
            decode = "rgb" if decode is None else decode
        self._packed = hasattr(dataset, "decode") and hasattr(dataset, "transform")
        if self._packed and not opened:
            # Our own copy reads the stored bytes; copy.copy goes through __getstate__, so
            # the copy starts without the original's handles.
            decode = dataset.decode if decode is None else decode
            transform = dataset.transform if transform is None else transform
            dataset = copy.copy(dataset)
            dataset.decode = "bytes"
            dataset.transform = None
        elif not self._packed and (decode is not None or transform is not None):
            raise ValueError(
                f"decode= and transform= apply to packed datasets (with .decode and "
                f".transform); {type(dataset).__name__} has neither, so its items are yielded "
                "as they are: decode and transform in the dataset instead"
            )
        self.dataset = dataset
        self.decode = decode
        self.transform = transform
        self._bounds = _dataset_bounds(dataset)
        self._chunk_size = int(chunk_size)
        self._shuffle = bool(shuffle)
        self._buffer = int(shuffle_buffer) if shuffle else 1
        self._seed = int(seed)
        self._drop_last = bool(drop_last)
        self._rank = int(rank)
        self._world_size = int(world_size)
        self._epoch = 0
        self._resume: _Resume | None = None
        self._worker_passes = 0  # passes started by this copy inside a DataLoader worker
        self._fingerprint: int | None = None

    # ------------------------------------------------------------------ properties
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def __len__(self) -> int:  # type: ignore[override]
        """Samples this rank yields per epoch (every rank the same)."""
        start, stop = _rank_span(
            int(self._bounds[-1]),
            rank=self._rank,
            world_size=self._world_size,
            drop_last=self._drop_last,
        )
        return stop - start

    def batches_per_epoch(self, loader: Any) -> int:
        """Batches ``loader`` yields per epoch on this rank (the same on every rank).

        ``len(DataLoader)`` is not defined for an ``IterableDataset``; use this for learning
        rate schedules. ``loader`` needs ``batch_size``, ``num_workers`` and ``drop_last``.
        """
        batch_size, num_workers, drop = _loader_shape(loader)
        counts = worker_counts(len(self), num_workers)
        return int(loader_batches(counts, batch_size=batch_size, drop_last=drop)[0].size)

    # ------------------------------------------------------------------ orders
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next pass yields; another epoch than a resumed one starts at 0.

        Call it before creating the epoch's DataLoader iterator: workers copy the stream when
        they start.
        """
        _check_nonneg("epoch", epoch)
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._resume = None

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """This rank's share of the global order for ``epoch`` (default: the current one)."""
        epoch = self._epoch if epoch is None else epoch
        order = chunk_order(
            self._bounds,
            chunk_size=self._chunk_size,
            window=0,
            seed=self._seed,
            epoch=epoch,
            shuffle=self._shuffle,
        )
        share = split_for_rank(
            order, rank=self._rank, world_size=self._world_size, drop_last=self._drop_last
        )
        return share.copy() if share.size < order.size else share  # let the order be freed

    def _worker_plan(self, epoch: int, worker: int, num_workers: int) -> tuple[IntArray, IntArray]:
        """The ids a worker reads, in read order, and the order its buffer emits them in."""
        share = self.rank_order(epoch)
        counts = worker_counts(share.size, num_workers)
        if not 0 <= worker < counts.size:
            raise ValueError(f"need 0 <= worker < {counts.size}, got {worker}")
        start = int(counts[:worker].sum())
        ids = share[start : start + int(counts[worker])]
        rng = np.random.default_rng([self._seed, int(epoch), self._rank, int(worker)])
        return ids, buffer_order(ids.size, buffer=self._buffer, rng=rng)

    def worker_order(
        self, worker: int = 0, num_workers: int = 0, epoch: int | None = None
    ) -> IntArray:
        """The ids worker ``worker`` of ``num_workers`` yields in ``epoch`` (no resume applied).

        ``num_workers=0`` is iteration in the main process: the whole rank's stream.
        """
        epoch = self._epoch if epoch is None else epoch
        ids, order = self._worker_plan(epoch, worker, num_workers)
        return ids[order]

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        info = _worker_info()
        if info is None:
            worker, num_workers = 0, 0
        else:
            worker, num_workers = int(info.id), int(info.num_workers)
            self._worker_passes += 1
        # Read the epoch and resume point now: the pass is the one chosen when it started.
        return self._items(self._epoch, self._resume, worker, num_workers, self._worker_passes)

    def _items(
        self,
        epoch: int,
        resume: _Resume | None,
        worker: int,
        num_workers: int,
        passes: int,
    ) -> Iterator[Any]:
        # A generator: errors surface at the first batch, where paddle re-raises them in the
        # main process with their message (an error in iter() kills the worker instead).
        if passes > 1:
            raise RuntimeError(
                "ShardStream was asked for a second pass inside one DataLoader worker, i.e. "
                "with persistent_workers=True; the worker's copy would repeat its first epoch "
                "(set_epoch does not reach it), and paddle 3.3 cannot run an IterableDataset "
                "with persistent workers; use persistent_workers=False"
            )
        skip = 0
        logical = worker
        if resume is not None and resume.epoch == epoch:
            if max(resume.num_workers, 1) != max(num_workers, 1):
                raise ValueError(
                    f"cannot resume: the state was saved for num_workers={resume.num_workers}, "
                    f"but this pass runs with num_workers={num_workers}; each worker's order "
                    "depends on the number of workers, so resume with the saved num_workers "
                    "and batch_size"
                )
            logical = (worker + resume.rotation) % max(num_workers, 1)
            skip = resume.skip[logical]
        ids, order = self._worker_plan(epoch, logical, num_workers)
        yield from self._serve(ids, order, skip)

    def _serve(self, ids: IntArray, order: IntArray, skip: int) -> Iterator[Any]:
        """Read ``ids`` in order, emit them in ``order`` from ``skip`` on, holding at most
        ``shuffle_buffer`` records (the bound ``order[o] < o + buffer`` of buffer_order)."""
        m = ids.size
        k = self._buffer
        prefetch = getattr(self.dataset, "prefetch", None)
        if callable(prefetch):
            lo, _ = chunk_ranges(self._bounds, chunk_size=self._chunk_size)
            run, run_last = _runs(ids, lo)
        hinted = -1
        held: dict[int, Any] = {}

        def read(p: int) -> None:
            nonlocal hinted
            if callable(prefetch) and run[p] != hinted:
                hinted = int(run[p])
                prefetch(int(ids[p]), int(ids[run_last[hinted]]) + 1)
            held[p] = self.dataset[int(ids[p])]

        nxt = 0
        if skip:
            # Replay the buffer on positions: what it holds after `skip` outputs is every
            # input read by then that was not emitted yet.
            nxt = min(skip + k, m)
            pending = np.ones(nxt, dtype=np.bool_)
            pending[order[:skip]] = False
            for p in np.flatnonzero(pending).tolist():
                read(p)
        for o in range(skip, m):
            stop = min(o + k, m)
            while nxt < stop:
                read(nxt)
                nxt += 1
            p = int(order[o])
            yield self._finish(int(ids[p]), held.pop(p))

    def _finish(self, i: int, item: Any) -> Any:
        if not self._packed:
            return item
        image, label = item
        if self.decode != "bytes":
            try:
                image = decode_image(image, str(self.decode))
            except ValueError as exc:
                raise RecordError(
                    f"{getattr(self.dataset, 'root', type(self.dataset).__name__)} sample {i}: "
                    f"cannot decode ({exc})"
                ) from exc
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    # ------------------------------------------------------------------ resume
    def _params(self) -> dict[str, Any]:
        if self._fingerprint is None:
            self._fingerprint = zlib.crc32(self._bounds.astype("<i8").tobytes())
        return {
            "seed": self._seed,
            "chunk_size": self._chunk_size,
            "shuffle": self._shuffle,
            "shuffle_buffer": self._buffer,
            "drop_last": self._drop_last,
            "world_size": self._world_size,
            "num_samples": int(self._bounds[-1]),
            "shards_crc32": self._fingerprint,
        }

    def state_dict(
        self,
        consumed_samples: int | None = None,
        *,
        consumed_batches: int | None = None,
        loader: Any = None,
    ) -> dict[str, Any]:
        """The resume state: epoch, how far training got in it, and the order parameters.

        Give the progress of the current epoch, counted from its start (including what came
        before any resume), as ``consumed_batches`` or ``consumed_samples``. With
        ``num_workers > 0`` the loader's batch layout decides which samples those were, so
        pass ``loader`` (or any object with its ``batch_size``, ``num_workers`` and
        ``drop_last``). Without ``loader`` the stream is taken to be iterated in the main
        process (``num_workers=0``), where any sample count is a valid point. Every rank has
        the same batches, so the state saved on rank 0 resumes every rank.

        Raises:
            ValueError: no progress, both, more than the epoch holds, or ``consumed_samples``
                that falls inside a batch.
        """
        if (consumed_samples is None) == (consumed_batches is None):
            raise ValueError("give consumed_samples or consumed_batches (exactly one)")
        if loader is None:
            if consumed_batches is not None:
                raise ValueError(
                    "consumed_batches needs loader= (its batch_size, num_workers, drop_last)"
                )
            batch_size, num_workers, drop = 1, 0, False
        else:
            batch_size, num_workers, drop = _loader_shape(loader)
        counts = worker_counts(len(self), num_workers)
        _, _, size = loader_batches(counts, batch_size=batch_size, drop_last=drop)
        ends = np.cumsum(size)
        if consumed_batches is not None:
            _check_nonneg("consumed_batches", consumed_batches)
            if consumed_batches > size.size:
                raise ValueError(
                    f"consumed_batches={consumed_batches} exceeds the {size.size} batches this "
                    f"loader yields per epoch on a rank"
                )
            k = int(consumed_batches)
        else:
            assert consumed_samples is not None
            _check_nonneg("consumed_samples", consumed_samples)
            k = int(np.searchsorted(ends, consumed_samples, side="left")) + 1
            if consumed_samples == 0:
                k = 0
            elif k > size.size or ends[k - 1] != consumed_samples:
                total = int(ends[-1]) if ends.size else 0
                if consumed_samples > total:
                    raise ValueError(
                        f"consumed_samples={consumed_samples} exceeds the {total} samples this "
                        "loader yields per epoch on a rank"
                    )
                before = int(ends[k - 2]) if k >= 2 else 0
                raise ValueError(
                    f"consumed_samples={consumed_samples} falls inside batch {k - 1} (samples "
                    f"{before}..{int(ends[k - 1])}); with {num_workers} workers batches are "
                    "formed per worker, so give a batch boundary or consumed_batches"
                )
        state = {
            "version": STATE_VERSION,
            "kind": "ShardStream",
            "epoch": self._epoch,
            "consumed_batches": k,
            "consumed_samples": int(ends[k - 1]) if k else 0,
            "batch_size": batch_size,
            "num_workers": num_workers,
            "drop_last_batch": drop,
        }
        return state | self._params()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: passes over the saved epoch continue where the saved run stopped.

        The resume point holds until ``set_epoch`` chooses another epoch (whatever the number
        of workers: a worker's copy cannot report back that its pass ended). Iterate with a
        loader of the saved ``batch_size``, ``num_workers`` and ``drop_last``.

        Raises:
            ValueError: the state is incomplete, or was saved with other order parameters or
                another dataset layout (the order would differ, so resuming would repeat some
                samples and skip others).
        """
        params = self._params()
        keys = ("epoch", "consumed_batches", "batch_size", "num_workers", "drop_last_batch")
        required = {"version", "kind", *keys, *params}
        missing = sorted(required - state.keys())
        if missing:
            raise ValueError(f"stream state is missing {missing}; was it saved by state_dict()?")
        if state["kind"] != "ShardStream" or state["version"] != STATE_VERSION:
            raise ValueError(
                f"stream state kind {state['kind']!r} version {state['version']} is not "
                f"supported (this reads ShardStream version {STATE_VERSION})"
            )
        check_saved_params(
            state,
            params,
            what="stream",
            advice="build the stream with the saved parameters over the same dataset",
        )
        epoch, k = state["epoch"], state["consumed_batches"]
        batch_size, num_workers = state["batch_size"], state["num_workers"]
        for name, value, minimum in (
            ("epoch", epoch, 0),
            ("consumed_batches", k, 0),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
        ):
            _check_nonneg(name, value, minimum)
        counts = worker_counts(len(self), num_workers)
        worker, _, size = loader_batches(
            counts, batch_size=batch_size, drop_last=bool(state["drop_last_batch"])
        )
        if k > size.size:
            raise ValueError(f"saved consumed_batches={k} exceeds the {size.size} batches")
        skip = np.bincount(worker[:k], weights=size[:k], minlength=counts.size)
        self._epoch = int(epoch)
        self._resume = _Resume(
            epoch=int(epoch),
            num_workers=int(num_workers),
            skip=tuple(int(s) for s in skip),
            rotation=int(worker[k]) if k < worker.size else 0,
        )


def _loader_shape(loader: Any) -> tuple[int, int, bool]:
    """(batch_size, num_workers, drop_last) of a DataLoader; no batching counts as 1."""
    try:
        batch_size, num_workers, drop = loader.batch_size, loader.num_workers, loader.drop_last
    except AttributeError as exc:
        raise ValueError(
            f"loader must have batch_size, num_workers and drop_last, like "
            f"paddle.io.DataLoader; got {type(loader).__name__} ({exc})"
        ) from exc
    batch_size = 1 if batch_size is None else int(batch_size)
    _check_nonneg("batch_size", batch_size, 1)
    _check_nonneg("num_workers", int(num_workers))
    return batch_size, int(num_workers), bool(drop) and batch_size > 1
