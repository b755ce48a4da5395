"""New mixture weights at a checkpoint: the rest of a saved epoch drawn with other weights.

Pure functions of the mixture, the epoch and the state's ``history``; no paddle, no I/O. Used by
``ChunkShuffleSampler.load_state_dict(state, weights=[...])`` (and the batch sampler over it).

**What changes.** An epoch of a mixture is a global order of ``N`` draws (``epoch_samples``;
with ``mix="batch"`` its whole batches), split over ranks as :mod:`readers.elastic` splits any
order. Loading a state with new weights ``w'`` ends the saved stretch there:

1. The *consumed* units are those the saved run (and any earlier stretch of the epoch) had
   consumed on any rank; they keep their samples and their per-source counts.
2. The *rest* is every other unit of the epoch's ``N``: ``R = N - consumed`` units. This
   includes the units a ``drop_last`` split had left out, so the epoch keeps its ``N``.
3. The rest is drawn anew with ``w'``: source ``i`` gives exactly
   ``readers.mixing.mix_counts(R, w')[i]`` draws (largest remainder over the remaining draws);
   with ``mix="batch"`` each of the ``R`` remaining batches holds ``mix_counts(batch_size, w')``.
4. A source's draws are positions of its endless sequence of passes (``readers.mixing``): the
   epoch started at position ``s_i = epoch * c_i`` (``c_i`` its count under the epoch's first
   weights). The new draws are the first positions from ``s_i`` on, skipping for each
   consumed sample its first occurrence there (as often as it was consumed). So a consumed
   sample is not drawn again in the epoch unless the source runs out of samples (a new
   pass), exactly as within an epoch without a change.
5. The new draws are chunked and mixed as an epoch is (``interleave_perm`` or ``batch_perm``,
   window and shuffle as the sampler's), with the generator
   ``default_rng([seed, epoch, MIX_TAG, REWEIGHT_TAG, k])`` for the ``k``-th change in the
   epoch, and fill the rest's places of the global order in order. The rest is then split over
   the ranks now running as an elastic resume splits it (also at the saved world size: every
   rank's share of the rest starts at position 0).

The state saved afterwards records ``weights = w'`` and, in its ``history``, the closed
stretch with the weights it ran with (``readers.elastic.Segment.weights``); that is everything
the epoch's order follows from, so it resumes (elastically, or with yet other weights) and is
version 4 (``readers.resume``). Later epochs are those of the mixture with ``w'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.elastic import ConsumedInShare, Segment, unconsumed_positions
from readers.mixing import (
    MIX_TAG,
    batch_perm,
    draws_at,
    epoch_draws,
    interleave_perm,
    mix_counts,
)
from readers.mixture import Mixture
from readers.order import IntArray

__all__ = [
    "REWEIGHT_TAG",
    "changed_mixtures",
    "new_draws",
    "reweighted_batches",
    "reweighted_order",
    "with_weights",
]

Batches = tuple[IntArray, IntArray, IntArray]
"""A bucket sampler's epoch: ``(flat, bounds, batch_bucket)`` (``readers.bucket_order``)."""

REWEIGHT_TAG = 0x5257  # "RW": the generator of the draws after a change of weights


def with_weights(mix: Mixture, weights: Sequence[float]) -> Mixture:
    """The same mixture with other weights (checked as the constructor checks them)."""
    return dataclasses.replace(mix, weights=tuple(weights))


def changed_mixtures(
    mix: Mixture | None, state: dict[str, Any], weights: Sequence[float] | None
) -> tuple[Mixture | None, Mixture | None]:
    """``(new, saved)`` mixtures for ``load_state_dict(state, weights=weights)``.

    ``new`` is ``mix`` with ``weights`` (``mix`` itself without them); ``saved`` is the
    mixture with the state's weights, or None when they equal the new ones (or without
    ``weights``, or when the state records none: the usual checks then say what is wrong).

    Raises:
        ValueError: the sampler mixes no sources, or ``weights`` are bad for its mixture.
    """
    if weights is None:
        return mix, None
    if mix is None:
        raise ValueError(
            "load_state_dict(weights=...) changes the weights of a mixture, but this sampler "
            "mixes no sources; build it over a readers.ConcatDataset with weights=[...]"
        )
    new = with_weights(mix, weights)
    saved = state.get("weights")
    if not isinstance(saved, list):
        return new, None
    try:
        old = with_weights(mix, saved)
    except (ValueError, TypeError):
        return new, None  # of other sources: the checks of the state report it
    return new, (None if old.weights == new.weights else old)


