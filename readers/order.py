"""Sample orders as pure functions of (seed, epoch) and the layout: chunks, ranks, workers, buffers.

Shared by :mod:`readers.samplers` and :mod:`readers.stream`; no paddle, no I/O.

1. **Chunks** (``chunk_ranges``). The selected ids of each shard are cut into chunks of
   ``chunk_size`` neighbouring ids (the last chunk of a shard may be shorter). A chunk never
   crosses a shard boundary, so it is one nearly sequential read.
2. **Chunk shuffle** (``chunk_order``). The chunks are permuted with
   ``np.random.default_rng([seed, epoch])``.
3. **Window shuffle.** The permuted chunks are grouped into consecutive *blocks* of ``window``
   chunks, and the samples inside each block are shuffled (non-overlapping blocks rather than a
   sliding window: a block is a set of chunks the reader touches together, which is what the
   page cache sees). Every sample stays inside its block, so
   ``|final position - position before the window shuffle| < window * chunk_size``.
   ``window=0`` skips this step: chunks are read in id order inside. The chunk permutation is
   drawn first from the generator, so it does not depend on ``window``.
4. **Ranks** (``split_for_rank``, ``rank_share``) take contiguous slices of the global order,
   so each rank reads its own chunks sequentially.
5. **Workers** (``worker_counts``, ``worker_slice``) cut a rank's share into contiguous spans
   by count, the same counts on every rank.
6. **Shuffle buffer** (``buffer_order``) mixes a worker's span through a bounded buffer, and
   ``loader_batches`` says in which order ``paddle.io.DataLoader`` yields the workers' batches.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "as_bounds",
    "buffer_order",
    "check_nonneg",
    "chunk_order",
    "chunk_ranges",
    "loader_batches",
    "rank_share",
    "rank_span",
    "sequential_runs",
    "split_for_rank",
    "worker_buffer_order",
    "worker_counts",
    "worker_slice",
]

IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- validation


def check_nonneg(name: str, value: int, minimum: int = 0) -> None:
    """Raise ValueError unless ``value`` is an integer (not a bool) >= ``minimum``."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def as_bounds(bounds: int | npt.ArrayLike) -> IntArray:
    """Validate shard bounds ``[0, end_of_shard0, ..., n]``; an int ``n`` means one shard."""
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


# --------------------------------------------------------------------------- chunks


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
    check_nonneg("chunk_size", chunk_size, 1)
    b = as_bounds(bounds)
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
    check_nonneg("chunk_size", chunk_size, 1)
    check_nonneg("window", window)
    check_nonneg("seed", seed)
    check_nonneg("epoch", epoch)
    b = as_bounds(bounds)
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


def sequential_runs(ids: IntArray, chunk_lo: IntArray) -> tuple[IntArray, IntArray]:
    """Sequential runs of ``ids``: ``run[p]`` for each position, and each run's last position.

    A run is a stretch of consecutive ascending ids inside one chunk (``chunk_lo`` as from
    ``chunk_ranges``): what a reader can fetch as one sequential read.
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


# --------------------------------------------------------------------------- ranks, workers


def rank_span(n: int, *, rank: int, world_size: int, drop_last: bool) -> tuple[int, int]:
    """Positions ``[start, stop)`` of the (padded) global order of ``n`` that ``rank`` takes."""
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
    start, stop = rank_span(n, rank=rank, world_size=world_size, drop_last=drop_last)
    if stop <= n:
        return order[start:stop]
    return order[np.arange(start, stop) % n]


def rank_share(
    bounds: int | npt.ArrayLike,
    *,
    chunk_size: int,
    window: int,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    drop_last: bool,
    shuffle: bool = True,
    ids: npt.ArrayLike | None = None,
) -> IntArray:
    """``split_for_rank(chunk_order(...))`` as its own array (the global order can be freed)."""
    order = chunk_order(
        bounds,
        chunk_size=chunk_size,
        window=window,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        ids=ids,
    )
    share = split_for_rank(order, rank=rank, world_size=world_size, drop_last=drop_last)
    return share.copy() if share.size < order.size else share


def worker_counts(n: int, num_workers: int) -> IntArray:
    """Samples each worker of a rank gets: contiguous spans of ``n // V`` or ``n // V + 1``.

    Spans are cut by count rather than at chunk boundaries so that the per-worker counts, and
    with them the batches a ``DataLoader`` forms, are the same on every rank.

    Args:
        n: Samples in the rank's share.
        num_workers: DataLoader workers; 0 (iteration in the main process) counts as 1.

    Returns:
        ``V = max(num_workers, 1)`` counts; the first ``n % V`` are the larger ones.
    """
    check_nonneg("n", n)
    check_nonneg("num_workers", num_workers)
    v = max(int(num_workers), 1)
    counts = np.full(v, n // v, dtype=np.int64)
    counts[: n % v] += 1
    return counts


def worker_slice(n: int, *, worker: int, num_workers: int) -> slice:
    """The positions of a rank's share of ``n`` samples that worker ``worker`` reads."""
    counts = worker_counts(n, num_workers)
    if not 0 <= worker < counts.size:
        raise ValueError(f"need 0 <= worker < {counts.size}, got {worker}")
    start = int(counts[:worker].sum())
    return slice(start, start + int(counts[worker]))


# --------------------------------------------------------------------------- buffers, batches


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
    check_nonneg("m", m)
    check_nonneg("buffer", buffer)
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


def worker_buffer_order(
    m: int, *, buffer: int, seed: int, epoch: int, rank: int, worker: int
) -> IntArray:
    """``buffer_order`` of a worker's span of ``m`` samples, seeded ``(seed, epoch, rank, worker)``.

    What ``ShardStream``'s workers emit, and what its resume states replay.
    """
    rng = np.random.default_rng([int(seed), int(epoch), int(rank), int(worker)])
    return buffer_order(m, buffer=buffer, rng=rng)


def loader_batches(
    counts: npt.ArrayLike, *, batch_size: int, drop_last: bool
) -> tuple[IntArray, IntArray, IntArray]:
    """The batches ``paddle.io.DataLoader`` yields from workers with these sample counts.

    Worker ``w`` forms batches of ``batch_size`` from its own samples (the last one short, or
    dropped with ``drop_last``); the loader yields batch ``r`` of worker ``w`` in the
    lexicographic order of ``(r, w)`` (see :mod:`readers.stream`).

    Args:
        counts: Samples per worker (``worker_counts``).
        batch_size: The loader's ``batch_size``.
        drop_last: The loader's ``drop_last``.

    Returns:
        ``(worker, round, size)`` of every batch, in the order the loader yields them.
    """
    check_nonneg("batch_size", batch_size, 1)
    c = np.asarray(counts, dtype=np.int64)
    v = c.size
    nb = c // batch_size if drop_last else -(-c // batch_size)
    worker = np.repeat(np.arange(v, dtype=np.int64), nb)
    rnd = np.arange(worker.size, dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)
    order = np.argsort(rnd * v + worker, kind="stable")
    worker, rnd = worker[order], rnd[order]
    size = np.minimum(batch_size, c[worker] - rnd * batch_size)
    return worker, rnd, size
