"""``ShardStream``: a packed dataset as a ``paddle.io.IterableDataset``, read in sequential runs.

One epoch, for one rank, is built from pure functions of ``(seed, epoch)`` and the layout:

1. **Global order.** ``readers.order.chunk_order`` with the window shuffle off: chunks of
   ``chunk_size`` neighbouring ids (never crossing a shard) in shuffled order, ids ascending
   inside each chunk.
2. **Rank share.** ``readers.order.split_for_rank``: a contiguous slice, the same length on every
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

**Resume at another world size.** A state saved with ``N`` ranks loads into a stream built
with ``M``: every saved rank's consumed samples follow from the same accounting (each
worker's first emitted samples, replayed from the seeds), the rest of the epoch is the
samples no rank consumed, and the ``M`` ranks split that rest as a fresh epoch is split
(``readers.resume``); any ``num_workers`` and ``batch_size`` may be used from there, and
consumed batches count from the resume point.

**Persistent workers are refused.** Paddle 3.3 cannot run any ``IterableDataset`` with
``persistent_workers=True`` and ``num_workers > 0``: the loader asserts "too many indices have
been put to queue" when the first worker runs out (``dataloader_iter.py`` line 790;
``_get_data`` keeps the finished worker's request outstanding, lines 759-760) and then hangs,
in the first epoch or a later one. Its ``_reset`` also neither restarts the worker cycle nor
keeps ``drop_last`` (``worker.py`` lines 352-354 recreate the fetcher with ``drop_last=True``),
and ``set_epoch`` would not reach the workers' copies. Nothing of the dataset runs in the main
process when such a loader is made or iterated, so the stream refuses it where it can:
``set_epoch`` (in the main process, before the epoch: it looks for a loader over the stream
among the objects that refer to it) and ``batches_per_epoch``/``state_dict`` (given the loader)
raise ``ValueError``; a worker forked by such a loader (whose frames it still has below the
fork) fails its first batch with the same message, which paddle prints, rather than hanging.
Use ``persistent_workers=False`` (the default): each epoch forks fresh workers, which see the
epoch chosen by ``set_epoch``. A worker asked for a second pass (a loader the checks could not
see, e.g. spawned workers) raises instead of repeating its first epoch.

**Several datasets.** Given a list of datasets (or a ``readers.ConcatDataset``), the stream
reads their concatenation (ids offset per source, each source decoded with its own mode and
transform). With ``weights=``/``epoch_samples=`` step 1 is the weighted mixture of
:mod:`readers.mixing` (mix="epoch", window off: exact per-source counts, passes that continue
across epochs, segments of one source's chunk each); steps 2-4 are unchanged.

**Augmentation.** A transform that takes a keyword ``rng`` gets the generator of
``(seed, epoch, id)`` (`readers.augment_rng`: the id in the concatenation of several sources),
so its draws do not depend on the worker, the number of ranks or the resume point.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import paddle

from readers.concat import open_stream_sources
from readers.elastic import ConsumedInShare, Segment, stream_consumed
from readers.epochs import DEFAULT_WINDOW, RankedEpochs
from readers.io.hints import DEFAULT_CHUNK_SIZE, resolve_chunk_size
from readers.mixture import Mixture, mixture_of
from readers.order import (
    IntArray,
    buffer_order,
    check_nonneg,
    chunk_ranges,
    loader_batches,
    worker_buffer_order,
    worker_counts,
    worker_slice,
)
from readers.reweight import changed_mixtures, reweighted_order
from readers.selection import SizedDataset, dataset_bounds
from readers.stream_reader import serve
from readers.stream_resume import StreamResume, loader_shape, read_stream_state, stream_state

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "ShardStream",
    "buffer_order",
    "loader_batches",
    "worker_counts",
]

DEFAULT_SHUFFLE_BUFFER = DEFAULT_WINDOW * DEFAULT_CHUNK_SIZE
"""The fewest samples a default shuffle buffer holds (8 chunks of 64). The default buffer is
``DEFAULT_WINDOW`` chunks: it mixes across as many chunks as the sampler's window, about
8 MiB of stored bytes with size-based chunks (``readers.io.hints.CHUNK_BYTES``)."""


PERSISTENT_WORKERS = (
    "ShardStream cannot be read by a DataLoader with persistent_workers=True and num_workers "
    "> 0: paddle 3.3 cannot run any IterableDataset with persistent workers (the loader asserts "
    "'too many indices have been put to queue' when the first worker runs out, then hangs), and "
    "set_epoch would not reach the workers' copies; make the DataLoader with "
    "persistent_workers=False (the default): each epoch then starts fresh workers, which read "
    "the epoch set_epoch chose"
)
"""Why a loader with persistent workers is refused (see the module docstring)."""


def _persistent_over(attrs: Any, stream: Any) -> bool:
    """Whether `attrs` are a loader's (or loader iterator's) over `stream`, with persistent workers.

    As paddle's ``DataLoader`` and ``_DataLoaderIterMultiProcess`` hold them: ``dataset``
    (``_dataset``), ``_persistent_workers`` and a worker count above 0.
    """
    if not isinstance(attrs, dict) or not attrs.get("_persistent_workers"):
        return False
    if attrs.get("dataset") is not stream and attrs.get("_dataset") is not stream:
        return False
    workers = attrs.get("num_workers", attrs.get("_num_workers"))
    return isinstance(workers, int) and workers > 0


def refuse_persistent_loader(stream: Any, loader: Any = None) -> None:
    """Raise ValueError when `loader`, or any loader over `stream`, keeps persistent workers.

    Without `loader`, the loaders are found among the objects that refer to `stream`
    (``gc.get_referrers``: one pass over the tracked objects, about 10 ms per 100,000).
    """
    if loader is not None:
        attrs = dict(getattr(loader, "__dict__", {}), dataset=stream)
        if _persistent_over(attrs, stream):
            raise ValueError(PERSISTENT_WORKERS)
        return
    for ref in gc.get_referrers(stream):
        if _persistent_over(
            ref if isinstance(ref, dict) else getattr(ref, "__dict__", None), stream
        ):
            raise ValueError(PERSISTENT_WORKERS)


def references(obj: Any) -> int:
    """``sys.getrefcount(obj)``, called as ``ShardStream.set_epoch`` calls it (`ALONE`)."""
    return sys.getrefcount(obj)


class _HeldOnce:
    """An object held by one variable, whose method is called as ``stream.set_epoch(e)``."""

    def set_epoch(self, epoch: int) -> int:
        return references(self) + 0 * epoch


def _alone() -> int:
    probe = _HeldOnce()
    return probe.set_epoch(0)


ALONE = _alone()
"""`references` of a stream held by one variable, inside ``set_epoch``. A DataLoader holds
two more (its ``dataset`` and its sampler's), so at or below this count no loader can hold
the stream and ``set_epoch`` skips the ``gc`` search. Measured rather than assumed: the count
depends on the interpreter."""


def _forked_by_persistent_loader(stream: Any) -> bool:
    """In a DataLoader worker: whether the loader that forked it keeps persistent workers.

    A forked worker runs on from inside ``os.fork()``, so the frames of the loader process
    that forked it (the loader iterator's ``__init__`` or ``_reset``) are still below this one.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and _persistent_over(getattr(owner, "__dict__", None), stream):
            return True
        frame = frame.f_back
    return False


_SECOND_PASS = (
    "ShardStream was asked for a second pass inside one DataLoader worker, i.e. with "
    "persistent_workers=True; the worker's copy would repeat its first epoch (set_epoch does "
    "not reach it), and paddle 3.3 cannot run an IterableDataset with persistent workers; use "
    "persistent_workers=False"
)


def _order_size(
    dataset: Any, chunk_size: int | None, weights: Any, epoch_samples: int | None
) -> tuple[Mixture | None, int, int]:
    """The mixture, the chunk size, and the samples of the global order of an epoch.

    The mixture is None without weights or epoch_samples.
    """
    if weights is None and epoch_samples is None:
        return None, resolve_chunk_size(dataset, chunk_size, None), len(dataset)
    mix = mixture_of(
        dataset, ids=None, chunk_size=chunk_size, weights=weights, epoch_samples=epoch_samples
    )
    return mix, mix.mean_chunk_size(), mix.num_ordered


def _worker_info() -> Any:
    """Paddle's worker info in a DataLoader worker, else None (a seam for tests)."""
    return paddle.io.get_worker_info()


class ShardStream(RankedEpochs, paddle.io.IterableDataset[Any]):
    """A packed dataset as an ``IterableDataset``: sequential reads, a shuffle buffer, ranks.

    Each DataLoader worker reads its own span of this rank's share in order and mixes it
    through a bounded shuffle buffer (see the module docstring for the order). Items are
    ``(image, label)`` as from the map-style datasets.

    Use ``paddle.io.DataLoader(stream, batch_size=..., num_workers=...)`` with the default
    ``persistent_workers=False`` (persistent workers are refused: see the module docstring),
    call ``set_epoch`` before each epoch, and save
    ``state_dict(consumed_batches=step, loader=loader)`` to resume mid-epoch exactly.

    Args:
        source: A dataset directory (opened with ``readers.open_dataset``), or an open
            map-style dataset: ``len``, ``shard_bounds``, ``ds[i] -> (image, label)``. A
            packed dataset (one with ``decode`` and ``transform`` attributes) is read as
            stored bytes from a copy and decoded here; any other is read with ``ds[i]`` and
            its items are passed through untouched. A list of these, or a
            ``readers.ConcatDataset``, reads their concatenation (ids offset per source).
        transform: Applied to the decoded image. Default: the dataset's own, if ``source``
            is a dataset.
        decode: ``rgb``, ``bgr``, ``gray``, ``unchanged`` or ``bytes``. Default: the
            dataset's own, if ``source`` is a dataset, else ``rgb``.
        draft: ``S`` (shorter side) or ``(H, W)``: decode JPEGs at the largest DCT reduction
            that keeps them at least that large, as the datasets' ``draft=``. Default: the
            dataset's own, if ``source`` is a dataset, else None (full size).
        chunk_size: Neighbouring samples per chunk of the global order; default (None): as
            the samplers choose it, about ``CHUNK_BYTES`` (1 MiB) of stored bytes by the
            dataset's index, 64 to 4096 samples (64 without an index). The value used is
            ``.chunk_size`` and is part of the resume state.
        shuffle: False reads the rank's share in id order, without the buffer.
        shuffle_buffer: Samples per worker's shuffle buffer; 1 keeps each worker's read order.
            Default (None): ``DEFAULT_WINDOW`` (8) chunks, ``8 * chunk_size`` samples (at
            least 512; about 8 MiB of stored bytes with the default chunks, held per worker).
            Part of the resume state.
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop the remainder so ranks get ``n // world_size`` samples each, instead
            of padding to ``ceil(n / world_size)``.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
        cache_dir, cache_limit: With a directory ``source``: read its node-local copy,
            ``readers.staging.stage(source, cache_dir, cache_limit=cache_limit)``.
        weights, epoch_samples: With several sources: a weighted mixture, exact counts per
            source per epoch, as ``ChunkShuffleSampler`` draws it (mix="epoch" only).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | SizedDataset | Sequence[Any],
        *,
        transform: Callable[[Any], Any] | None = None,
        decode: str | None = None,
        draft: int | tuple[int, int] | None = None,
        chunk_size: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        weights: Sequence[float] | None = None,
        epoch_samples: int | None = None,
    ) -> None:
        super().__init__()
        if chunk_size is not None:
            check_nonneg("chunk_size", chunk_size, 1)
        if shuffle_buffer is not None:
            check_nonneg("shuffle_buffer", shuffle_buffer, 1)
        check_nonneg("seed", seed)
        self._input = open_stream_sources(
            source,
            decode=decode,
            transform=transform,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            draft=draft,
        )
        self.dataset, self.decode, self.transform = self._input.opened(decode, transform)
        self.draft = self._input.draft
        self._bounds = dataset_bounds(self.dataset)
        self._mix, size, count = _order_size(self.dataset, chunk_size, weights, epoch_samples)
        self._setup_epochs(
            rank=rank,
            world_size=world_size,
            seed=seed,
            chunk_size=size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_ordered=count,
        )
        if shuffle_buffer is None:
            shuffle_buffer = max(DEFAULT_SHUFFLE_BUFFER, DEFAULT_WINDOW * self._chunk_size)
        self._buffer = int(shuffle_buffer) if shuffle else 1
        self._resume: StreamResume | None = None
        self._worker_passes = 0  # passes started by this copy inside a DataLoader worker

    # ------------------------------------------------------------------ properties
    @property
    def shuffle_buffer(self) -> int:
        """Samples per worker's shuffle buffer (1 without shuffling)."""
        return self._buffer

    @property
    def mixture(self) -> Mixture | None:
        """The weighted mixture of the sources, or None without one."""
        return self._mix

    def __len__(self) -> int:  # type: ignore[override]
        """Samples this rank yields per epoch (every rank the same)."""
        return RankedEpochs.__len__(self)

    def batches_per_epoch(self, loader: Any) -> int:
        """Batches ``loader`` yields per epoch on this rank (the same on every rank).

        ``len(DataLoader)`` is not defined for an ``IterableDataset``; use this for learning
        rate schedules. ``loader`` needs ``batch_size``, ``num_workers`` and ``drop_last``.
        """
        refuse_persistent_loader(self, loader)
        batch_size, num_workers, drop = loader_shape(loader)
        counts = worker_counts(len(self), num_workers)
        return int(loader_batches(counts, batch_size=batch_size, drop_last=drop)[0].size)

    # ------------------------------------------------------------------ orders
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next pass yields; another epoch than a resumed one starts at 0.

        Call it before creating the epoch's DataLoader iterator: workers copy the stream when
        they start. Raises ValueError when a DataLoader over the stream keeps persistent workers.
        """
        if references(self) > ALONE:  # held more than once: a DataLoader may be a holder
            refuse_persistent_loader(self)
        super().set_epoch(epoch)

    def _start_epoch(self) -> None:
        self._resume = None

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """This rank's share of the global order for ``epoch`` (default: the current one)."""
        epoch = self._epoch if epoch is None else epoch
        if self._mix is None:
            return self._rank_share(self._bounds, epoch=epoch, window=0)
        if self._rest is not None and epoch == self._epoch:  # after an elastic load
            return self._share_of(_stream_order(self, self._mix, epoch), epoch)
        return self._mix.rank_share(epoch, window=0, **self._split_args())

    def _worker_plan(self, epoch: int, worker: int, num_workers: int) -> tuple[IntArray, IntArray]:
        """The ids a worker reads, in read order, and the order its buffer emits them in."""
        share = self.rank_order(epoch)
        ids = share[worker_slice(share.size, worker=worker, num_workers=num_workers)]
        order = worker_buffer_order(
            ids.size,
            buffer=self._buffer,
            seed=self._seed,
            epoch=epoch,
            rank=self._rank,
            worker=worker,
        )
        return ids, order

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
            if _forked_by_persistent_loader(self):
                self._worker_passes = -1  # `_items` refuses it
        # Read the epoch and resume point now: the pass is the one chosen when it started.
        return self._items(self._epoch, self._resume, worker, num_workers, self._worker_passes)

    def _items(
        self,
        epoch: int,
        resume: StreamResume | None,
        worker: int,
        num_workers: int,
        passes: int,
    ) -> Iterator[Any]:
        # A generator: errors surface at the first batch, where paddle re-raises them in the
        # main process with their message (an error in iter() kills the worker instead).
        if passes < 0:
            raise ValueError(PERSISTENT_WORKERS)
        if passes > 1:
            raise RuntimeError(_SECOND_PASS)
        skip = 0
        logical = worker
        if resume is not None and resume.epoch == epoch:
            logical, skip = resume.worker(worker, num_workers)
        ids, order = self._worker_plan(epoch, logical, num_workers)
        if self._mix is None:
            lo, _ = chunk_ranges(self._bounds, chunk_size=self._chunk_size)
        else:
            lo, _ = self._mix.chunk_table()
        yield from serve(
            self.dataset,
            ids,
            order,
            skip,
            buffer=self._buffer,
            chunk_lo=lo,
            finish=self._input.finisher(self._seed, epoch),
        )

    # ------------------------------------------------------------------ resume
    def _params(self, mix: Mixture | None = None) -> dict[str, Any]:
        mix = self._mix if mix is None else mix
        params = self._order_params() | {
            "shuffle_buffer": self._buffer,
            "num_samples": int(self._bounds[-1]),
            "shards_crc32": self._layout_crc32(self._bounds),
            "records_crc32": self._dataset_crc32(self.dataset),
        }
        if mix is None:
            return params
        return params | mix.params() | {"chunk_size": mix.mean_chunk_size()}

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
        if loader is not None:
            refuse_persistent_loader(self, loader)
        return stream_state(
            length=len(self),
            epoch=self._epoch,
            world_size=self._world_size,
            history=self._history,
            params=self._params(),
            consumed_samples=consumed_samples,
            consumed_batches=consumed_batches,
            loader=loader,
        )

    def load_state_dict(
        self, state: dict[str, Any], *, weights: Sequence[float] | None = None
    ) -> None:
        """Resume: passes over the saved epoch continue where the saved run stopped.

        The resume point holds until ``set_epoch`` chooses another epoch (whatever the number
        of workers: a worker's copy cannot report back that its pass ended). At the saved
        world size, iterate with a loader of the saved ``batch_size``, ``num_workers`` and
        ``drop_last``; at another, this rank yields its share of the samples no rank had
        consumed, with any loader (see the module docstring). ``weights=``: new mixture
        weights for the rest of the epoch and later ones, as
        ``ChunkShuffleSampler.load_state_dict`` takes them (the rest is split as at another
        world size; the shuffle buffer stays the one built).

        Raises:
            ValueError: the state is incomplete, of another dataset, or was saved with other
                order parameters (the order would differ, so resuming would repeat some
                samples and skip others); or ``weights`` are bad.
        """
        _load(self, state, weights)

    @property
    def start_batch(self) -> int:
        """Loader batches of the epoch the next pass skips.

        The loaded state's ``consumed_batches`` at the saved world size, 0 at another (or
        without a load).
        """
        return 0 if self._resume is None else self._resume.consumed_batches


def _load(s: ShardStream, state: dict[str, Any], weights: Sequence[float] | None) -> None:
    """``s.load_state_dict(state, weights=weights)``."""
    mix, saved = changed_mixtures(s._mix, state, weights)
    restart = read_stream_state(
        state,
        s._params(saved or mix),
        world_size=s._world_size,
        num_units=s._num_ordered,
        drop_last=s._drop_last,
        seed=s._seed,
        buffer=s._buffer,
        reweight_from=None if saved is None else saved.weights,
    )
    if mix is not s._mix and mix is not None:  # new weights: new counts, chunk mean
        s._mix, s._chunk_size = mix, mix.mean_chunk_size()
    s._set_history(restart.epoch, restart.history, restart.rest)
    s._resume = restart.resume


def _stream_order(s: ShardStream, mix: Mixture, epoch: int) -> IntArray:
    """The global order of a mixture's ``epoch``, after any change of weights in its history."""

    def consumed_of(seg: Segment) -> ConsumedInShare:
        return stream_consumed(seg, seed=s._seed, epoch=epoch, buffer=s._buffer)

    return reweighted_order(
        mix,
        s.history if epoch == s.epoch else (),
        epoch=epoch,
        window=0,
        seed=s._seed,
        shuffle=s._shuffle,
        drop_last=s._drop_last,
        consumed_of=consumed_of,
    )
