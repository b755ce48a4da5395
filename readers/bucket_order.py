"""The epochs of ``readers.BucketBatchSampler`` as pure functions of (seed, epoch) and the index.

Batches of similar width, height or aspect, from the index alone; no paddle, no I/O.

One epoch, for all ranks together, from the key values of the selected samples (the index's
``width``, ``height`` or ``width / height``; no record is read or decoded):

1. **Buckets** (`bucket_edges`, `assign_buckets`). ``buckets=K`` puts the boundaries at the
   ``j/K`` quantiles of the selected samples' values (exact values of the index, repeated ones
   merged, so there may be fewer than ``K`` buckets, none empty); a list of boundaries
   ``[e1, ..., e(K-1)]`` is taken as given (buckets may be empty). Bucket ``b`` holds the
   samples with ``edge[b-1] <= value < edge[b]``. Integer widths and heights, and aspects of
   them, are coded into a table of the distinct values (`key_codes`): quantiles are then
   found by counting and buckets by one lookup per sample, with the same result as the
   partition and binary search used for other values (a 10^7-row index in a fraction of a
   second).
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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, check_nonneg, chunk_ranges
from readers.selection import index_columns

__all__ = [
    "KEYS",
    "KeyCodes",
    "assign_buckets",
    "bucket_batch_sizes",
    "bucket_batches",
    "bucket_dtype",
    "bucket_edges",
    "key_codes",
    "key_values",
]

KEYS = ("width", "height", "aspect")
FloatArray = npt.NDArray[np.float64]
_TABLE_RANGE = 1 << 22  # keys of at most this many codes are counted, not sorted


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


@dataclass(frozen=True)
class KeyCodes:
    """Key values dictionary-encoded: sample ``j`` holds ``table[codes[j]]``.

    Widths and heights are integers of a small range and an aspect is a ratio of two of them,
    so an index of millions of rows holds few distinct values. Counting the codes and looking
    each sample's bucket up by its code replace a partition (quantiles) and a binary search
    (buckets) over every sample, with the same result (`key_codes`).
    """

    codes: npt.NDArray[np.integer[Any]]
    table: npt.NDArray[Any]

    def counts(self) -> IntArray:
        """Samples per entry of the table."""
        return np.bincount(self.codes, minlength=self.table.size).astype(np.int64)

    def buckets(self, edges: FloatArray) -> npt.NDArray[np.integer[Any]]:
        """Each sample's bucket (as `assign_buckets`), in the smallest unsigned dtype that fits."""
        per_code = np.searchsorted(edges, self.table, side="right")
        table: npt.NDArray[np.integer[Any]] = per_code.astype(bucket_dtype(edges.size + 1))
        out: npt.NDArray[np.integer[Any]] = table[self.codes]
        return out


def bucket_dtype(num_buckets: int) -> type[np.integer[Any]]:
    """The smallest integer dtype that numbers ``num_buckets`` buckets."""
    return np.uint8 if num_buckets <= 256 else np.uint16 if num_buckets <= 65536 else np.int64


def _table_fits(size: int, samples: int) -> bool:
    """Whether a table of ``size`` codes pays for ``samples`` samples: it is counted whole."""
    return size <= min(_TABLE_RANGE, 4 * samples + 65536)


def _int_codes(v: npt.NDArray[Any]) -> KeyCodes | None:
    """Integers of a small range (`_table_fits`) as codes ``v - min``; else None."""
    if v.size == 0 or not np.issubdtype(v.dtype, np.integer):
        return None
    lo, hi = int(v.min()), int(v.max())
    if not _table_fits(hi - lo + 1, v.size):
        return None
    return KeyCodes(v - v.dtype.type(lo), np.arange(lo, hi + 1, dtype=np.int64))


