"""Which bucket each selected sample falls in, from the index alone: keys, boundaries, sizes.

Steps 1 and 2 of ``readers.BucketBatchSampler``'s epochs (:mod:`readers.bucket_order` has the
rest); no paddle, no I/O but the index's columns (no record is read or decoded):

1. **Buckets** (`bucket_edges`, `assign_buckets`). The key is the index's ``width``,
   ``height`` or ``width / height`` (`key_values`), or an array of one value per sample.
   ``buckets=K`` puts the boundaries at the ``j/K`` quantiles of the selected samples' values
   (exact values of the index, repeated ones merged, so there may be fewer than ``K``
   buckets, none empty); a list of boundaries ``[e1, ..., e(K-1)]`` is taken as given
   (buckets may be empty). Bucket ``b`` holds the samples with ``edge[b-1] <= value <
   edge[b]``. Integer widths and heights, and aspects of them, are coded into a table of the
   distinct values (`key_codes`): quantiles are then found by counting and buckets by one
   lookup per sample, with the same result as the partition and binary search used for other
   values (a 10^7-row index in a fraction of a second).
2. **Batch sizes** (`bucket_batch_sizes`): ``batch_size`` in every bucket, an explicit list
   ``batch_sizes``, or ``scale_batch=True``: the bucket of the largest values holds
   ``batch_size`` and bucket ``b`` holds ``max(1, floor(batch_size * top / top_b))``, where
   ``top_b`` is the largest value in it, so ``batch size x width`` stays about what the widest
   batch needs (OCR multi-scale training).

`plan_buckets` runs both for a sampler and refuses samples whose key the index does not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, check_nonneg
from readers.selection import index_columns

__all__ = [
    "KEYS",
    "BucketPlan",
    "KeyCodes",
    "assign_buckets",
    "bucket_batch_sizes",
    "bucket_dtype",
    "bucket_edges",
    "key_codes",
    "key_values",
    "plan_buckets",
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
    return _aspect(width, height)


def _aspect(width: FloatArray, height: FloatArray) -> FloatArray:
    """``width / height`` of float64 sizes; -1 where the height is not positive (unknown)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        aspect: FloatArray = np.where(height > 0, width / np.where(height > 0, height, 1.0), -1.0)
    return aspect


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
    height`` computed as `key_values` computes it (`_aspect`: equal floats, bit for bit). None
    for a table too large to pay (more than ``_TABLE_RANGE`` codes, or far more than samples),
    float values, no selected sample, or a key `key_values` refuses (it then says why).

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
    return KeyCodes(codes, _aspect(w, h))


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
    bucket: npt.NDArray[np.integer[Any]],
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


@dataclass(frozen=True)
class BucketPlan:
    """The buckets of the selected samples: boundaries, each sample's bucket, batch sizes.

    Attributes:
        edges: The boundaries (`bucket_edges`); ``len + 1`` buckets.
        bucket: The bucket of each selected sample, in the order of the selected ids (the
            smallest integer dtype that fits).
        sizes: Samples per batch in each bucket (`bucket_batch_sizes`).
    """

    edges: FloatArray
    bucket: npt.NDArray[np.integer[Any]]
    sizes: IntArray

    @property
    def counts(self) -> IntArray:
        """Selected samples in each bucket."""
        return np.bincount(self.bucket, minlength=self.edges.size + 1).astype(np.int64)


def plan_buckets(
    dataset: Any,
    key: str | npt.ArrayLike,
    *,
    ids: IntArray | None,
    buckets: int | Sequence[float],
    batch_size: int,
    batch_sizes: Sequence[int] | None = None,
    scale_batch: bool = False,
) -> BucketPlan:
    """Steps 1 and 2 (module docstring) for the samples ``ids`` of ``dataset`` (None: all).

    Raises:
        ValueError: a bad key, boundaries or batch sizes, or selected samples whose key the
            index does not know (-1) or that is not finite (the message lists their ids).
    """
    coded = key_codes(dataset, key, ids)
    what = key if isinstance(key, str) else "values"
    if coded is None:  # a float key array, or a range too wide to code
        values = key_values(dataset, key)
        if ids is not None:
            values = values[ids]
        _check_known(values, what, ids)
        edges = bucket_edges(values, buckets)
        bucket: npt.NDArray[np.integer[Any]] = assign_buckets(values, edges)
        top_values, top_bucket = values, bucket
    else:  # the same buckets, from the distinct values and their counts
        held = coded.counts()
        _check_known(coded.table, what, ids, coded, held)
        edges = bucket_edges(coded.table, buckets, counts=held)
        bucket = coded.buckets(edges)
        top_values = coded.table[held > 0]
        top_bucket = assign_buckets(top_values, edges)
    sizes = bucket_batch_sizes(
        top_values,
        top_bucket,
        num_buckets=edges.size + 1,
        batch_size=batch_size,
        batch_sizes=batch_sizes,
        scale_batch=scale_batch,
    )
    return BucketPlan(edges, bucket, sizes)


def _unknown(values: npt.NDArray[Any], what: str) -> npt.NDArray[np.bool_] | None:
    """Where a key is unknown to the index (-1) or not finite; None where all are known."""
    floats = not np.issubdtype(values.dtype, np.integer)
    if what == "values":
        if not floats or bool(np.all(np.isfinite(values))):
            return None
        unknown: npt.NDArray[np.bool_] = ~np.isfinite(values)
        return unknown
    if values.size == 0 or (values.min() > 0 and (not floats or np.isfinite(values.max()))):
        return None
    unknown = values <= 0  # the index writes -1 for a size it does not know
    if floats:
        unknown |= ~np.isfinite(values)
    return unknown


def _check_known(
    values: npt.NDArray[Any],
    what: str,
    ids: IntArray | None,
    coded: KeyCodes | None = None,
    held: IntArray | None = None,
) -> None:
    """Refuse selected samples whose key the index does not know (-1) or that is not finite.

    ``values`` are the samples' values, or with ``coded`` its table (``held`` samples per
    entry).
    """
    unknown = _unknown(values, what)
    if unknown is None:
        return
    if coded is not None and held is not None:
        if not np.any(unknown & (held > 0)):
            return
        unknown = unknown[coded.codes]
    bad = np.flatnonzero(unknown)
    bad_ids = bad if ids is None else ids[bad]
    raise ValueError(
        f"{bad.size} selected samples have no {what} in the index (ids "
        f"{bad_ids[:5].tolist()}{' ...' if bad.size > 5 else ''}); leave them out with "
        "indices=, or pass key=<an array of one value per sample>"
    )
