"""The epochs of ``readers.BucketBatchSampler`` as pure functions of (seed, epoch) and the index.

Batches of similar width, height or aspect, from the index alone; no paddle, no I/O.

One epoch, for all ranks together, from the bucket of each selected sample and the batch size
of each bucket (steps 1 and 2, :mod:`readers.bucket_keys`: boundaries from the index's
quantiles or given, ``scale_batch``):

3. **Chunks inside buckets** (`bucket_batches`). Each bucket's members, in id order, are cut
   into chunks of ``chunk_size`` neighbouring members; the chunks of a bucket are shuffled,
   and the samples inside each block of ``window`` consecutive chunks of one bucket are
   shuffled (as ``readers.order.chunk_order`` does for the whole dataset). Reads inside a
   batch stay near-sequential, and every sample stays in its bucket. Over a weighted mixture
   (``weights=``) the members are the epoch's draws instead (``readers.mixing.epoch_draws``:
   each source's exact count, grouped by pass, ids ascending inside a pass), so a sample
   drawn twice in one epoch sits in two chunks of two passes.
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
an epoch saved at another world size is its unconsumed batches, still bucket-pure. With a
weighted mixture the number of batches differs from epoch to epoch (the draws fill the buckets
differently) but is fixed for each (seed, epoch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from readers.bucket_keys import bucket_dtype
from readers.order import IntArray, check_nonneg, chunk_ranges

__all__ = ["bucket_batches"]


def bucket_batches(
    ids: IntArray | None,
    bucket: npt.NDArray[np.integer[Any]],
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
    small = bucket.astype(bucket_dtype(k), copy=False)
    grouped = np.argsort(small, kind="stable")
    counts = np.bincount(bucket, minlength=k).astype(np.int64)
    pb = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    rng = np.random.default_rng([int(seed), int(epoch)]) if shuffle else None
    if rng is not None and n:
        grouped = _shuffle_inside_buckets(grouped, counts, pb, chunk_size, window, rng)
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
    return _gather_runs(grouped, start, size, ids), bounds, bb[order]


_PIECE = 1 << 19  # samples per piece of the gathers below: a few MiB of scratch, reused


def _runs(starts: IntArray, lengths: IntArray) -> IntArray:
    """The ranges ``[starts[i], starts[i] + lengths[i])`` one after the other (int64).

    Built as one cumulative sum of steps of 1 with a jump where a range begins: one array,
    where ``repeat(starts - offsets, lengths) + arange`` makes three.
    """
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    out = np.ones(int(lengths.sum()), dtype=np.int64)
    if out.size == 0:
        return out
    ends = np.cumsum(lengths)[:-1]
    out[0] = starts[0]
    out[ends] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    np.cumsum(out, out=out)
    return out


def _gather_runs(
    values: IntArray, starts: IntArray, lengths: IntArray, outer: IntArray | None = None
) -> IntArray:
    """``values[_runs(starts, lengths)]`` (then looked up in ``outer``), a piece at a time.

    Only the result is a full-size array; the positions of each piece are scratch.
    """
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.int64)
    i = 0
    while i < lengths.size:
        j = max(i + 1, int(np.searchsorted(ends, (ends[i - 1] if i else 0) + _PIECE)))
        a = int(ends[i - 1]) if i else 0
        part = values[_runs(starts[i:j], lengths[i:j])]
        out[a : int(ends[j - 1])] = part if outer is None else outer[part]
        i = j
    return out


def _shuffle_inside_buckets(
    grouped: IntArray,
    counts: IntArray,
    pb: IntArray,
    chunk_size: int,
    window: int,
    rng: np.random.Generator,
) -> IntArray:
    """``grouped`` reordered inside each bucket's positions ``[pb[b], pb[b+1])``.

    The bucket's chunks are shuffled, then samples shuffled inside blocks of ``window`` chunks.
    """
    lo, hi = chunk_ranges(pb, chunk_size=chunk_size)
    per_bucket = -(-counts // chunk_size)
    chunk_bucket = np.repeat(np.arange(counts.size, dtype=np.int64), per_bucket)
    perm = rng.permutation(lo.size)
    perm = perm[np.argsort(chunk_bucket[perm], kind="stable")]  # random order inside buckets
    plen = (hi - lo)[perm]
    if window == 0:
        return _gather_runs(grouped, lo[perm], plen)
    within = np.arange(lo.size, dtype=np.int64) - np.repeat(
        np.cumsum(per_bucket) - per_bucket, per_bucket
    )
    block = np.cumsum(within % window == 0) - 1  # blocks never span two buckets
    lengths = np.bincount(block, weights=plen).astype(np.int64)
    return _shuffle_blocks(grouped, lengths, rng, via=_runs(lo[perm], plen))


def _shuffle_blocks(
    values: IntArray, lengths: IntArray, rng: np.random.Generator, *, via: IntArray | None = None
) -> IntArray:
    """``values`` (or ``values[via]``) with each block shuffled uniformly in place.

    The blocks are runs of consecutive positions of the given lengths; they keep their places.

    One row per block, sorted on its own: a random 32-bit key above the column number, so keys
    are distinct and every correct sort gives the same order (no tie left to the sort
    algorithm, whatever numpy or CPU), and the low 32 bits of the sorted keys are the
    permutation. The keys are drawn, sorted in place (the column rides in the key, so no
    argsort) and turned into positions a few hundred rows at a time, in scratch that stays in
    cache and is reused; the draws are those of one ``(rows, width)`` call, in order. Only
    the result is a full-size array.
    """
    out = np.empty(int(lengths.sum()), dtype=np.int64)
    if lengths.size == 0:
        return out
    rows, width = lengths.size, int(lengths.max())
    col = np.arange(width, dtype=np.uint64)
    first = np.cumsum(lengths) - lengths
    per = max(1, _PIECE // width)
    for r0 in range(0, rows, per):
        r1 = min(rows, r0 + per)
        keys = rng.integers(0, 2**32, size=(r1 - r0, width), dtype=np.uint64)
        keys <<= np.uint64(32)
        keys |= col
        size = lengths[r0:r1]
        pad = None
        if int(size.min()) < width:  # a short row (the last block of a bucket, mostly)
            pad = col[None, :] >= size.astype(np.uint64)[:, None]
            keys[pad] = np.iinfo(np.uint64).max  # sorts last in its row, never read
        keys.sort(axis=1)
        keys &= np.uint64(0xFFFFFFFF)  # the column: where the row's sample comes from
        keys += first[r0:r1].astype(np.uint64)[:, None]
        idx = keys.view(np.int64)
        pos = idx.ravel() if pad is None else idx[~pad]
        a, b = int(first[r0]), int(first[r1 - 1] + size[-1])
        out[a:b] = values[pos if via is None else via[pos]]
    return out
