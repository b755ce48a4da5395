"""Chunked, cache-friendly sample orders: pure functions of (seed, epoch), and samplers around them.

The order for one epoch is built in three steps, all vectorised numpy (about a second for 10**7
samples):

1. **Chunks.** The selected ids of each shard are cut into chunks of ``chunk_size`` neighbouring
   ids (the last chunk of a shard may be shorter). A chunk never crosses a shard boundary, so it
   is one nearly sequential read.
2. **Chunk shuffle.** The chunks are permuted with ``np.random.default_rng([seed, epoch])``.
3. **Window shuffle.** The permuted chunks are grouped into consecutive *blocks* of ``window``
   chunks, and the samples inside each block are shuffled (non-overlapping blocks rather than a
   sliding window: a block is a set of chunks the reader touches together, which is what the
   page cache sees). Every sample therefore stays inside its block, and
   ``|final position - position before the window shuffle| < window * chunk_size``.
   ``window=0`` skips this step: chunks are read in id order inside.

The chunk permutation is drawn first from the generator, so it does not depend on ``window``:
``window=0`` shows the chunk order that any other window then mixes.

Ranks (``split_for_rank``) take contiguous slices of the global order, so each rank reads its
own chunks sequentially and the ranks together cover different regions of the dataset at any
moment.

Samplers never change the order inside ``__iter__``: ``set_epoch`` chooses the epoch, and
``state_dict``/``load_state_dict`` resume mid-epoch (see :class:`ChunkShuffleSampler`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_WINDOW",
    "ChunkShuffleBatchSampler",
    "ChunkShuffleSampler",
    "chunk_order",
    "chunk_ranges",
    "split_for_rank",
]

DEFAULT_CHUNK_SIZE = 64
"""Samples per chunk: neighbouring ids read together (a few MB of typical JPEGs)."""

DEFAULT_WINDOW = 8
"""Chunks per shuffle block: samples are mixed across this many chunks."""

PREFETCH_BYTES = 32 << 20
"""At most this many bytes of upcoming chunks are hinted to the OS ahead of the reads."""

STATE_VERSION = 1

IntArray = npt.NDArray[np.int64]


class SizedDataset(Protocol):
    """What the samplers need from a dataset; ``shard_bounds``, ``labels`` and ``prefetch``
    are optional attributes, looked up with ``getattr``."""

    def __len__(self) -> int: ...


# --------------------------------------------------------------------------- pure functions


def _as_bounds(bounds: int | npt.ArrayLike) -> IntArray:
    """Validate shard bounds; an int ``n`` means one shard ``[0, n)``."""
    if isinstance(bounds, int | np.integer):
        if bounds < 0:
            raise ValueError(f"number of samples must be >= 0, got {bounds}")
        return np.array([0, int(bounds)], dtype=np.int64)
    arr = np.asarray(bounds)
    if arr.ndim != 1 or arr.size < 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            "shard bounds must be a 1-D integer array [0, end_of_shard0, ..., n], "
            f"got shape {arr.shape} dtype {arr.dtype}"
        )
    arr = arr.astype(np.int64)
    if arr[0] != 0 or np.any(np.diff(arr) < 0):
        raise ValueError(
            "shard bounds must start at 0 and never decrease, "
            f"got {arr[:8].tolist()}{' ...' if arr.size > 8 else ''}"
        )
    return arr


def _as_ids(ids: npt.ArrayLike | None, n: int) -> IntArray | None:
    """Validate a sorted subset of ``[0, n)``."""
    if ids is None:
        return None
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ids must be a 1-D integer array, got shape {arr.shape} {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(np.diff(arr) <= 0):
        raise ValueError("ids must be strictly increasing (sorted, no duplicates)")
    if arr[0] < 0 or arr[-1] >= n:
        raise ValueError(f"ids must lie in [0, {n}), got {arr[0]}..{arr[-1]}")
    return arr


def _check_nonneg(name: str, value: int, minimum: int = 0) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _chunk_table(
    bounds: IntArray, ids: IntArray | None, chunk_size: int
) -> tuple[IntArray, IntArray]:
    """Chunks in id order as (start, length), counted in positions of the selection.

    A position is an index into ``ids`` (or an id itself when ``ids`` is None).
    """
    pbounds = bounds if ids is None else np.searchsorted(ids, bounds, side="left").astype(np.int64)
    counts = np.diff(pbounds)
    nchunks = -(-counts // chunk_size)
    total = int(nchunks.sum())
    shard_of_chunk = np.repeat(np.arange(counts.size, dtype=np.int64), nchunks)
    first_chunk = np.cumsum(nchunks) - nchunks
    k = np.arange(total, dtype=np.int64) - first_chunk[shard_of_chunk]
    start = pbounds[:-1][shard_of_chunk] + k * chunk_size
    stop = np.minimum(start + chunk_size, pbounds[1:][shard_of_chunk])
    return start, stop - start


def chunk_ranges(
    bounds: int | npt.ArrayLike, *, chunk_size: int, ids: npt.ArrayLike | None = None
) -> tuple[IntArray, IntArray]:
    """The chunks as id ranges, in id order.

    Args:
        bounds: Shard bounds ``[0, end_of_shard0, ..., n]``, or ``n`` for one shard.
        chunk_size: Selected samples per chunk (the last chunk of a shard may be shorter).
        ids: Optional sorted subset of ids; chunks are made of neighbouring selected ids.

    Returns:
        ``(lo, hi)``: chunk ``k`` holds the selected ids in ``[lo[k], hi[k])``; ``lo`` is
        increasing, so ``np.searchsorted(lo, x, side="right") - 1`` is the chunk of id ``x``.
    """
    _check_nonneg("chunk_size", chunk_size, 1)
    b = _as_bounds(bounds)
    sel = _as_ids(ids, int(b[-1]))
    start, length = _chunk_table(b, sel, chunk_size)
    if sel is None:
        return start, start + length
    return sel[start], sel[start + length - 1] + 1


def chunk_order(
    bounds: int | npt.ArrayLike,
    *,
    chunk_size: int,
    window: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    ids: npt.ArrayLike | None = None,
) -> IntArray:
    """The global sample order of one epoch, for all ranks together.

    Args:
        bounds: Shard bounds ``[0, end_of_shard0, ..., n]`` (shard ``s`` holds ids
            ``[bounds[s], bounds[s+1])``), or ``n`` for one shard.
        chunk_size: Neighbouring samples per chunk; chunks never cross a shard boundary.
        window: Chunks per shuffle block (see the module docstring); 0 keeps the samples of
            each chunk in id order.
        seed: Non-negative seed; the order is a pure function of ``(seed, epoch)`` and the
            other arguments.
        epoch: Non-negative epoch number.
        shuffle: False returns the selected ids in ascending order.
        ids: Optional strictly increasing subset of ids to order instead of all of them.

    Returns:
        An int64 array: a permutation of the selected ids.
    """
    _check_nonneg("chunk_size", chunk_size, 1)
    _check_nonneg("window", window)
    _check_nonneg("seed", seed)
    _check_nonneg("epoch", epoch)
    b = _as_bounds(bounds)
    sel = _as_ids(ids, int(b[-1]))
    m = int(b[-1]) if sel is None else sel.size
    if not shuffle or m == 0:
        return np.arange(m, dtype=np.int64) if sel is None else sel.copy()

    start, length = _chunk_table(b, sel, chunk_size)
    rng = np.random.default_rng([int(seed), int(epoch)])
    perm = rng.permutation(start.size)
    plen = length[perm]
    # Position of every sample: its chunk's start plus its offset inside the chunk, built
    # without a Python loop: repeat (chunk start - output start) and add a running arange.
    out_start = np.cumsum(plen) - plen
    pos = np.repeat(start[perm] - out_start, plen)
    pos += np.arange(m, dtype=np.int64)
    if window > 0:
        # Sort on (block, random key): a uniform shuffle inside each block of `window` chunks.
        # Stable sort so ties in the 32-bit key resolve the same way on every numpy.
        key = np.repeat(np.arange(perm.size, dtype=np.uint64) // np.uint64(window), plen)
        key <<= np.uint64(32)
        key |= rng.integers(0, 2**32, size=m, dtype=np.uint64)
        pos = pos[np.argsort(key, kind="stable")]
    return pos if sel is None else sel[pos]


def _rank_span(n: int, *, rank: int, world_size: int, drop_last: bool) -> tuple[int, int]:
    """Positions ``[start, stop)`` of the (padded) global order that ``rank`` takes."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    per = n // world_size if drop_last else -(-n // world_size)
    return rank * per, (rank + 1) * per


