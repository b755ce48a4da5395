"""Batches of similar width, height or aspect from the index alone: ``BucketBatchSampler`` and
the pure functions of (seed, epoch) and the index that its epochs are.

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

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.epochs import DEFAULT_WINDOW, RankedEpochs
from readers.io.hints import resolve_chunk_size
from readers.order import IntArray, check_nonneg, chunk_ranges
from readers.resume import fingerprint, read_sampler_state, sampler_state
from readers.selection import SizedDataset, dataset_bounds, index_columns, select_ids

__all__ = [
    "KEYS",
    "BucketBatchSampler",
    "assign_buckets",
    "bucket_batch_sizes",
    "bucket_batches",
    "bucket_edges",
    "key_values",
]

KEYS = ("width", "height", "aspect")
FloatArray = npt.NDArray[np.float64]
_TABLE_RANGE = 1 << 22  # integer keys spanning fewer values are counted, not sorted


# --------------------------------------------------------------------------- pure functions


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
    """A permutation of positions ``[0, n)`` that stays inside each bucket's ``[pb[b], pb[b+1])``:
    the bucket's chunks shuffled, then samples shuffled inside blocks of ``window`` chunks."""
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
    """A permutation of ``[0, sum(lengths))`` that shuffles each block of consecutive
    positions (of the given lengths) uniformly and keeps the blocks in place.

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


# --------------------------------------------------------------------------- the sampler


class BucketBatchSampler(RankedEpochs):
    """Bucket-pure batches of this rank, for ``paddle.io.DataLoader(batch_sampler=...)``.

    Each batch holds samples of one bucket of width, height or aspect (``width / height``),
    read from the dataset's index alone; the epoch is a pure function of ``(seed, epoch)`` and
    the index (see the module docstring), split over ranks so that every rank yields the same
    number of batches. ``set_epoch`` chooses the epoch; ``state_dict(consumed_batches=k)`` and
    ``load_state_dict`` resume mid-epoch, at the saved world size or another (then the rest is
    the batches no rank had consumed, split over the new ranks; ``readers.resume``).

    Args:
        dataset: Sized, with an index holding ``width``/``height`` (a packed dataset, or a
            ``ConcatDataset`` of them), unless ``key`` is an array; optional ``shard_bounds``.
        batch_size: Samples per batch; with ``scale_batch``, those of the widest bucket.
        key: ``"width"``, ``"height"``, ``"aspect"``, or an array of one value per sample.
        buckets: ``K``: quantile buckets of the selected samples (at most ``K``, none empty);
            or the boundaries ``[e1, ..., e(K-1)]``, bucket ``b`` holding
            ``e(b) <= value < e(b+1)``.
        batch_sizes: One batch size per bucket, instead of ``batch_size`` in each.
        scale_batch: Bucket ``b`` holds ``floor(batch_size * top / top_b)`` samples (``top_b``
            its largest value, ``top`` the largest of all), so ``batch size x width`` stays
            about constant.
        chunk_size: Neighbouring members of a bucket per chunk; default about 1 MiB of stored
            bytes by the index (as for the chunked sampler).
        window: Chunks of a bucket per shuffle block; 0 keeps each chunk in id order.
        shuffle: False: ids ascending and buckets in order.
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop each bucket's short last batch, and the last ``B % world_size``
            batches, instead of keeping the short batches and padding by repetition.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
        indices: A boolean mask over the dataset or an array of ids: sample only these.
        labels: Label values to keep (needs ``dataset.labels``); combined with ``indices``.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        batch_size: int,
        *,
        key: str | npt.ArrayLike = "width",
        buckets: int | Sequence[float] = 8,
        batch_sizes: Sequence[int] | None = None,
        scale_batch: bool = False,
        chunk_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        indices: npt.ArrayLike | None = None,
        labels: Iterable[int | str] | None = None,
    ) -> None:
        check_nonneg("batch_size", batch_size, 1)
        if chunk_size is not None:
            check_nonneg("chunk_size", chunk_size, 1)
        check_nonneg("window", window)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self._dataset = dataset
        self._window = int(window)
        self._key = key if isinstance(key, str) else "values"
        dataset_bounds(dataset)  # checks shard_bounds against len
        self._ids = select_ids(dataset, indices, labels)  # None: all
        values = key_values(dataset, key)
        if self._ids is not None:
            values = values[self._ids]
        self._check_known(values)
        self._edges = bucket_edges(values, buckets)
        self._bucket = assign_buckets(values, self._edges)
        self._sizes = bucket_batch_sizes(
            values,
            self._bucket,
            num_buckets=self._edges.size + 1,
            batch_size=self.batch_size,
            batch_sizes=batch_sizes,
            scale_batch=scale_batch,
        )
        counts = np.bincount(self._bucket, minlength=self._edges.size + 1)
        nb = counts // self._sizes if drop_last else -(-counts // self._sizes)
        self._counts = counts.astype(np.int64)
        self._setup_epochs(
            rank=rank,
            world_size=world_size,
            seed=seed,
            chunk_size=resolve_chunk_size(dataset, chunk_size, self._ids),
            shuffle=shuffle,
            drop_last=drop_last,
            num_ordered=int(nb.sum()),
        )
        self._offset = 0  # where the next pass starts, in batches of this rank's share
        self._done: int | None = None  # batches the latest pass yielded (None: no pass)
        self._cache: tuple[int, IntArray, IntArray, IntArray] | None = None
        self._buckets_crc: int | None = None

    def _check_known(self, values: npt.NDArray[Any]) -> None:
        """Refuse samples whose key the index does not know (-1) or that is not finite."""
        floats = not np.issubdtype(values.dtype, np.integer)
        if self._key == "values":
            if not floats or bool(np.all(np.isfinite(values))):
                return
            unknown = ~np.isfinite(values)
        else:
            if values.size == 0 or (values.min() > 0 and (not floats or np.isfinite(values.max()))):
                return
            unknown = values <= 0  # the index writes -1 for a size it does not know
            if floats:
                unknown |= ~np.isfinite(values)
        bad = np.flatnonzero(unknown)
        ids = bad if self._ids is None else self._ids[bad]
        raise ValueError(
            f"{bad.size} selected samples have no {self._key} in the index (ids "
            f"{ids[:5].tolist()}{' ...' if bad.size > 5 else ''}); leave them out with "
            "indices=, or pass key=<an array of one value per sample>"
        )

    # ------------------------------------------------------------------ properties
    @property
    def boundaries(self) -> list[float]:
        """The boundaries between buckets (``len + 1`` buckets)."""
        return [float(e) for e in self._edges]

    @property
    def batch_sizes(self) -> list[int]:
        """Samples per batch in each bucket."""
        return [int(b) for b in self._sizes]

    @property
    def bucket_counts(self) -> list[int]:
        """Selected samples in each bucket."""
        return [int(c) for c in self._counts]

    @property
    def num_batches(self) -> int:
        """Batches of an epoch over all ranks (before padding or dropping)."""
        return self._num_ordered

    @property
    def start_batch(self) -> int:
        """Batches of this rank's share the next pass skips: the loaded state's position at
        the saved world size, 0 after a load at another (count consumed batches from here)."""
        return self._offset

    def __len__(self) -> int:
        """Batches this rank yields per epoch (every rank the same)."""
        return RankedEpochs.__len__(self)

    # ------------------------------------------------------------------ order
    def _start_epoch(self) -> None:
        self._offset = 0
        self._done = None

    def epoch_batches(self, epoch: int | None = None) -> tuple[IntArray, IntArray, IntArray]:
        """The epoch's global batches, ``(flat, bounds, batch_bucket)`` (`bucket_batches`)."""
        epoch = self._epoch if epoch is None else int(epoch)
        if self._cache is None or self._cache[0] != epoch:
            flat, bounds, bucket = bucket_batches(
                self._ids,
                self._bucket,
                batch_sizes=self._sizes,
                chunk_size=self._chunk_size,
                window=self._window,
                seed=self._seed,
                epoch=epoch,
                shuffle=self._shuffle,
                drop_last=self.drop_last,
            )
            self._cache = (epoch, flat, bounds, bucket)
        return self._cache[1], self._cache[2], self._cache[3]

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """The numbers of this rank's batches in ``epoch`` (into `epoch_batches`), in order."""
        epoch = self._epoch if epoch is None else int(epoch)
        return self._share_of(np.arange(self._num_ordered, dtype=np.int64), epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return self._batches(self._epoch, self._offset)

    def _batches(self, epoch: int, offset: int) -> Iterator[list[int]]:
        flat, bounds, _ = self.epoch_batches(epoch)
        share = self.rank_order(epoch)
        self._done = offset
        for j in range(offset, share.size):
            b = int(share[j])
            self._done = j + 1
            yield flat[bounds[b] : bounds[b + 1]].tolist()
        self._offset = 0  # the resume offset is used once

    # ------------------------------------------------------------------ resume
    def _params(self) -> dict[str, Any]:
        if self._buckets_crc is None:
            self._buckets_crc = fingerprint(self._bucket, self._ids)
        return self._order_params() | {
            "window": self._window,
            "key": self._key,
            "boundaries": self._edges.tolist(),
            "batch_sizes": self._sizes.tolist(),
            "num_selected": int(self._bucket.size),
            "buckets_crc32": self._buckets_crc,
            "records_crc32": self._dataset_crc32(self._dataset),
        }

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The resume state (version 2, plain JSON; format in :mod:`readers.resume`).

        Args:
            consumed_batches: Batches of this rank's share the model consumed in the current
                epoch, counted from its start (or from an elastic resume). Default: the number
                this sampler has yielded, which runs ahead of training under a prefetching
                ``DataLoader``.
        """
        if consumed_batches is None:
            position = self._offset if self._done is None else self._done
        else:
            check_nonneg("consumed_batches", consumed_batches)
            if consumed_batches > len(self):
                raise ValueError(
                    f"consumed_batches={consumed_batches} exceeds this rank's {len(self)} "
                    "batches per epoch"
                )
            position = int(consumed_batches)
        return sampler_state(
            kind="BucketBatchSampler",
            epoch=self._epoch,
            position=position,
            world_size=self._world_size,
            history=self._history,
            params=self._params(),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass yields the rest of the saved epoch (see the class docstring).

        Raises:
            ValueError: the state is incomplete, of another sampler class or dataset, or was
                saved with other parameters (key, boundaries, batch sizes, seed, ...).
        """
        r = read_sampler_state(
            state,
            self._params(),
            kind="BucketBatchSampler",
            world_size=self._world_size,
            num_units=self._num_ordered,
            drop_last=self._drop_last,
        )
        self._set_history(r.epoch, r.history, r.rest)
        self._offset = r.position
        self._done = None
