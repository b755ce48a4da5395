"""Weighted mixing of several sources as pure functions of (seed, epoch) and the layout.

Used by :mod:`readers.samplers` and :mod:`readers.stream` over a ``readers.ConcatDataset``
(through :class:`readers.mixture.Mixture`); no paddle, no I/O. Source ``i`` holds ``m_i``
selected samples (its local ids, shard bounds and chunk size are a `MixSource`); global ids
are ``offset_i + local id``.

1. **Exact counts** (``mix_counts``). An epoch draws ``N`` samples (``epoch_samples``), source
   ``i`` contributing ``c_i``: the largest-remainder rounding of the quotas ``N * w_i / sum(w)``,
   computed in exact fractions. Each ``c_i`` is the floor or the ceiling of its quota, and
   ``sum(c) == N``: every count gets its floor, and the ``N - sum(floors)`` samples left go one
   each to the largest remainders (ties: the lower source number). Counts are the same in every
   epoch; they are numbers, not random expectations.
2. **Passes** (``pass_order``). Source ``i`` is read in an endless sequence of passes; pass ``p``
   is ``readers.order.chunk_order`` of that source with the window shuffle off, seeded with
   ``(source_seed(seed, i), p)``: a permutation of its selected ids in chunks of neighbouring
   ids. Epoch ``e`` takes positions ``[e * c_i, (e + 1) * c_i)`` of the sequence (``draws``):
   epoch ``e`` starts where epoch ``e - 1`` stopped, so within a pass nothing repeats and every
   sample is drawn once before any is drawn twice, over epochs as well; a source drawn more
   than its size in one epoch runs through several passes. The start is arithmetic, so epoch
   ``e`` costs the same as epoch 0.
3. **Segments.** The draws of a source are cut into *segments*: a chunk of a pass, cut where a
   pass or the epoch begins or ends. A segment is one nearly sequential read of one source.
4. **mix="epoch"** (``epoch_order``). The segments of all sources are interleaved by the key
   ``(k + u) / s_i`` for the ``k``-th of the ``s_i`` segments of source ``i`` (``u`` uniform
   in [0, 1), ``default_rng([seed, epoch, MIX_TAG])``): each source's segments keep their order
   and are spread evenly over the epoch, so the proportions hold in every stretch of the epoch,
   not only over the whole. Then the samples inside each block of ``window`` consecutive
   segments are shuffled, as ``chunk_order`` does inside blocks of chunks (``window=0``: off).
5. **mix="batch"** (``batch_order``). Every batch of ``batch_size`` holds ``b_i`` samples of
   source ``i``, ``b = mix_counts(batch_size, w)`` (each ``b_i >= 1``). The epoch is
   ``N // batch_size`` such batches (``N`` is rounded down to whole batches; source ``i`` then
   contributes ``(N // batch_size) * b_i``). Each source's draws are shuffled inside blocks of
   ``window`` segments, batch ``k`` takes draws ``[k * b_i, (k + 1) * b_i)`` of each source,
   and the samples inside a batch are shuffled.
6. **Ranks** (``rank_share``). The order of an epoch is one global sequence that does not
   depend on the world size or the rank; ranks take contiguous slices of it, as
   ``readers.order.split_for_rank`` does. With mix="batch" the unit of that split is a
   batch (a rank's share is whole batches, padded or dropped by whole batches), so that every
   batch a rank forms is one of the mixed batches.

``shuffle=False`` reads every pass in id order, interleaves segments at ``u = 0.5`` and skips
the shuffles inside blocks and batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, check_nonneg, chunk_order, chunk_ranges, rank_span

__all__ = [
    "MIXES",
    "MIX_TAG",
    "MixSource",
    "batch_order",
    "batch_perm",
    "check_weights",
    "draws",
    "draws_at",
    "epoch_draws",
    "epoch_order",
    "interleave_perm",
    "mix_counts",
    "pass_order",
    "rank_share",
    "source_seed",
]

MIXES = ("epoch", "batch")
"""The ways sources are mixed: over the whole epoch, or with fixed counts in every batch."""

MIX_TAG = 0x4D4958  # "MIX": keeps the mixing generator apart from any chunk_order generator


# --------------------------------------------------------------------------- counts


def check_weights(weights: Sequence[float] | npt.ArrayLike, num_sources: int) -> tuple[float, ...]:
    """The weights as floats, one per source, each finite and > 0.

    Raises:
        ValueError: a weight is 0, negative, not a finite number, or there are not
            ``num_sources`` of them.
    """
    values = None if isinstance(weights, str | bytes) else _as_list(weights)
    if values is None or len(values) != num_sources:
        got = "a single value" if values is None else f"{len(values)}"
        raise ValueError(
            f"weights must have one entry per source ({num_sources} sources), got {got}: "
            f"{weights!r}; give weights=[w0, w1, ...] in the order of the ConcatDataset's sources"
        )
    out = []
    for i, w in enumerate(values):
        ok = isinstance(w, int | float | np.integer | np.floating) and not isinstance(w, bool)
        if not ok or not math.isfinite(float(w)) or float(w) <= 0:  # type: ignore[arg-type]
            raise ValueError(
                f"weights[{i}] is {w!r}; every weight must be a finite number > 0 (a source "
                "that should not be read does not belong in the ConcatDataset)"
            )
        out.append(float(w))  # type: ignore[arg-type]
    return tuple(out)


def _as_list(values: object) -> list[object] | None:
    """``list(values)``, or None when ``values`` is not iterable."""
    if not isinstance(values, Iterable):
        return None
    return list(values)


def mix_counts(total: int, weights: Sequence[float]) -> IntArray:
    """``total`` split in proportion to ``weights`` by the largest remainder, exactly.

    Args:
        total: The number to split (``N`` samples of an epoch, or a batch size).
        weights: Positive weights (`check_weights`).

    Returns:
        int64 counts, ``sum == total``, each the floor or the ceiling of
        ``total * w_i / sum(w)``; the remainder goes to the largest fractional parts, ties to
        the lower index.
    """
    check_nonneg("total", total)
    exact = [Fraction(w) for w in weights]
    whole = sum(exact, Fraction(0))
    quotas = [total * w / whole for w in exact]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return np.array(counts, dtype=np.int64)


# --------------------------------------------------------------------------- one source


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture: its layout in local ids and where its global ids start.

    Attributes:
        bounds: The source's shard bounds ``[0, ..., n_i]`` (local ids).
        ids: Its selected local ids (sorted), or None for all of them.
        chunk_size: Selected samples per chunk of this source.
        offset: Its first global id.
    """

    bounds: IntArray
    ids: IntArray | None
    chunk_size: int
    offset: int

    @property
    def size(self) -> int:
        """Selected samples of this source (``m_i``)."""
        return int(self.bounds[-1]) if self.ids is None else int(self.ids.size)

    def chunk_lo(self) -> IntArray:
        """The first local id of each chunk, increasing (``readers.order.chunk_ranges``)."""
        return chunk_ranges(self.bounds, chunk_size=self.chunk_size, ids=self.ids)[0]