def split_for_rank(order: IntArray, *, rank: int, world_size: int, drop_last: bool) -> IntArray:
    """This rank's share of a global order: a contiguous slice, the same length on every rank.

    ``drop_last`` drops the last ``n % world_size`` samples of the order, so each rank gets
    ``n // world_size``; otherwise the order is padded by repeating it from its start
    (cyclically, when ``n < world_size``) to ``ceil(n / world_size) * world_size``. Contiguous
    slices keep each rank's reads inside its own chunks; ranks overlap only in the padding.

    Args:
        order: The global order (``chunk_order``).
        rank: This rank, ``0 <= rank < world_size``.
        world_size: Number of ranks.
        drop_last: Drop the remainder instead of padding.

    Returns:
        A view of ``order`` when no padding is needed, else a new array.
    """
    n = order.size
    start, stop = _rank_span(n, rank=rank, world_size=world_size, drop_last=drop_last)
    if stop <= n:
        return order[start:stop]
    return order[np.arange(start, stop) % n]


# --------------------------------------------------------------------------- samplers


def _dataset_bounds(dataset: SizedDataset) -> IntArray:
    n = len(dataset)
    raw = getattr(dataset, "shard_bounds", None)
    if raw is None:
        return np.array([0, n], dtype=np.int64)
    bounds = _as_bounds(raw)
    if int(bounds[-1]) != n:
        raise ValueError(
            f"dataset.shard_bounds ends at {int(bounds[-1])} but len(dataset) is {n}; "
            "the last bound must equal the number of samples"
        )
    return bounds


