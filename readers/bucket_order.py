"""The epochs of ``readers.BucketBatchSampler`` as pure functions of (seed, epoch) and the index.

Batches of similar width, height or aspect, from the index alone; no paddle, no I/O.

One epoch, for all ranks together, from the key values of the selected samples (the index's
``width``, ``height`` or ``width / height``; no record is read or decoded):

1. **Buckets** (`bucket_edges`, `assign_buckets`). ``buckets=K`` puts the boundaries at the
   ``j/K`` quantiles of the selected samples' values (exact values of the index, repeated ones
   merged, so there may be fewer than ``K`` buckets, none empty); a list of boundaries
   ``[e1, ..., e(K-1)]`` is taken as given (buckets may be empty). Bucket ``b`` holds the
   samples with ``edge[b-1] <= value < edge[b]``.
2. **Batch sizes** (`bucket_batch_sizes`): ``batch_size`` in every bucket, an explicit list
   ``batch_sizes``, or ``scale_batch=True``: the bucket of the largest values holds
   ``batch_size`` and bucket ``b`` holds ``max(1, floor(batch_size * top / top_b))``, where
   ``top_b`` is the largest value in it, so ``batch size x width`` stays about what the widest
   batch needs (OCR multi-scale training).
3. **Chunks inside buckets** (`bucket_batches`). Each bucket's members, in id order, are cut
   into chunks of ``chunk_size`` neighbouring members; the chunks of a bucket are shuffled,
   and the samples inside each block of ``window`` consecutive chunks of one bucket are
   shuffled (as ``readers.order.chunk_order`` does for the whole dataset). Reads inside a
   batch stay near-sequential, and every sample stays in its bucket.
4. **Batches.** Each bucket's sequence is cut into batches of its batch size (the last one
   short, or dropped with ``drop_last``). The buckets' batch sequences are merged in a random
   order that keeps each bucket's batches in their order: a uniformly shuffled sequence of
   bucket labels, one per batch, whose ``j``-th ``b`` is bucket ``b``'s ``j``-th batch.
5. **Ranks.** The epoch's list of batches (the same for every world size) is split into
   contiguous, equal-length rank shares, padded by repeating batches from its start or, with
   ``drop_last``, with the last ``B % world_size`` batches dropped
   (``readers.order.split_for_rank`` over batch numbers): every rank yields the same number of
   batches. ``shuffle=False`` keeps ids ascending and the buckets in order (no randomness).

Resume and elastic resume count whole batches (the units of ``readers.resume``): the rest of
an epoch saved at another world size is its unconsumed batches, still bucket-pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, check_nonneg, chunk_ranges
from readers.selection import index_columns

__all__ = [
    "KEYS",
    "assign_buckets",
    "bucket_batch_sizes",
    "bucket_batches",
    "bucket_edges",
    "key_values",
]

KEYS = ("width", "height", "aspect")
FloatArray = npt.NDArray[np.float64]
_TABLE_RANGE = 1 << 22  # integer keys spanning fewer values are counted, not sorted


def key_values(dataset: Any, key: str | npt.ArrayLike) -> npt.NDArray[Any]:
    """One value per sample: the index's width, height or width / height, or ``key`` itself.

    Args:
        dataset: Its index supplies the columns (``readers.selection.index_columns``).
        key: ``"width"``, ``"height"``, ``"aspect"``, or an array of one number per sample.

    Raises:
        ValueError: an unknown key, an array of the wrong shape, or a dataset without the
            columns.
    """
    n = len(dataset)
    if not isinstance(key, str):
        values = np.asarray(key)
        if values.shape != (n,) or not np.issubdtype(values.dtype, np.number):
            raise ValueError(
                f"key as an array must hold one number per sample ({n}), got shape "
                f"{values.shape} dtype {values.dtype}"
            )
        return values
    if key not in KEYS:
        raise ValueError(f"key={key!r}: expected one of {KEYS} or an array of values")
    names = ("width", "height") if key == "aspect" else (key,)
    cols = index_columns(dataset, *names)
    if cols is None:
        raise ValueError(
            f"BucketBatchSampler(key={key!r}) needs {' and '.join(names)} of every sample from "
            f"the dataset's index, and {type(dataset).__name__} has none (a bare LMDB or "
            "RecordIO pair has no index); pass key=<an array of one value per sample> instead"
        )
    if key != "aspect":
        return np.asarray(cols[0], dtype=np.int64)
    width, height = (np.asarray(c, dtype=np.float64) for c in cols)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(height > 0, width / np.where(height > 0, height, 1.0), -1.0)


def bucket_edges(values: npt.ArrayLike, buckets: int | Sequence[float]) -> FloatArray:
    """The boundaries between buckets: ``K`` quantile buckets of ``values``, or a given list.

    Args:
        values: The key values of the selected samples.
        buckets: ``K >= 1``: boundaries at the ``j/K`` quantiles (``j = 1 .. K-1``), values
            found in ``values``, repeats and a boundary at the minimum dropped, so every bucket
            is non-empty; or the boundaries themselves, strictly increasing.

    Returns:
        Increasing boundaries (float64); there are ``len + 1`` buckets.
    """
    v = np.asarray(values)
    if isinstance(buckets, int | np.integer) and not isinstance(buckets, bool):
        check_nonneg("buckets", int(buckets), 1)
        m = v.size
        if m == 0 or buckets == 1:
            return np.zeros(0, dtype=np.float64)
        kth = np.unique((np.arange(1, int(buckets), dtype=np.int64) * m) // int(buckets))
        lo = v.min()
        if np.issubdtype(v.dtype, np.integer) and int(v.max()) - int(lo) < _TABLE_RANGE:
            # the kth smallest of small integers, by counting (what np.partition would pick)
            ends = np.cumsum(np.bincount(v - lo))
            picked = (np.searchsorted(ends, kth, side="right") + int(lo)).astype(np.float64)
        else:
            picked = np.partition(v, kth)[kth].astype(np.float64)
        edges = np.unique(picked)
        return edges[edges > float(lo)]
    if isinstance(buckets, str | bytes) or not isinstance(buckets, Iterable):
        raise ValueError(f"buckets must be a count or a list of boundaries, got {buckets!r}")
    edges = np.asarray(list(buckets), dtype=np.float64)
    if edges.ndim != 1 or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise ValueError(
            f"bucket boundaries must be finite and strictly increasing, got {edges.tolist()}"
        )
    return edges


def assign_buckets(values: npt.ArrayLike, edges: FloatArray) -> IntArray:
    """The bucket of each value: ``b`` with ``edges[b-1] <= value < edges[b]``."""
    v = np.asarray(values)
    if v.size and np.issubdtype(v.dtype, np.integer):
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < _TABLE_RANGE:  # one lookup per value instead of a binary search
            table = np.searchsorted(edges, np.arange(lo, hi + 1), side="right")
            out: IntArray = table.astype(np.int64)[v - lo]
            return out
    return np.searchsorted(edges, v, side="right").astype(np.int64)


def bucket_batch_sizes(
    values: npt.ArrayLike,
    bucket: IntArray,
    *,
    num_buckets: int,
    batch_size: int,
    batch_sizes: Sequence[int] | None = None,
    scale_batch: bool = False,
) -> IntArray:
    """Samples per batch in each bucket (see the module docstring, step 2).

    Args:
        values: The key values of the selected samples.
        bucket: Their buckets (`assign_buckets`).
        num_buckets: ``len(edges) + 1``.
        batch_size: The batch size (of the widest bucket with ``scale_batch``).
        batch_sizes: One batch size per bucket, instead.
        scale_batch: Scale ``batch_size`` by the largest value over each bucket's largest.
    """
    check_nonneg("batch_size", batch_size, 1)
    if batch_sizes is not None:
        if scale_batch:
            raise ValueError("give batch_sizes or scale_batch=True, not both")
        sizes = np.asarray(list(batch_sizes))
        if sizes.shape != (num_buckets,) or not np.issubdtype(sizes.dtype, np.integer):
            raise ValueError(
                f"batch_sizes must hold one integer per bucket ({num_buckets}), got "
                f"{sizes.tolist()}"
            )
        if np.any(sizes < 1):
            raise ValueError(f"batch_sizes must be >= 1, got {sizes.tolist()}")
        return sizes.astype(np.int64)
    sizes = np.full(num_buckets, int(batch_size), dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if not scale_batch or v.size == 0:
        return sizes
    top = np.full(num_buckets, -np.inf)
    np.maximum.at(top, bucket, v)
    full = np.isfinite(top) & (top > 0)
    ref = float(top[full].max()) if np.any(full) else 0.0
    sizes[full] = np.maximum(1, np.floor(batch_size * ref / top[full])).astype(np.int64)
    return sizes


def bucket_batches(
    ids: IntArray | None,
    bucket: IntArray,
    *,
    batch_sizes: IntArray,
    chunk_size: int,
    window: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    drop_last: bool = False,
) -> tuple[IntArray, IntArray, IntArray]:
    """The epoch's global list of bucket-pure batches (module docstring, steps 3 and 4).

    Args:
        ids: The selected ids, ascending; None: all of ``0 .. len(bucket) - 1``.
        bucket: The bucket of each of them.
        batch_sizes: Samples per batch in each bucket (one per bucket).
        chunk_size: Neighbouring members of a bucket per chunk.
        window: Chunks of one bucket per shuffle block; 0 keeps chunks in id order inside.
        seed: Non-negative seed.
        epoch: Non-negative epoch.
        shuffle: False: ids ascending, buckets in order, no randomness.
        drop_last: Drop each bucket's short last batch.

    Returns:
        ``(flat, bounds, batch_bucket)``: batch ``j`` is ``flat[bounds[j]:bounds[j+1]]``, of
        bucket ``batch_bucket[j]``.
    """
    check_nonneg("chunk_size", chunk_size, 1)
    check_nonneg("window", window)
    check_nonneg("seed", seed)
    check_nonneg("epoch", epoch)
    k = int(batch_sizes.size)
    n = int(bucket.size)
    # the members of each bucket, in id order, one bucket after the other
    small = bucket.astype(np.uint8 if k <= 256 else np.uint16 if k <= 65536 else np.int64)
    grouped = np.argsort(small, kind="stable")
    counts = np.bincount(bucket, minlength=k).astype(np.int64)
    pb = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    rng = np.random.default_rng([int(seed), int(epoch)]) if shuffle else None
    if rng is not None and n:
        grouped = grouped[_shuffle_inside_buckets(counts, pb, chunk_size, window, rng)]
    members = grouped if ids is None else ids[grouped]
    # batches of each bucket in bucket-major order, then merged across buckets
    bs = batch_sizes.astype(np.int64)
    nb = counts // bs if drop_last else -(-counts // bs)
    total = int(nb.sum())
    bb = np.repeat(np.arange(k, dtype=np.int64), nb)
    jj = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)
    start = pb[:-1][bb] + jj * bs[bb]
    size = np.minimum(bs[bb], pb[1:][bb] - start)
    order = np.arange(total, dtype=np.int64)
    if rng is not None and total:
        labels = bb[rng.permutation(total)]
        order[np.argsort(labels, kind="stable")] = np.arange(total, dtype=np.int64)
    start, size = start[order], size[order]
    bounds = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
    pos = np.repeat(start - bounds[:-1], size) + np.arange(int(bounds[-1]), dtype=np.int64)
    return members[pos], bounds, bb[order]


def _shuffle_inside_buckets(
    counts: IntArray, pb: IntArray, chunk_size: int, window: int, rng: np.random.Generator
) -> IntArray:
    """A permutation of positions ``[0, n)`` that stays inside each bucket's ``[pb[b], pb[b+1])``.

    The bucket's chunks are shuffled, then samples shuffled inside blocks of ``window`` chunks.
    """
    n = int(pb[-1])
    lo, hi = chunk_ranges(pb, chunk_size=chunk_size)
    per_bucket = -(-counts // chunk_size)
    chunk_bucket = np.repeat(np.arange(counts.size, dtype=np.int64), per_bucket)
    perm = rng.permutation(lo.size)
    perm = perm[np.argsort(chunk_bucket[perm], kind="stable")]  # random order inside buckets
    plen = (hi - lo)[perm]
    pos = np.repeat(lo[perm] - (np.cumsum(plen) - plen), plen) + np.arange(n, dtype=np.int64)
    if window == 0:
        return pos
    within = np.arange(lo.size, dtype=np.int64) - np.repeat(
        np.cumsum(per_bucket) - per_bucket, per_bucket
    )
    block = np.cumsum(within % window == 0) - 1  # blocks never span two buckets
    return pos[_shuffle_blocks(np.bincount(block, weights=plen).astype(np.int64), rng)]


def _shuffle_blocks(lengths: IntArray, rng: np.random.Generator) -> IntArray:
    """A permutation of ``[0, sum(lengths))`` that shuffles each block uniformly in place.

    The blocks are runs of consecutive positions of the given lengths; they keep their places.

    One row per block, sorted on its own: a random 32-bit key above the column number, so keys
    are distinct and every correct sort gives the same order (no tie left to the sort
    algorithm, whatever numpy or CPU). Rows of a few thousand keys sort in cache, about twice
    as fast as one stable sort of 64-bit (block, key) pairs over the whole order.
    """
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    width = int(lengths.max())
    col = np.arange(width, dtype=np.uint64)
    keys = rng.integers(0, 2**32, size=(lengths.size, width), dtype=np.uint64)
    keys <<= np.uint64(32)
    keys |= col
    valid = col[None, :] < lengths.astype(np.uint64)[:, None]
    keys[~valid] = np.iinfo(np.uint64).max  # padding sorts last in its row, then is dropped
    within = np.argsort(keys, axis=1)[valid]
    return np.repeat(np.cumsum(lengths) - lengths, lengths) + within
