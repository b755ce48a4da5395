"""Mid-epoch resume states of the samplers and of ``ShardStream``: what is saved, the checks on
load, and the rest of an epoch resumed at another world size (elastic resume).

A state records where training got in an epoch plus every parameter the order depends on; a
state saved with other parameters, or over another dataset, is refused with a message naming
what differs, since resuming it would repeat some samples and skip others.

Elastic resume (a state saved with ``N`` ranks loaded with ``M``) applies the pure functions
of :mod:`readers.elastic`; the generic entry points for every sampler built on one global
order are re-exported here: `rest_positions`, `resume_share`, and the versioned state,
`sampler_state` and `read_sampler_state`. A sampler calls ``read_sampler_state`` in
``load_state_dict``, keeps the returned ``history`` and ``rest``, and takes
``resume_share(global_order, rest=rest, ...)`` as its rank's share of that epoch. Positions in
a state count units of this rank's share *since the last change of world size* (from the
epoch's start when the size never changed); after an elastic load they start again at 0.

**Sampler state, version 2** (plain JSON; version 1, written before elastic resume, still
loads: it is a version 2 state without ``kind``, ``history`` and ``records_crc32``)::

    {"version": 2, "kind": "ChunkShuffleSampler", "epoch": 3,
     "world_size": 8,          # ranks of the run that saved it
     "position": 1536,         # units of every rank's share consumed (samples; bucket: batches)
     "history": [{"world_size": 2, "position": 40}],   # earlier stretches, oldest first
     "seed": 0, "chunk_size": 64, "shuffle": true, "drop_last": false, "window": 8,
     "num_selected": 100000, "selection_crc32": 123, "records_crc32": 456, ...}

``ShardStream`` states (version 2, ``"kind": "ShardStream"``) record ``consumed_batches`` with
the loader's ``batch_size``, ``num_workers`` and ``drop_last_batch`` instead of ``position``;
their ``history`` entries carry the same five keys.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.elastic import (
    ConsumedInShare,
    Segment,
    rank_length,
    rest_positions,
    resume_share,
    stream_consumed,
    unconsumed_positions,
)
from readers.order import IntArray, check_nonneg, loader_batches, worker_counts

__all__ = [
    "SAMPLER_STATE_VERSION",
    "STREAM_STATE_VERSION",
    "ConsumedInShare",
    "SamplerResume",
    "Segment",
    "StreamRestart",
    "StreamResume",
    "check_complete",
    "check_saved_params",
    "fingerprint",
    "loader_shape",
    "read_sampler_state",
    "read_stream_state",
    "rest_positions",
    "resume_share",
    "sampler_state",
    "stream_consumed",
    "stream_state",
    "unconsumed_positions",
]

SAMPLER_STATE_VERSION = 2
STREAM_STATE_VERSION = 2
_READABLE = (1, 2)
_ADDED_IN_2 = {"records_crc32"}  # parameters a version 1 state does not record

# Parameters that describe the dataset rather than the order: a mismatch in one of them means
# the state belongs to another dataset (or another selection of this one).
_DATASET_PARAMS = {
    "records_crc32": "the stored records differ",
    "num_samples": "another number of samples",
    "num_selected": "another number of selected samples",
    "shards_crc32": "another shard layout",
    "selection_crc32": "another shard layout or selection of samples",
    "buckets_crc32": "other bucket members (key values or boundaries)",
}


def fingerprint(*arrays: IntArray | None) -> int:
    """CRC-32 of int64 arrays (None skipped): tells layouts and selections apart."""
    crc = 0
    for arr in arrays:
        if arr is not None:
            crc = zlib.crc32(arr.astype("<i8").tobytes(), crc)
    return crc


def check_complete(state: dict[str, Any], required: set[str], *, what: str) -> None:
    """Raise ValueError naming the keys of `required` that the saved `what` state lacks."""
    missing = sorted(required - state.keys())
    if missing:
        raise ValueError(f"{what} state is missing {missing}; was it saved by state_dict()?")


def check_saved_params(
    state: dict[str, Any], params: dict[str, Any], *, what: str, advice: str
) -> None:
    """Raise ValueError naming each parameter whose saved value differs from the current one.

    Parameters that describe the dataset (record CRCs, sample counts, layout fingerprints) are
    reported first, as "of another dataset", with what their difference means.
    """
    diffs = {k: v for k, v in params.items() if k in state and state[k] != v}
    if not diffs:
        return
    data = [
        f"{k}: saved {state[k]!r}, now {v!r} ({_DATASET_PARAMS[k]})"
        for k, v in diffs.items()
        if k in _DATASET_PARAMS
    ]
    other = [
        f"{k}: saved {state[k]!r}, now {v!r}" for k, v in diffs.items() if k not in _DATASET_PARAMS
    ]
    parts = []
    if data:
        parts.append(f"is of another dataset ({'; '.join(data)})")
    if other:
        parts.append(f"was saved with different parameters ({'; '.join(other)})")
    raise ValueError(
        f"cannot resume: the {what} state "
        + " and ".join(parts)
        + ", so the order would differ and resuming would repeat or skip samples; "
        + advice
    )


def _saved_history(state: dict[str, Any], *, stream: bool) -> tuple[Segment, ...]:
    """The ``history`` of a saved state (absent in version 1: none)."""
    raw = state.get("history", [])
    if not isinstance(raw, list):
        raise ValueError(f"the state's history must be a list, got {raw!r}")
    return tuple(Segment.from_state(entry, stream=stream) for entry in raw)


def _rest_after(
    seg: Segment,
    rest: IntArray | None,
    left: int,
    *,
    drop_last: bool,
    consumed: int | ConsumedInShare,
) -> IntArray:
    """The positions of the global order left after `seg` consumed its part of `rest`."""
    base = np.arange(left, dtype=np.int64) if rest is None else rest
    keep = unconsumed_positions(
        left, world_size=seg.world_size, drop_last=drop_last, consumed=consumed
    )
    return base[keep]


def _check_version(state: dict[str, Any], *, kind: str, what: str) -> int:
    version = state["version"]
    saved_kind = state.get("kind", "ChunkShuffleSampler" if version == 1 else None)
    if version not in _READABLE:
        raise ValueError(
            f"{what} state version {version!r} is not supported (this version reads "
            f"{', '.join(map(str, _READABLE))})"
        )
    if saved_kind != kind:
        raise ValueError(
            f"cannot resume: the state was saved by a {saved_kind}, not a {kind}; load it into "
            f"the same class it was saved from"
        )
    return int(version)


# --------------------------------------------------------------------------- samplers


@dataclass(frozen=True)
class SamplerResume:
    """Where a loaded sampler state continues, at this sampler's world size.

    ``position`` is where the next pass starts in this rank's share (0 after a change of
    world size); ``history`` and ``rest`` (`rest_positions`) describe the epoch's earlier
    stretches at other world sizes.
    """

    epoch: int
    position: int
    history: tuple[Segment, ...]
    rest: IntArray | None


def sampler_state(
    *,
    kind: str,
    epoch: int,
    position: int,
    world_size: int,
    history: Sequence[Segment],
    params: dict[str, Any],
) -> dict[str, Any]:
    """A version 2 sampler state (see the module docstring): plain JSON types only."""
    state = {
        "version": SAMPLER_STATE_VERSION,
        "kind": kind,
        "epoch": int(epoch),
        "world_size": int(world_size),
        "position": int(position),
        "history": [seg.as_state() for seg in history],
    }
    return state | params


def read_sampler_state(
    state: dict[str, Any],
    params: dict[str, Any],
    *,
    kind: str,
    world_size: int,
    num_units: int,
    drop_last: bool,
) -> SamplerResume:
    """The resume point of a saved sampler state, checked against the sampler's parameters.

    Args:
        state: As saved by `sampler_state` (or a version 1 state).
        params: The sampler's parameters (all but the world size), compared with the state's.
        kind: The sampler class's name; a state of another class is refused.
        world_size: Ranks now; another than the saved one is an elastic resume.
        num_units: Units in the epoch's global order (the same for every epoch).
        drop_last: The sampler's ``drop_last``.

    Raises:
        ValueError: the state is incomplete, of another version or class, of another dataset,
            saved with other parameters, or its position lies beyond a rank's share.
    """
    check_complete(state, {"version", "epoch", "position", "world_size"}, what="sampler")
    version = _check_version(state, kind=kind, what="sampler")
    required = set(params) - (_ADDED_IN_2 if version == 1 else set())
    check_complete(state, required, what="sampler")
    check_saved_params(
        state,
        {k: v for k, v in params.items() if k in required},
        what="sampler",
        advice="build the sampler with the saved parameters over the same dataset selection",
    )
    epoch, position, saved_size = state["epoch"], state["position"], state["world_size"]
    check_nonneg("epoch", epoch)
    check_nonneg("position", position)
    check_nonneg("world_size", saved_size, 1)
    history = _saved_history(state, stream=False)
    rest = rest_positions(num_units, history, drop_last=drop_last)
    left = num_units if rest is None else rest.size
    length = rank_length(left, int(saved_size), drop_last)
    if position > length:
        raise ValueError(
            f"saved position {position} exceeds a rank's {length} units (world size {saved_size})"
        )
    if saved_size == world_size or position == 0:
        return SamplerResume(
            int(epoch), int(position) if saved_size == world_size else 0, history, rest
        )
    seg = Segment(int(saved_size), int(position))
    rest = _rest_after(seg, rest, left, drop_last=drop_last, consumed=seg.position)
    return SamplerResume(int(epoch), 0, (*history, seg), rest)


# --------------------------------------------------------------------------- ShardStream


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
    """A loaded stream state: the epoch, the same-size resume point (None after a change of
    world size: the rest starts at its beginning), and the earlier stretches."""

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
    state = {
        "version": STREAM_STATE_VERSION,
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

    Raises:
        ValueError: the state is incomplete, of another kind or version, of another dataset,
            or was saved with other order parameters.
    """
    keys = ("epoch", "consumed_batches", "batch_size", "num_workers", "drop_last_batch")
    check_complete(state, {"version", "kind", "world_size", *keys}, what="stream")
    version = _check_version(state, kind="ShardStream", what="stream")
    required = set(params) - (_ADDED_IN_2 if version == 1 else set())
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
    history = _saved_history(state, stream=True)

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
    rest = _rest_after(seg, rest, left, drop_last=drop_last, consumed=consumed_of(seg))
    return StreamRestart(int(epoch), None, (*history, seg), rest)