def _select(
    dataset: SizedDataset,
    indices: npt.ArrayLike | None,
    labels: Iterable[int | str] | None,
) -> IntArray | None:
    """Sorted selected ids, or None for all of them."""
    n = len(dataset)
    keep: npt.NDArray[np.bool_] | None = None
    if indices is not None:
        arr = np.asarray(indices)
        if arr.dtype == np.bool_:
            if arr.shape != (n,):
                raise ValueError(
                    f"a boolean indices mask must have one entry per sample ({n}), "
                    f"got shape {arr.shape}"
                )
            keep = arr.copy()
        else:
            if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
                raise ValueError(
                    "indices must be a boolean mask or a 1-D array of integer ids, "
                    f"got shape {arr.shape} dtype {arr.dtype}"
                )
            ids = np.sort(arr.astype(np.int64))
            if ids.size and (ids[0] < 0 or ids[-1] >= n):
                raise ValueError(f"indices must lie in [0, {n}), got {ids[0]}..{ids[-1]}")
            if ids.size and np.any(np.diff(ids) == 0):
                dup = int(ids[1:][np.diff(ids) == 0][0])
                raise ValueError(
                    f"indices contain id {dup} more than once; a sampler yields each selected "
                    "id once per epoch"
                )
            keep = np.zeros(n, dtype=np.bool_)
            keep[ids] = True
    if labels is not None:
        wanted = list(labels)
        ds_labels = getattr(dataset, "labels", None)
        if ds_labels is None:
            raise ValueError(
                f"labels={wanted[:5]!r} filters by label, but {type(dataset).__name__} has no "
                "labels (dataset.labels is missing or None)"
            )
        lab = np.asarray(ds_labels)
        if lab.shape != (n,):
            raise ValueError(f"dataset.labels has shape {lab.shape}, expected ({n},)")
        by_label = np.isin(lab, np.asarray(wanted))
        keep = by_label if keep is None else keep & by_label
    if keep is None or bool(keep.all()):
        return None
    return np.flatnonzero(keep).astype(np.int64)


def check_saved_params(
    state: dict[str, Any], params: dict[str, Any], *, what: str, advice: str
) -> None:
    """Raise ValueError naming each parameter whose saved value differs from the current one."""
    diffs = [f"{k}: saved {state[k]!r}, now {v!r}" for k, v in params.items() if state[k] != v]
    if diffs:
        raise ValueError(
            f"cannot resume: the {what} state was saved with different parameters ("
            + "; ".join(diffs)
            + "), so the order would differ and resuming would repeat or skip samples; "
            + advice
        )