def source_seed(seed: int, source: int) -> int:
    """The seed of source ``source``'s passes: distinct per source, a pure function of both."""
    check_nonneg("seed", seed)
    check_nonneg("source", source)
    state = np.random.SeedSequence([int(seed), int(source), MIX_TAG]).generate_state(1)
    return int(state[0])


def pass_order(src: MixSource, *, seed: int, source: int, pass_: int, shuffle: bool) -> IntArray:
    """Pass ``pass_`` of source ``source``: its selected local ids, chunked (window off)."""
    return _pass(src, source_seed(seed, source), pass_, shuffle)


def _pass(src: MixSource, seed: int, pass_: int, shuffle: bool) -> IntArray:
    if src.size == 1 or not shuffle:  # the same every pass: skip the generator
        return np.arange(src.size, dtype=np.int64) if src.ids is None else src.ids.copy()
    return chunk_order(
        src.bounds,
        chunk_size=src.chunk_size,
        window=0,
        seed=seed,
        epoch=pass_,
        ids=src.ids,
    )


def draws(
    src: MixSource, *, count: int, seed: int, source: int, epoch: int, shuffle: bool
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """The local ids source ``source`` contributes to ``epoch``, and where segments start.

    Args:
        src: The source.
        count: Its draws per epoch (``c_i``).
        seed: The mixture's seed.
        source: Its number (seeds its passes).
        epoch: The epoch: positions ``[epoch * count, (epoch + 1) * count)`` of its passes.
        shuffle: False: every pass in id order.

    Returns:
        ``(ids, starts)``: ``count`` local ids, and a mask that is True where a segment (a
        chunk of a pass, cut at pass and epoch ends) starts.

    Raises:
        ValueError: ``count > 0`` from a source without samples.
    """
    check_nonneg("count", count)
    check_nonneg("epoch", epoch)
    m = src.size
    if count == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_)
    if m == 0:
        raise ValueError(f"source {source} has no (selected) samples, but it must give {count}")
    first, stop = int(epoch) * count, (int(epoch) + 1) * count
    lo = src.chunk_lo()
    sseed = source_seed(seed, source)
    pieces, starts = [], []
    for p in range(first // m, (stop - 1) // m + 1):
        a, b = max(first - p * m, 0), min(stop - p * m, m)
        ids = _pass(src, sseed, p, shuffle)[a:b]
        chunk = np.searchsorted(lo, ids, side="right")
        start = np.ones(ids.size, dtype=np.bool_)
        start[1:] = chunk[1:] != chunk[:-1]
        pieces.append(ids)
        starts.append(start)
    return np.concatenate(pieces), np.concatenate(starts)


def draws_at(
    src: MixSource, positions: IntArray, *, seed: int, source: int, shuffle: bool
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """The local ids at ``positions`` (ascending) of source ``source``'s passes, as `draws`.

    Position ``p`` is sample ``p % m`` of pass ``p // m`` (``m`` the source's size); a segment
    starts where the chunk or the pass changes.

    Raises:
        ValueError: positions of a source without samples.
    """
    if positions.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_)
    m = src.size
    if m == 0:
        raise ValueError(f"source {source} has no (selected) samples, but it must give some")
    sseed = source_seed(seed, source)
    passes = positions // m
    ids = np.empty(positions.size, dtype=np.int64)
    for p in np.unique(passes).tolist():
        sel = passes == p
        ids[sel] = _pass(src, sseed, int(p), shuffle)[positions[sel] - int(p) * m]
    chunk = np.searchsorted(src.chunk_lo(), ids, side="right")
    start = np.ones(ids.size, dtype=np.bool_)
    start[1:] = (chunk[1:] != chunk[:-1]) | (passes[1:] != passes[:-1])
    return ids, start


def epoch_draws(
    sources: Sequence[MixSource], counts: IntArray, *, seed: int, epoch: int, shuffle: bool = True
) -> IntArray:
    """Every source's `draws` of ``epoch`` in global ids, grouped by source and by pass.

    Ids are ascending inside a pass, so an order that arranges the draws itself (the bucket
    sampler's chunks) reads neighbours together, and a sample drawn twice in one epoch (in two
    passes) sits in two places.

    Returns:
        ``sum(counts)`` global ids (int64).
    """
    out = [np.zeros(0, dtype=np.int64)]
    for i, (src, c) in enumerate(zip(sources, counts.tolist(), strict=True)):
        ids, _ = draws(src, count=int(c), seed=seed, source=i, epoch=epoch, shuffle=shuffle)
        if ids.size:
            pass_ = (int(epoch) * int(c) + np.arange(ids.size, dtype=np.int64)) // src.size
            ids = ids[np.lexsort((ids, pass_))]
        out.append(ids + src.offset)
    return np.concatenate(out)


def _block_shuffle(
    starts: npt.NDArray[np.bool_], window: int, rng: np.random.Generator
) -> IntArray:
    """A permutation that shuffles the positions inside each block of ``window`` segments."""
    n = starts.size
    if window <= 0 or n <= 1:
        return np.arange(n, dtype=np.int64)
    block = (np.cumsum(starts) - 1).astype(np.uint64) // np.uint64(window)
    key = block << np.uint64(32)
    key |= rng.integers(0, 2**32, size=n, dtype=np.uint64)
    return np.argsort(key, kind="stable").astype(np.int64)


# --------------------------------------------------------------------------- epoch orders


def _all_draws(
    sources: Sequence[MixSource], counts: IntArray, *, seed: int, epoch: int, shuffle: bool
) -> list[tuple[IntArray, npt.NDArray[np.bool_]]]:
    """``draws`` of every source, in global ids."""
    out = []
    for i, (src, c) in enumerate(zip(sources, counts.tolist(), strict=True)):
        ids, starts = draws(src, count=int(c), seed=seed, source=i, epoch=epoch, shuffle=shuffle)
        out.append((ids + src.offset, starts))
    return out


def epoch_order(
    sources: Sequence[MixSource],
    counts: IntArray,
    *,
    window: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> IntArray:
    """The global order of one epoch with mix="epoch", for all ranks together.

    Args:
        sources: The sources, in the order of their offsets.
        counts: Draws per source per epoch (`mix_counts`).
        window: Segments per shuffle block; 0 keeps each segment in its read order.
        seed: Non-negative seed.
        epoch: Non-negative epoch.
        shuffle: False: passes in id order, segments interleaved evenly, no block shuffle.

    Returns:
        ``sum(counts)`` global ids (int64).
    """
    check_nonneg("window", window)
    parts = _all_draws(sources, counts, seed=seed, epoch=epoch, shuffle=shuffle)
    rng = np.random.default_rng([int(seed), int(epoch), MIX_TAG])
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    perm = interleave_perm([p[1] for p in parts], window=window, rng=rng, shuffle=shuffle)
    order: IntArray = ids[perm]
    return order


def interleave_perm(
    starts: Sequence[npt.NDArray[np.bool_]], *, window: int, rng: np.random.Generator, shuffle: bool
) -> IntArray:
    """How ``epoch_order`` arranges the sources' draws, as a permutation of their concatenation.

    Args:
        starts: Per source, the segment starts of its draws (`draws`).
        window: Segments per shuffle block.
        rng: The epoch's mixing generator.
        shuffle: False: segments interleaved evenly, no block shuffle.
    """
    flags = np.concatenate(list(starts)) if starts else np.zeros(0, dtype=np.bool_)
    n = flags.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    seg_start = np.flatnonzero(flags)
    seg_len = np.diff(np.append(seg_start, n))
    keys = []
    for s in starts:
        k = int(np.count_nonzero(s))
        u = rng.random(k) if shuffle else np.full(k, 0.5)
        keys.append((np.arange(k) + u) / max(k, 1))
    perm = np.argsort(np.concatenate(keys), kind="stable")
    plen = seg_len[perm]
    out_start = np.cumsum(plen) - plen
    pos = np.repeat(seg_start[perm] - out_start, plen) + np.arange(n, dtype=np.int64)
    if shuffle:
        pos = pos[_block_shuffle(flags[pos], window, rng)]
    return pos.astype(np.int64, copy=False)


def batch_order(
    sources: Sequence[MixSource],
    composition: IntArray,
    *,
    num_batches: int,
    window: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> IntArray:
    """Return the global order of one epoch with mix="batch".

    It is ``num_batches`` batches, each holding ``composition[i]`` samples of source ``i``
    (see the module docstring).

    Returns:
        ``num_batches * sum(composition)`` global ids; batch ``k`` is positions
        ``[k * batch_size, (k + 1) * batch_size)``.
    """
    check_nonneg("num_batches", num_batches)
    check_nonneg("window", window)
    counts = composition * int(num_batches)
    parts = _all_draws(sources, counts, seed=seed, epoch=epoch, shuffle=shuffle)
    rng = np.random.default_rng([int(seed), int(epoch), MIX_TAG])
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    perm = batch_perm(
        [p[1] for p in parts],
        composition,
        num_batches=num_batches,
        window=window,
        rng=rng,
        shuffle=shuffle,
    )
    order: IntArray = ids[perm]
    return order


def batch_perm(
    starts: Sequence[npt.NDArray[np.bool_]],
    composition: IntArray,
    *,
    num_batches: int,
    window: int,
    rng: np.random.Generator,
    shuffle: bool,
) -> IntArray:
    """How ``batch_order`` arranges the sources' draws, as a permutation of their concatenation.

    Source ``i`` gives ``num_batches * composition[i]`` draws, whose segment starts are
    ``starts[i]``.
    """
    columns, first = [], 0
    for s, b in zip(starts, composition.tolist(), strict=True):
        idx = first + np.arange(s.size, dtype=np.int64)
        first += s.size
        if shuffle:
            idx = idx[_block_shuffle(s, window, rng)]
        columns.append(idx.reshape(int(num_batches), int(b)))
    table = np.hstack(columns) if columns else np.zeros((num_batches, 0), dtype=np.int64)
    if shuffle and table.size:
        table = np.take_along_axis(table, np.argsort(rng.random(table.shape), axis=1), axis=1)
    return np.ascontiguousarray(table).ravel()


def rank_share(
    order: IntArray, *, rank: int, world_size: int, drop_last: bool, batch_size: int | None = None
) -> IntArray:
    """This rank's contiguous slice of a global order; by whole batches with ``batch_size``.

    Without ``batch_size`` this is ``readers.order.split_for_rank``. With it, the order is
    ``len // batch_size`` batches; each rank takes ``ceil(B / world_size)`` consecutive batches
    (cyclically repeated from the first batch to pad) or, with ``drop_last``,
    ``B // world_size``.
    """
    unit = 1 if batch_size is None else int(batch_size)
    check_nonneg("batch_size", unit, 1)
    units = order.size // unit
    start, stop = rank_span(units, rank=rank, world_size=world_size, drop_last=drop_last)
    if stop <= units or units == 0:
        share: IntArray = order[start * unit : stop * unit].copy()
        return share
    pos = (np.arange(start, stop, dtype=np.int64) % units)[:, None] * unit
    padded: IntArray = order[(pos + np.arange(unit, dtype=np.int64)).ravel()]
    return padded
