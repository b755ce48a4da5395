"""The resume state of ``ShardStream``: per-worker accounting of the batches a DataLoader yielded.

It resumes at the saved world size (exact continuation) or another (elastic resume).

The format is a version 2 state of :mod:`readers.resume` with ``"kind": "ShardStream"``:
``consumed_batches``, ``consumed_samples``, ``batch_size``, ``num_workers``,
``drop_last_batch`` in place of ``position``, and ``history`` entries with the same keys.
Version 3 is a version 2 state whose history records a change of mixture weights (an entry
with ``weights``, :mod:`readers.reweight`); it is written only then, so older code refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.elastic import (
    ConsumedInShare,
    Segment,
    rank_length,
    rest_positions,
    stream_consumed,
)
from readers.order import IntArray, check_nonneg, loader_batches, worker_counts
from readers.resume import (
    ADDED_IN_2,
    STREAM_READABLE,
    check_complete,
    check_saved_params,
    check_version,
    rest_after,
    saved_history,
)

__all__ = [
    "REWEIGHTED_STREAM_VERSION",
    "STREAM_STATE_VERSION",
    "StreamRestart",
    "StreamResume",
    "loader_shape",
    "read_stream_state",
    "stream_state",
]

STREAM_STATE_VERSION = 2
REWEIGHTED_STREAM_VERSION = 3


@dataclass(frozen=True)
class StreamResume:
    """Where the saved epoch continues: samples each worker skips, and the worker rotation."""

    epoch: int
    num_workers: int  # as the loader had them (0: in-process)
    skip: tuple[int, ...]  # per worker of the saved run
    rotation: int  # DataLoader worker j plays saved worker (j + rotation) % V
    consumed_batches: int = 0  # batches of the epoch the saved run had consumed

    def worker(self, worker: int, num_workers: int) -> tuple[int, int]:
        """``(saved worker, samples it skips)`` that DataLoader worker ``worker`` plays."""
        if max(self.num_workers, 1) != max(num_workers, 1):
            raise ValueError(
                f"cannot resume: the state was saved for num_workers={self.num_workers}, "
                f"but this pass runs with num_workers={num_workers}; each worker's order "
                "depends on the number of workers, so resume with the saved num_workers "
                "and batch_size"
            )
        logical = (worker + self.rotation) % max(num_workers, 1)
        return logical, self.skip[logical]


@dataclass(frozen=True)
class StreamRestart:
    """A loaded stream state: the epoch, the same-size resume point, and the earlier stretches.

    The resume point is None after a change of world size: the rest starts at its beginning.
    """

    epoch: int
    resume: StreamResume | None
    history: tuple[Segment, ...]
    rest: IntArray | None


def loader_shape(loader: Any) -> tuple[int, int, bool]:
    """(batch_size, num_workers, drop_last) of a DataLoader; no batching counts as 1."""
    try:
        batch_size, num_workers, drop = loader.batch_size, loader.num_workers, loader.drop_last
    except AttributeError as exc:
        raise ValueError(
            f"loader must have batch_size, num_workers and drop_last, like "
            f"paddle.io.DataLoader; got {type(loader).__name__} ({exc})"
        ) from exc
    batch_size = 1 if batch_size is None else int(batch_size)
    check_nonneg("batch_size", batch_size, 1)
    check_nonneg("num_workers", int(num_workers))
    return batch_size, int(num_workers), bool(drop) and batch_size > 1


def _batches_consumed(
    size: IntArray, consumed_samples: int | None, consumed_batches: int | None, num_workers: int
) -> int:
    """The number of whole batches that the given progress is, or ValueError."""
    ends = np.cumsum(size)
    if consumed_batches is not None:
        check_nonneg("consumed_batches", consumed_batches)
        if consumed_batches > size.size:
            raise ValueError(
                f"consumed_batches={consumed_batches} exceeds the {size.size} batches this "
                f"loader yields per epoch on a rank"
            )
        return int(consumed_batches)
    assert consumed_samples is not None
    check_nonneg("consumed_samples", consumed_samples)
    if consumed_samples == 0:
        return 0
    k = int(np.searchsorted(ends, consumed_samples, side="left")) + 1
    if k > size.size or ends[k - 1] != consumed_samples:
        total = int(ends[-1]) if ends.size else 0
        if consumed_samples > total:
            raise ValueError(
                f"consumed_samples={consumed_samples} exceeds the {total} samples this "
                "loader yields per epoch on a rank"
            )
        before = int(ends[k - 2]) if k >= 2 else 0
        raise ValueError(
            f"consumed_samples={consumed_samples} falls inside batch {k - 1} (samples "
            f"{before}..{int(ends[k - 1])}); with {num_workers} workers batches are "
            "formed per worker, so give a batch boundary or consumed_batches"
        )
    return k


def stream_state(
    *,
    length: int,
    epoch: int,
    world_size: int,
    history: Sequence[Segment],
    params: dict[str, Any],
    consumed_samples: int | None,
    consumed_batches: int | None,
    loader: Any,
) -> dict[str, Any]:
    """The state of a stream of ``length`` samples per rank; see ``ShardStream.state_dict``."""
    if (consumed_samples is None) == (consumed_batches is None):
        raise ValueError("give consumed_samples or consumed_batches (exactly one)")
    if loader is None:
        if consumed_batches is not None:
            raise ValueError(
                "consumed_batches needs loader= (its batch_size, num_workers, drop_last)"
            )
        batch_size, num_workers, drop = 1, 0, False
    else:
        batch_size, num_workers, drop = loader_shape(loader)
    counts = worker_counts(length, num_workers)
    _, _, size = loader_batches(counts, batch_size=batch_size, drop_last=drop)
    k = _batches_consumed(size, consumed_samples, consumed_batches, num_workers)
    changed = any(seg.weights is not None for seg in history)
    state = {
        "version": REWEIGHTED_STREAM_VERSION if changed else STREAM_STATE_VERSION,
        "kind": "ShardStream",
        "epoch": epoch,
        "world_size": int(world_size),
        "consumed_batches": k,
        "consumed_samples": int(size[:k].sum()),
        "batch_size": batch_size,
        "num_workers": num_workers,
        "drop_last_batch": drop,
        "history": [seg.as_state() for seg in history],
    }
    return state | params


def read_stream_state(
    state: dict[str, Any],
    params: dict[str, Any],
    *,
    world_size: int,
    num_units: int,
    drop_last: bool,
    seed: int,
    buffer: int,
    reweight_from: tuple[float, ...] | None = None,
) -> StreamRestart:
    """The resume point of a saved stream state, checked against the stream's parameters.

    Args:
        state: As saved by `stream_state` (or a version 1 state).
        params: The stream's parameters (all but the world size), compared with the state's.
        world_size: Ranks now; another than the saved one is an elastic resume.
        num_units: Samples in the epoch's global order.
        drop_last: The stream's ``drop_last``.
        seed: The stream's seed (what its workers' buffers draw from).
        buffer: The stream's ``shuffle_buffer``.
        reweight_from: The state's mixture weights when the stream continues with others
            (`params` then holds the saved weights): the saved stretch is closed as a history
            entry carrying them, and the rest (every unconsumed sample) is split afresh.

    Raises:
        ValueError: the state is incomplete, of another kind or version, of another dataset,
            or was saved with other order parameters.
    """
    keys = ("epoch", "consumed_batches", "batch_size", "num_workers", "drop_last_batch")
    check_complete(state, {"version", "kind", "world_size", *keys}, what="stream")
    version = check_version(state, kind="ShardStream", what="stream", readable=STREAM_READABLE)
    required = set(params) - (ADDED_IN_2 if version == 1 else set())
    check_complete(state, required, what="stream")
    check_saved_params(
        state,
        {k: v for k, v in params.items() if k in required},
        what="stream",
        advice="build the stream with the saved parameters over the same dataset",
    )
    epoch, k = state["epoch"], state["consumed_batches"]
    batch_size, num_workers, saved_size = (
        state["batch_size"],
        state["num_workers"],
        state["world_size"],
    )
    for name, value, minimum in (
        ("epoch", epoch, 0),
        ("consumed_batches", k, 0),
        ("batch_size", batch_size, 1),
        ("num_workers", num_workers, 0),
        ("world_size", saved_size, 1),
    ):
        check_nonneg(name, value, minimum)
    history = saved_history(state, stream=True)

    def consumed_of(seg: Segment) -> ConsumedInShare:
        return stream_consumed(seg, seed=seed, epoch=int(epoch), buffer=buffer)

    rest = rest_positions(num_units, history, drop_last=drop_last, consumed_of=consumed_of)
    left = num_units if rest is None else rest.size
    length = rank_length(left, int(saved_size), drop_last)
    counts = worker_counts(length, num_workers)
    drop = bool(state["drop_last_batch"])
    worker, _, size = loader_batches(counts, batch_size=batch_size, drop_last=drop)
    if k > size.size:
        raise ValueError(f"saved consumed_batches={k} exceeds the {size.size} batches")
    if reweight_from is not None:
        loader = (int(batch_size), int(num_workers), drop)
        seg = Segment(int(saved_size), int(k), loader, weights=reweight_from)
        rest = rest_after(seg, rest, left, drop_last=drop_last, consumed=consumed_of(seg))
        return StreamRestart(int(epoch), None, (*history, seg), rest)
    if saved_size == world_size:
        skip = np.bincount(worker[:k], weights=size[:k], minlength=counts.size)
        resume = StreamResume(
            epoch=int(epoch),
            num_workers=int(num_workers),
            skip=tuple(int(s) for s in skip),
            rotation=int(worker[k]) if k < worker.size else 0,
            consumed_batches=int(k),
        )
        return StreamRestart(int(epoch), resume, history, rest)
    if k == 0:
        return StreamRestart(int(epoch), None, history, rest)
    seg = Segment(int(saved_size), int(k), (int(batch_size), int(num_workers), drop))
    rest = rest_after(seg, rest, left, drop_last=drop_last, consumed=consumed_of(seg))
    return StreamRestart(int(epoch), None, (*history, seg), rest)
