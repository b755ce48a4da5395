"""The rest of an epoch resumed at another world size (elastic resume).

Pure functions of the epoch's length, the world sizes and what each run consumed; no paddle, no
I/O.

**Elastic resume, for any sampler whose epoch is one global order split over ranks.** An epoch
is a global order of ``n`` *units* (samples for the chunked samplers and ``ShardStream``;
batches for the bucket sampler, and whole mixed batches for ``mix="batch"``, so that the
consumed part and the rest are whole batches that each hold the per-source counts), and
rank ``r`` of ``N`` takes the contiguous slice
``readers.order.split_for_rank`` gives it (padded by repeating the order from its start, or
with the last ``n % N`` units dropped, as ``drop_last`` says). A run that stops after each
rank consumed the first ``k`` units of its share (or, for ``ShardStream``, the samples its
DataLoader workers emitted for the first ``k`` batches) has consumed a set of positions that
follows from ``(n, N, k, drop_last)`` alone: `unconsumed_positions`. Resuming with ``M`` ranks:

1. The rest of the epoch is the positions of the saved run's plan (all ``n``, or the first
   ``(n // N) * N`` with ``drop_last``) that no rank consumed, in their order, each once: a
   padding copy consumed on one rank counts its original as consumed.
2. That rest is split over the ``M`` ranks exactly as a fresh epoch is: contiguous slices of
   equal length, padded by repeating the rest from its start (``drop_last=False``: every
   unconsumed unit is yielded, fewer than ``M`` of them twice) or with the last
   ``len(rest) % M`` units dropped (``drop_last=True``: none twice, fewer than ``M`` skipped).
3. A state saved during the resumed run records the earlier stretches as ``history``, so a
   second resume (at any size) applies them in turn: `rest_positions`.

A state loaded at the world size that saved it continues every rank's own share where it
stopped, exactly as the uninterrupted run (padding included); a state saved at position 0
(nothing consumed) loads at any size as a fresh epoch at that size.

The states that record all this, and the checks on load, are in :mod:`readers.resume`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.order import (
    IntArray,
    check_nonneg,
    loader_batches,
    rank_span,
    split_for_rank,
    worker_buffer_order,
    worker_counts,
)

__all__ = [
    "ConsumedInShare",
    "Segment",
    "rank_length",
    "rest_positions",
    "resume_share",
    "stream_consumed",
    "unconsumed_positions",
]


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch run at one world size, up to where it was saved.

    ``position`` is units of every rank's share consumed (samplers), or loader batches for a
    ``ShardStream``, whose ``loader`` is then ``(batch_size, num_workers, drop_last_batch)``.
    ``weights`` (a mixture's, :mod:`readers.reweight`) marks a change of weights after this
    stretch: the stretch ran with them, and the epoch's unconsumed units (those a
    ``drop_last`` split left unplanned included) were drawn anew with the next weights.
    """

    world_size: int
    position: int
    loader: tuple[int, int, bool] | None = None
    weights: tuple[float, ...] | None = None

    def as_state(self) -> dict[str, Any]:
        """The segment as a JSON object of a state's ``history``."""
        out: dict[str, Any]
        if self.loader is None:
            out = {"world_size": self.world_size, "position": self.position}
        else:
            batch_size, num_workers, drop = self.loader
            out = {
                "world_size": self.world_size,
                "consumed_batches": self.position,
                "batch_size": batch_size,
                "num_workers": num_workers,
                "drop_last_batch": drop,
            }
        return out if self.weights is None else out | {"weights": list(self.weights)}

    @classmethod
    def from_state(cls, raw: Any, *, stream: bool) -> Segment:
        """Parse one entry of a saved ``history`` (ValueError when malformed)."""
        keys = (
            ("world_size", "consumed_batches", "batch_size", "num_workers", "drop_last_batch")
            if stream
            else ("world_size", "position")
        )
        if not isinstance(raw, dict) or set(keys) - raw.keys():
            raise ValueError(f"a history entry of the state must hold {list(keys)}, got {raw!r}")
        check_nonneg("history world_size", raw["world_size"], 1)
        weights = _saved_weights(raw.get("weights"))
        if not stream:
            check_nonneg("history position", raw["position"])
            return cls(int(raw["world_size"]), int(raw["position"]), None, weights)
        check_nonneg("history consumed_batches", raw["consumed_batches"])
        check_nonneg("history batch_size", raw["batch_size"], 1)
        check_nonneg("history num_workers", raw["num_workers"])
        loader = (int(raw["batch_size"]), int(raw["num_workers"]), bool(raw["drop_last_batch"]))
        return cls(int(raw["world_size"]), int(raw["consumed_batches"]), loader, weights)


def _saved_weights(raw: Any) -> tuple[float, ...] | None:
    """The ``weights`` of a history entry (None when absent), checked to be positive numbers."""
    if raw is None:
        return None
    ok = isinstance(raw, list) and bool(raw)
    for w in raw if ok else ():
        ok = ok and isinstance(w, int | float) and not isinstance(w, bool) and w > 0
    if not ok:
        raise ValueError(f"a history entry's weights must be a list of numbers > 0, got {raw!r}")
    return tuple(float(w) for w in raw)


ConsumedInShare = Callable[[int, int], IntArray]
"""``consumed(rank, share_length)``: the positions in that rank's share it consumed."""