def key_codes(
    dataset: Any, key: str | npt.ArrayLike, ids: IntArray | None = None
) -> KeyCodes | None:
    """The selected samples' `key_values` as `KeyCodes`, or None where they do not code small.

    Integer widths, heights and key arrays code as ``value - min``; an aspect of integer
    widths and heights codes the ``(width, height)`` pair, its table holding ``width /
    height`` computed exactly as `key_values` does (so equal floats, bit for bit). None for a
    table too large to pay (more than ``_TABLE_RANGE`` codes, or far more than samples), float
    values, no selected sample, or a key `key_values` refuses (it then says why).

    Args:
        dataset: Its index supplies the columns.
        key: As for `key_values`.
        ids: The selected ids (None: all).
    """
    if not isinstance(key, str):
        v = np.asarray(key)
        if v.shape != (len(dataset),):
            return None
        return _int_codes(v if ids is None else v[ids])
    if key not in KEYS:
        return None
    names = ("width", "height") if key == "aspect" else (key,)
    cols = index_columns(dataset, *names)
    if cols is None:
        return None
    if key != "aspect":
        v = np.asarray(cols[0], dtype=np.int64)
        return _int_codes(v if ids is None else v[ids])
    width, height = (np.asarray(c) if ids is None else np.asarray(c)[ids] for c in cols)
    if width.size == 0 or not all(np.issubdtype(c.dtype, np.integer) for c in (width, height)):
        return None
    wlo, whi, hlo, hhi = int(width.min()), int(width.max()), int(height.min()), int(height.max())
    wspan, hspan = whi - wlo + 1, hhi - hlo + 1
    if not _table_fits(wspan * hspan, width.size):
        return None
    codes = width.astype(np.int64)  # a copy, then worked on in place
    codes -= wlo
    if hspan > 1:
        codes *= hspan
        codes += height.astype(np.int64, copy=False)
        codes -= hlo
    w = np.repeat(np.arange(wlo, whi + 1, dtype=np.float64), hspan)
    h = np.tile(np.arange(hlo, hhi + 1, dtype=np.float64), wspan)
    with np.errstate(divide="ignore", invalid="ignore"):
        table = np.where(h > 0, w / np.where(h > 0, h, 1.0), -1.0)
    return KeyCodes(codes, table)


def bucket_edges(
    values: npt.ArrayLike, buckets: int | Sequence[float], *, counts: npt.ArrayLike | None = None
) -> FloatArray:
    """The boundaries between buckets: ``K`` quantile buckets of ``values``, or a given list.

    Args:
        values: The key values of the selected samples; with ``counts``, a table of values
            (any order, repeats allowed) that ``counts[i]`` samples each hold.
        buckets: ``K >= 1``: boundaries at the ``j/K`` quantiles (``j = 1 .. K-1``), values
            found in ``values``, repeats and a boundary at the minimum dropped, so every bucket
            is non-empty; or the boundaries themselves, strictly increasing.
        counts: Samples per entry of ``values`` (`KeyCodes.counts`): the quantiles are those
            of the samples, found by counting instead of partitioning them.

    Returns:
        Increasing boundaries (float64); there are ``len + 1`` buckets.
    """
    v = np.asarray(values)
    if isinstance(buckets, int | np.integer) and not isinstance(buckets, bool):
        check_nonneg("buckets", int(buckets), 1)
        if counts is None:
            coded = _int_codes(v)
            if coded is not None:
                v, counts = coded.table, coded.counts()
        if counts is not None:
            return _counted_edges(v, np.asarray(counts, dtype=np.int64), int(buckets))
        m = v.size
        if m == 0 or buckets == 1:
            return np.zeros(0, dtype=np.float64)
        kth = np.unique((np.arange(1, int(buckets), dtype=np.int64) * m) // int(buckets))
        picked = np.partition(v, kth)[kth].astype(np.float64)
        edges = np.unique(picked)
        return edges[edges > float(v.min())]
    if isinstance(buckets, str | bytes) or not isinstance(buckets, Iterable):
        raise ValueError(f"buckets must be a count or a list of boundaries, got {buckets!r}")
    edges = np.asarray(list(buckets), dtype=np.float64)
    if edges.ndim != 1 or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise ValueError(
            f"bucket boundaries must be finite and strictly increasing, got {edges.tolist()}"
        )
    return edges


def _counted_edges(table: npt.NDArray[Any], counts: IntArray, buckets: int) -> FloatArray:
    """`bucket_edges` of the samples that hold ``table[i]`` ``counts[i]`` times each.

    The ``k``-th smallest sample value (what ``np.partition`` picks) is the value of the first
    entry, in value order, whose running count exceeds ``k``.
    """
    m = int(counts.sum())
    if m == 0 or buckets == 1:
        return np.zeros(0, dtype=np.float64)
    kth = np.unique((np.arange(1, buckets, dtype=np.int64) * m) // buckets)
    held = np.flatnonzero(counts)  # sort only the values some sample holds
    table, counts = table[held], counts[held]
    by_value = np.argsort(table, kind="stable")
    ends = np.cumsum(counts[by_value])
    picked = table[by_value[np.searchsorted(ends, kth, side="right")]].astype(np.float64)
    lo = float(table[by_value[0]])
    edges = np.unique(picked)
    return edges[edges > lo]


def assign_buckets(values: npt.ArrayLike, edges: FloatArray) -> IntArray:
    """The bucket of each value: ``b`` with ``edges[b-1] <= value < edges[b]``."""
    v = np.asarray(values)
    coded = _int_codes(v)
    if coded is not None:  # one lookup per value instead of a binary search
        return coded.buckets(edges).astype(np.int64)
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