def _perm(
    mix: Mixture,
    starts: list[Any],
    counts: IntArray,
    *,
    window: int,
    rng: np.random.Generator,
    shuffle: bool,
) -> IntArray:
    if mix.mix == "batch":
        comp = mix.composition
        nb = int(counts.sum()) // max(int(comp.sum()), 1)
        return batch_perm(starts, comp, num_batches=nb, window=window, rng=rng, shuffle=shuffle)
    return interleave_perm(starts, window=window, rng=rng, shuffle=shuffle)


def reweighted_order(
    mix: Mixture,
    history: Sequence[Segment],
    *,
    epoch: int,
    window: int,
    seed: int,
    shuffle: bool,
    drop_last: bool,
    unit: int = 1,
    consumed_of: Callable[[Segment], int | ConsumedInShare] | None = None,
) -> IntArray:
    """The global order of ``epoch`` after the changes of weights its ``history`` records.

    Args:
        mix: The mixture now (its weights are those of the current stretch).
        history: The epoch's closed stretches, oldest first; those with ``weights`` end in a
            change of weights.
        epoch: The epoch.
        window: Segments per shuffle block.
        seed: The sampler's seed.
        shuffle: The sampler's ``shuffle``.
        drop_last: The sampler's ``drop_last`` (how each stretch split the order).
        unit: Samples per unit of the split (the batch size with ``mix="batch"``).
        consumed_of: What a stretch consumed; default its ``position // unit`` of every share.

    Returns:
        ``mix.order(epoch)`` when nothing changed; else that epoch's order with the places of
        the rest refilled at each change (module docstring).
    """
    marks = [seg.weights for seg in history if seg.weights is not None]
    if not marks:
        return mix.order(epoch, window=window, seed=seed, shuffle=shuffle)
    stretches = [*marks, mix.weights]
    base = with_weights(mix, marks[0])
    order = base.order(epoch, window=window, seed=seed, shuffle=shuffle)
    first = base.counts * int(epoch)
    rest = np.arange(order.size // unit, dtype=np.int64)
    k = 0
    for seg in history:
        consumed = seg.position // unit if consumed_of is None else consumed_of(seg)
        rest = rest[
            unconsumed_positions(
                rest.size,
                world_size=seg.world_size,
                drop_last=drop_last,
                consumed=consumed,
                keep_unplanned=seg.weights is not None,
            )
        ]
        if seg.weights is not None:
            k += 1
            new = with_weights(mix, stretches[k])
            places = rest if unit == 1 else (rest[:, None] * unit + np.arange(unit)).ravel()
            taken = np.ones(order.size, dtype=np.bool_)
            taken[places] = False
            if new.mix == "batch":
                counts = new.composition * rest.size
            else:
                counts = mix_counts(int(rest.size), new.weights)
            parts = new_draws(new, order[taken], counts, first=first, seed=seed, shuffle=shuffle)
            rng = np.random.default_rng([int(seed), int(epoch), MIX_TAG, REWEIGHT_TAG, k])
            perm = _perm(
                new, [p[1] for p in parts], counts, window=window, rng=rng, shuffle=shuffle
            )
            order = order.copy()
            order[places] = np.concatenate([p[0] for p in parts])[perm]
    return order


def new_draws(
    new: Mixture,
    consumed: IntArray,
    counts: IntArray,
    *,
    first: IntArray,
    seed: int,
    shuffle: bool,
) -> list[tuple[IntArray, npt.NDArray[np.bool_], IntArray]]:
    """Every source's draws of the rest of an epoch: ``(global ids, segment starts, passes)``.

    Source ``i`` gives ``counts[i]`` draws: the first positions of its passes from
    ``first[i]`` on, skipping, for every consumed sample of it, its first occurrence(s) there
    (as many as ``consumed`` holds it): the module docstring's step 4.
    """
    offsets = np.array([s.offset for s in new.sources], dtype=np.int64)
    of = np.searchsorted(offsets, consumed, side="right") - 1
    out = []
    for i, s in enumerate(new.sources):
        c = int(counts[i])
        mine = np.sort(consumed[of == i] - s.offset)
        cand = int(first[i]) + np.arange(c + mine.size, dtype=np.int64)
        local, _ = draws_at(s, cand, seed=seed, source=i, shuffle=shuffle)
        skip = _occurrence(local) < _count_in(mine, local)
        chosen = cand[~skip][:c]
        ids, starts = draws_at(s, chosen, seed=seed, source=i, shuffle=shuffle)
        out.append((ids + s.offset, starts, chosen // max(s.size, 1)))
    return out


def _occurrence(values: IntArray) -> IntArray:
    """For each entry, how many equal entries come before it."""
    order = np.argsort(values, kind="stable")
    sv = values[order]
    first = np.searchsorted(sv, sv, side="left")
    occ = np.empty(values.size, dtype=np.int64)
    occ[order] = np.arange(values.size, dtype=np.int64) - first
    return occ


def _count_in(sorted_values: IntArray, values: IntArray) -> IntArray:
    """How often each of ``values`` occurs in ``sorted_values``."""
    hi = np.searchsorted(sorted_values, values, side="right")
    lo = np.searchsorted(sorted_values, values, side="left")
    return (hi - lo).astype(np.int64)


def reweighted_batches(
    mix: Mixture,
    history: Sequence[Segment],
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    drop_last: bool,
    batches: Callable[[IntArray, int], Batches],
) -> tuple[Batches, IntArray | None]:
    """A bucket sampler's batches of ``epoch`` after its ``history``, and the rest's positions.

    At a change of weights the consumed batches stay, in their order, and the rest of the
    epoch's draws (``N`` minus the samples of the consumed batches) is drawn with the next
    weights (`new_draws`) and bucketed anew (``batches(members, seed)`` with a seed of its own)
    into batches that follow them: the rest is then those batches.

    Args:
        mix: The mixture now (its weights are those after the last change).
        history: The epoch's closed stretches, oldest first.
        epoch: The epoch.
        seed: The sampler's seed.
        shuffle: The sampler's ``shuffle``.
        drop_last: The sampler's ``drop_last``.
        batches: Buckets members (global ids grouped by source and pass, ascending inside a
            pass, as ``readers.mixing.epoch_draws``) into batches, from a seed.

    Returns:
        The batches, and the positions of the rest (None without a history).
    """
    marks = [seg.weights for seg in history if seg.weights is not None]
    stretches = [*marks, mix.weights]
    base = with_weights(mix, stretches[0])
    members = epoch_draws(base.sources, base.counts, seed=seed, epoch=epoch, shuffle=shuffle)
    flat, bounds, bucket = batches(members, seed)
    if not history:
        return (flat, bounds, bucket), None
    first = base.counts * int(epoch)
    rest = np.arange(bucket.size, dtype=np.int64)
    k = 0
    for seg in history:
        rest = rest[
            unconsumed_positions(
                rest.size,
                world_size=seg.world_size,
                drop_last=drop_last,
                consumed=seg.position,
                keep_unplanned=seg.weights is not None,
            )
        ]
        if seg.weights is None:
            continue
        k += 1
        new = with_weights(mix, stretches[k])
        kept = np.ones(bucket.size, dtype=np.bool_)
        kept[rest] = False
        keep = np.flatnonzero(kept)
        sizes = np.diff(bounds)[keep]
        pos = np.repeat(bounds[keep] - (np.cumsum(sizes) - sizes), sizes)
        consumed = flat[pos + np.arange(int(sizes.sum()), dtype=np.int64)]
        counts = mix_counts(new.num_ordered - consumed.size, new.weights)
        parts = new_draws(new, consumed, counts, first=first, seed=seed, shuffle=shuffle)
        grouped = [ids[np.lexsort((ids, passes))] for ids, _, passes in parts]
        key = np.random.SeedSequence([int(seed), int(epoch), MIX_TAG, REWEIGHT_TAG, k])
        f2, b2, k2 = batches(np.concatenate(grouped), int(key.generate_state(1)[0]))
        flat = np.concatenate([consumed, f2])
        bounds = np.concatenate([[0], np.cumsum(sizes), consumed.size + b2[1:]]).astype(np.int64)
        bucket = np.concatenate([bucket[keep], k2])
        rest = keep.size + np.arange(k2.size, dtype=np.int64)
    return (flat, bounds, bucket), rest