def unconsumed_positions(
    n: int,
    *,
    world_size: int,
    drop_last: bool,
    consumed: int | ConsumedInShare,
    keep_unplanned: bool = False,
) -> IntArray:
    """Positions of an order of ``n`` units that a run over ``world_size`` ranks left to yield.

    Args:
        n: Units in the order the run split (``split_for_rank``).
        world_size: Ranks of the run.
        drop_last: As the run split it: the last ``n % world_size`` units were not planned.
        consumed: ``k``: every rank consumed the first ``k`` units of its share; or a function
            of ``(rank, share_length)`` giving the positions in the share that rank consumed.
        keep_unplanned: Keep the units a ``drop_last`` split left out as well (a change of
            mixture weights draws every unconsumed unit anew).

    Returns:
        The planned positions in ``[0, n)`` (all with ``keep_unplanned``) whose unit no rank
        consumed (directly or as a padding copy), ascending, each once.
    """
    check_nonneg("n", n)
    start, stop = rank_span(n, rank=0, world_size=world_size, drop_last=drop_last)
    per = stop - start
    keep = np.zeros(n, dtype=np.bool_)
    keep[: n if keep_unplanned else min(per * world_size, n)] = True
    if n == 0 or per == 0:
        return np.flatnonzero(keep).astype(np.int64)
    if isinstance(consumed, int | np.integer):
        check_nonneg("consumed", int(consumed))
        if consumed > per:
            raise ValueError(f"position {consumed} exceeds the {per} units of a rank's share")
        pos = np.arange(world_size, dtype=np.int64)[:, None] * per + np.arange(int(consumed))
        keep[pos.ravel() % n] = False
    else:
        for rank in range(world_size):
            within = np.asarray(consumed(rank, per), dtype=np.int64)
            if within.size and (within.min() < 0 or within.max() >= per):
                raise ValueError(f"consumed positions of rank {rank} lie outside its {per} units")
            keep[(rank * per + within) % n] = False
    return np.flatnonzero(keep).astype(np.int64)


def rest_positions(
    n: int,
    history: Sequence[Segment],
    *,
    drop_last: bool,
    consumed_of: Callable[[Segment], int | ConsumedInShare] | None = None,
) -> IntArray | None:
    """Positions of an epoch's global order of ``n`` units still to yield after ``history``.

    Each segment's run split what the previous ones left (`unconsumed_positions`).

    Args:
        n: Units in the epoch's global order.
        history: The epoch's earlier stretches at other world sizes, oldest first.
        drop_last: The sampler's ``drop_last``.
        consumed_of: What a segment consumed; default its ``position`` (a prefix of every
            rank's share).

    Returns:
        Ascending positions into the global order, or None when ``history`` is empty (the
        whole order).
    """
    if not history:
        return None
    pos = np.arange(n, dtype=np.int64)
    for seg in history:
        consumed = seg.position if consumed_of is None else consumed_of(seg)
        pos = pos[
            unconsumed_positions(
                pos.size,
                world_size=seg.world_size,
                drop_last=drop_last,
                consumed=consumed,
                keep_unplanned=seg.weights is not None,
            )
        ]
    return pos


def resume_share(
    order: IntArray, *, rest: IntArray | None, rank: int, world_size: int, drop_last: bool
) -> IntArray:
    """This rank's share of an epoch: ``split_for_rank(order[rest])`` as its own array.

    Args:
        order: The epoch's global order of units (for all ranks, before any split).
        rest: `rest_positions` of the epoch (None: no earlier world size, all of ``order``).
        rank: This rank.
        world_size: Ranks now.
        drop_last: The sampler's ``drop_last``.
    """
    seq = order if rest is None else order[rest]
    share = split_for_rank(seq, rank=rank, world_size=world_size, drop_last=drop_last)
    return share.copy() if share.size < seq.size else share


def rank_length(n: int, world_size: int, drop_last: bool) -> int:
    """Units each rank's share of an order of ``n`` holds (``readers.order.rank_span``)."""
    start, stop = rank_span(n, rank=0, world_size=world_size, drop_last=drop_last)
    return stop - start


def stream_consumed(seg: Segment, *, seed: int, epoch: int, buffer: int) -> ConsumedInShare:
    """What each rank of a ``ShardStream`` segment consumed: its workers' first emitted samples.

    Worker ``w`` of a rank reads its span (``worker_counts``) and emits it in
    ``worker_buffer_order``; the first ``seg.position`` loader batches (``loader_batches``)
    hold the first samples each worker emitted.
    """
    assert seg.loader is not None
    batch_size, num_workers, drop = seg.loader

    def consumed(rank: int, share_length: int) -> IntArray:
        counts = worker_counts(share_length, num_workers)
        worker, _, size = loader_batches(counts, batch_size=batch_size, drop_last=drop)
        if seg.position > size.size:
            raise ValueError(
                f"consumed_batches={seg.position} exceeds the {size.size} batches of a rank"
            )
        k = seg.position
        skip = np.bincount(worker[:k], weights=size[:k], minlength=counts.size).astype(np.int64)
        starts = np.cumsum(counts) - counts
        parts = [
            starts[w]
            + worker_buffer_order(
                int(counts[w]), buffer=buffer, seed=seed, epoch=epoch, rank=rank, worker=w
            )[: skip[w]]
            for w in range(counts.size)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    return consumed