@dataclass
class _Pass:
    """One iteration over this rank's share, from a start offset; ``done`` counts yields."""

    ids: IntArray  # this rank's remaining ids
    base: int  # samples of the epoch consumed before this pass
    entries: IntArray  # positions in ``ids`` where a chunk is entered, ascending
    entry_lo: IntArray  # that chunk's id range
    entry_hi: IntArray
    done: int = 0


class ChunkShuffleSampler:
    """Yields this rank's sample ids for the current epoch in chunked, cache-friendly order.

    Works wherever paddle expects a ``paddle.io.Sampler`` (``paddle.io.BatchSampler(sampler=...)``
    accepts any iterable with ``__len__``); it does not subclass it so that importing this
    module does not import paddle.

    Resuming: the order is fixed by ``set_epoch``; ``__iter__`` only reads it. A pass starts at
    the offset set by ``load_state_dict`` (0 otherwise); that offset is used once: it is reset
    by ``set_epoch`` to another epoch and after a pass runs to its end. ``state_dict()`` records
    the position in this rank's share of the epoch. Without an argument it is the number of
    ids this sampler has yielded, but a ``DataLoader`` draws indices ahead of the model
    (``prefetch_factor`` batches per worker), so that count runs ahead of training; pass
    ``state_dict(consumed_samples=k)`` with the number of samples the model consumed in this
    epoch (including those before any resume). Every rank has the same length, so the state
    saved on rank 0 resumes every rank; ``world_size`` and the order parameters must match.

    Args:
        dataset: Sized; optional ``shard_bounds``, ``labels`` and ``prefetch(start, stop)``.
        chunk_size: Neighbouring samples per chunk.
        window: Chunks per shuffle block; 0 keeps each chunk in id order.
        shuffle: False yields ids in ascending order (still split across ranks).
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop the remainder so ranks get ``n // world_size`` ids each, instead of
            padding to ``ceil(n / world_size)``.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
        indices: A boolean mask over the dataset or an array of ids: sample only these.
        labels: Label values to keep (needs ``dataset.labels``); combined with ``indices``.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        indices: npt.ArrayLike | None = None,
        labels: Iterable[int | str] | None = None,
    ) -> None:
        _check_nonneg("chunk_size", chunk_size, 1)
        _check_nonneg("window", window)
        _check_nonneg("seed", seed)
        if rank is None or world_size is None:
            import paddle.distributed as dist  # lazy: importing paddle is slow

            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        _check_nonneg("world_size", world_size, 1)
        _check_nonneg("rank", rank)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size, got rank={rank} world_size={world_size}")
        self._chunk_size = int(chunk_size)
        self._window = int(window)
        self._shuffle = bool(shuffle)
        self._seed = int(seed)
        self._drop_last = bool(drop_last)
        self._rank = int(rank)
        self._world_size = int(world_size)
        self._bounds = _dataset_bounds(dataset)
        self._ids = _select(dataset, indices, labels)
        self._num_selected = int(self._bounds[-1]) if self._ids is None else self._ids.size
        prefetch = getattr(dataset, "prefetch", None)
        self._prefetch = prefetch if callable(prefetch) else None
        # hints run one shuffle block ahead of the reads, so the next block's chunks are
        # on their way from disk while this block's samples are decoded; but never more
        # than PREFETCH_BYTES ahead: hinting 200 MB at once on a 100 MB/s disk stalled the
        # reads for seconds (bench_orders.py --sweep: 1,000/s -> 15/s)
        self._lookahead = self._chunk_size * max(1, self._window)
        index = getattr(dataset, "index", None)
        nbytes = getattr(index, "nbytes", None)
        if nbytes is not None and len(nbytes):
            per_sample = max(1.0, float(np.mean(nbytes)))
            cap = max(self._chunk_size, int(PREFETCH_BYTES / per_sample))
            self._lookahead = min(self._lookahead, cap)
        self._epoch = 0
        self._offset = 0  # where the next pass starts (set by load_state_dict)
        self._pass: _Pass | None = None  # the latest pass, for state_dict()
        self._fingerprint: int | None = None
        self._cache: tuple[int, IntArray] | None = None  # (epoch, this rank's share)

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

    @property
    def num_selected(self) -> int:
        """Selected samples over all ranks (before padding or dropping)."""
        return self._num_selected

    def __len__(self) -> int:
        start, stop = _rank_span(
            self._num_selected,
            rank=self._rank,
            world_size=self._world_size,
            drop_last=self._drop_last,
        )
        return stop - start

    # ------------------------------------------------------------------ order
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next pass yields; a new epoch starts at 0."""
        _check_nonneg("epoch", epoch)
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._offset = 0
            self._pass = None

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """This rank's full share of the order for ``epoch`` (default: the current one)."""
        epoch = self._epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        order = chunk_order(
            self._bounds,
            chunk_size=self._chunk_size,
            window=self._window,
            seed=self._seed,
            epoch=epoch,
            shuffle=self._shuffle,
            ids=self._ids,
        )
        share = split_for_rank(
            order, rank=self._rank, world_size=self._world_size, drop_last=self._drop_last
        )
        if share.size < order.size:
            share = share.copy()  # let the global order be freed
        self._cache = (epoch, share)
        return share

    def _start_pass(self) -> _Pass:
        ids = self.rank_order()[self._offset :]
        entries = np.zeros(0, dtype=np.int64)
        lo = hi = entries
        if self._prefetch is not None and ids.size:
            lo_all, hi_all = chunk_ranges(self._bounds, chunk_size=self._chunk_size, ids=self._ids)
            chunk = np.searchsorted(lo_all, ids, side="right") - 1
            _, first = np.unique(chunk, return_index=True)
            entries = np.sort(first).astype(np.int64)
            lo, hi = lo_all[chunk[entries]], hi_all[chunk[entries]]
        p = _Pass(ids=ids, base=self._offset, entries=entries, entry_lo=lo, entry_hi=hi)
        self._pass = p
        return p

    def _finish_pass(self, p: _Pass) -> None:
        if self._pass is p:
            self._offset = 0  # the resume offset is used once

    def _prefetch_until(self, p: _Pass, e: int, stop: int) -> int:
        """Hint every chunk entered before position ``stop``; returns the next entry index."""
        assert self._prefetch is not None
        while e < p.entries.size and p.entries[e] < stop:
            self._prefetch(int(p.entry_lo[e]), int(p.entry_hi[e]))
            e += 1
        return e

    def __iter__(self) -> Iterator[int]:
        return self._samples(self._start_pass())

    def _samples(self, p: _Pass) -> Iterator[int]:
        piece = 4096  # tolist() in pieces: python ints without one huge list
        e = 0
        for s in range(0, p.ids.size, piece):
            stop = min(s + piece, p.ids.size)
            if self._prefetch is None:
                for j, idx in enumerate(p.ids[s:stop].tolist(), s):
                    p.done = j + 1
                    yield idx
            else:
                ahead = self._lookahead
                nxt = int(p.entries[e]) - ahead if e < p.entries.size else -1
                for j, idx in enumerate(p.ids[s:stop].tolist(), s):
                    if j >= nxt >= 0 or j == 0:
                        e = self._prefetch_until(p, e, j + 1 + ahead)
                        nxt = int(p.entries[e]) - ahead if e < p.entries.size else -1
                    p.done = j + 1
                    yield idx
        self._finish_pass(p)

    def _batches(self, batch_size: int, drop_last: bool) -> Iterator[list[int]]:
        p = self._start_pass()
        return self._iter_batches(p, batch_size, drop_last)

    def _iter_batches(self, p: _Pass, batch_size: int, drop_last: bool) -> Iterator[list[int]]:
        n = p.ids.size
        end = n - n % batch_size if drop_last else n
        e = 0
        for s in range(0, end, batch_size):
            stop = min(s + batch_size, n)
            if self._prefetch is not None:
                e = self._prefetch_until(p, e, stop + self._lookahead)
            p.done = stop
            yield p.ids[s:stop].tolist()
        self._finish_pass(p)

    # ------------------------------------------------------------------ resume
    def _params(self) -> dict[str, Any]:
        if self._fingerprint is None:
            crc = zlib.crc32(self._bounds.astype("<i8").tobytes())
            if self._ids is not None:
                crc = zlib.crc32(self._ids.astype("<i8").tobytes(), crc)
            self._fingerprint = crc
        return {
            "seed": self._seed,
            "chunk_size": self._chunk_size,
            "window": self._window,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
            "world_size": self._world_size,
            "num_selected": self._num_selected,
            "selection_crc32": self._fingerprint,
        }

    def state_dict(self, consumed_samples: int | None = None) -> dict[str, Any]:
        """The resume state: epoch, position in this rank's share, and the order parameters.

        Args:
            consumed_samples: Samples of this rank's share the model consumed in the current
                epoch, counted from the epoch's start. Default: the number this sampler has
                yielded, which runs ahead of training under a prefetching ``DataLoader``.
        """
        if consumed_samples is None:
            p = self._pass
            position = self._offset if p is None else p.base + p.done
        else:
            _check_nonneg("consumed_samples", consumed_samples)
            if consumed_samples > len(self):
                raise ValueError(
                    f"consumed_samples={consumed_samples} exceeds this rank's "
                    f"{len(self)} samples per epoch"
                )
            position = int(consumed_samples)
        state = {"version": STATE_VERSION, "epoch": self._epoch, "position": position}
        return state | self._params()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass yields the rest of the saved epoch from the saved position.

        Raises:
            ValueError: the state is incomplete, or was saved with other order parameters or
                another selection of samples (the order would differ, so resuming would repeat
                some samples and skip others).
        """
        params = self._params()
        required = {"version", "epoch", "position", *params}
        missing = sorted(required - state.keys())
        if missing:
            raise ValueError(f"sampler state is missing {missing}; was it saved by state_dict()?")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"sampler state version {state['version']} is not supported "
                f"(this version reads {STATE_VERSION})"
            )
        check_saved_params(
            state,
            params,
            what="sampler",
            advice="build the sampler with the saved parameters and the same dataset selection",
        )
        epoch, position = state["epoch"], state["position"]
        _check_nonneg("epoch", epoch)
        _check_nonneg("position", position)
        if position > len(self):
            raise ValueError(f"saved position {position} exceeds this rank's {len(self)} samples")
        self._epoch = int(epoch)
        self._offset = int(position)
        self._pass = None


class ChunkShuffleBatchSampler:
    """Batches of :class:`ChunkShuffleSampler` ids, for ``DataLoader(batch_sampler=...)``.

    A plain class: ``paddle.io.DataLoader`` only iterates a batch sampler and takes its
    ``len``. Positions in ``state_dict`` are in samples, like the sampler's; ``consumed_batches``
    is a shorthand for ``consumed_batches * batch_size`` samples.

    Args:
        dataset: As for :class:`ChunkShuffleSampler`.
        batch_size: Ids per batch.
        drop_last: Drop the last partial batch, and also the remainder that does not divide
            among ranks (instead of padding it); all ranks yield the same number of batches.
        **kwargs: The other arguments of :class:`ChunkShuffleSampler`.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        *,
        batch_size: int,
        drop_last: bool = False,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        indices: npt.ArrayLike | None = None,
        labels: Iterable[int | str] | None = None,
    ) -> None:
        _check_nonneg("batch_size", batch_size, 1)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.sampler = ChunkShuffleSampler(
            dataset,
            chunk_size=chunk_size,
            window=window,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            indices=indices,
            labels=labels,
        )

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler._batches(self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """See :meth:`ChunkShuffleSampler.set_epoch`."""
        self.sampler.set_epoch(epoch)

    def state_dict(
        self, consumed_batches: int | None = None, *, consumed_samples: int | None = None
    ) -> dict[str, Any]:
        """The sampler's state; position in samples. Give at most one of the two counts.

        Args:
            consumed_batches: Batches of the current epoch the model consumed (from its start).
            consumed_samples: The same, in samples.
        """
        if consumed_batches is not None:
            if consumed_samples is not None:
                raise ValueError("give consumed_batches or consumed_samples, not both")
            _check_nonneg("consumed_batches", consumed_batches)
            if consumed_batches > len(self):
                raise ValueError(
                    f"consumed_batches={consumed_batches} exceeds the {len(self)} batches per epoch"
                )
            # The last batch may be partial (or dropped): clamp to the samples that exist.
            consumed_samples = min(consumed_batches * self.batch_size, len(self.sampler))
        return self.sampler.state_dict(consumed_samples)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See :meth:`ChunkShuffleSampler.load_state_dict`."""
        self.sampler.load_state_dict(state)
