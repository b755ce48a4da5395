"""Mid-epoch resume states of the samplers: what is saved, the checks on load, elastic resume.

The checks on load are shared with ``ShardStream``'s (:mod:`readers.stream_resume`); the entry
points of elastic resume are here too.

A state records where training got in an epoch plus every parameter the order depends on; a
state saved with other parameters, or over another dataset, is refused with a message naming
what differs, since resuming it would repeat some samples and skip others.

Elastic resume (a state saved with ``N`` ranks loaded with ``M``) applies the pure functions
of :mod:`readers.elastic`; the generic entry points for every sampler built on one global
order are re-exported here: `rest_positions`, `resume_share`, and the versioned state,
`sampler_state` and `read_sampler_state`. A sampler calls ``read_sampler_state`` in
``load_state_dict``, keeps the returned ``history`` and ``rest``, and takes
``resume_share(global_order, rest=rest, ...)`` as its rank's share of that epoch. Positions in
a state count this rank's share *since the last change of world size* (from the epoch's start
when the size never changed); after an elastic load they start again at 0.

**Sampler state, version 3** (plain JSON)::

    {"version": 3, "kind": "ChunkShuffleSampler", "epoch": 3,
     "world_size": 8,          # ranks of the run that saved it
     "position": 1536,         # of every rank's share consumed (samples; bucket: batches)
     "history": [{"world_size": 2, "position": 40}],   # earlier stretches, oldest first
     "seed": 0, "chunk_size": 64, "shuffle": true, "drop_last": false, "window": 8,
     "num_selected": 100000, "selection_crc32": 123, "records_crc32": 456, ...}

A weighted mixture adds ``weights``, ``epoch_samples``, ``mix``, ``mix_batch_size`` (the batch
size with ``mix="batch"``, else null), ``chunk_sizes`` and ``source_sizes`` (per source); a
bucket sampler adds ``key``, ``boundaries``, ``batch_sizes`` and ``buckets_crc32`` (and the
mixture's keys with ``weights=``: its epochs then differ in length, and a state is read
against the batches of its own epoch).

*Units.* Ranks split an epoch's global order by units: samples (chunked sampler, mixed
sampler with ``mix="epoch"``, ``ShardStream``) or batches (``BucketBatchSampler``, and the
mixed sampler with ``mix="batch"``, whose every batch holds the per-source counts). Positions
count samples for ``ChunkShuffleSampler`` (``mix="batch"`` included) and batches for
``BucketBatchSampler``. A ``mix="batch"`` state therefore converts its positions to batches
of ``mix_batch_size``: at another world size its position and every history position must
be whole batches (``ChunkShuffleBatchSampler.state_dict(consumed_batches=k)`` always is;
a position inside a batch resumes only at the saved world size and is refused elsewhere,
saying so). The consumed part is then a set of whole mixed batches, and the rest is whole
mixed batches too, split over the new ranks by batches.

*Versions.* Version 3 (since mix="batch" resumes elastically) has the layout of version 2;
what changed is that a ``mix="batch"`` state may carry a ``history`` counted as above, which
code that reads only version 2 would split by samples, so it must refuse it: every sampler
state is written as version 3. Versions 2 and 1 still load: a version 2 state means the same as
version 3 (its ``mix="batch"`` states never carry a history), and version 1, written before
elastic resume, is a version 2 state without ``kind``, ``history`` and ``records_crc32``.
Version 4 is a version 3 state whose ``history`` records a change of mixture weights
(``load_state_dict(state, weights=...)``, :mod:`readers.reweight`): a history entry then also
carries ``"weights"``, the weights that stretch ran with, and the epoch's unconsumed units
after it were drawn anew with the next weights (the state's ``weights`` are the current ones).
Code that reads only version 3 would ignore that and mis-order the rest, so such a state is
written as version 4; a state without such an entry is still written as version 3.

*Refusals.* A state is refused, with a message naming each parameter that differs (saved
value, current value), when it belongs to another class, another dataset (``records_crc32``,
``num_selected``, ``selection_crc32``, ``source_sizes``, ``buckets_crc32`` ...: reported
first, as "of another dataset", with what the difference means), or other order parameters.

``ShardStream`` states (version 2, ``"kind": "ShardStream"``, :mod:`readers.stream_resume`)
record ``consumed_batches`` with the loader's ``batch_size``, ``num_workers`` and
``drop_last_batch`` instead of ``position``; their ``history`` entries carry the same five
keys.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.elastic import (
    ConsumedInShare,
    Segment,
    rank_length,
    rest_positions,
    resume_share,
    unconsumed_positions,
)
from readers.order import IntArray, check_nonneg

__all__ = [
    "ADDED_IN_2",
    "REWEIGHTED_STATE_VERSION",
    "SAMPLER_READABLE",
    "SAMPLER_STATE_VERSION",
    "STREAM_READABLE",
    "ConsumedInShare",
    "SamplerResume",
    "Segment",
    "check_complete",
    "check_saved_params",
    "check_version",
    "fingerprint",
    "read_sampler_state",
    "rest_after",
    "rest_positions",
    "resume_share",
    "sampler_state",
    "saved_history",
    "unconsumed_positions",
]

SAMPLER_STATE_VERSION = 3
REWEIGHTED_STATE_VERSION = 4
SAMPLER_READABLE = (1, 2, 3, 4)
STREAM_READABLE = (1, 2, 3)
ADDED_IN_2 = {"records_crc32"}  # parameters a version 1 state does not record

# Parameters that describe the dataset rather than the order: a mismatch in one of them means
# the state belongs to another dataset (or another selection of this one).
_DATASET_PARAMS = {
    "records_crc32": "the stored records differ",
    "num_samples": "another number of samples",
    "num_selected": "another number of selected samples",
    "shards_crc32": "another shard layout",
    "selection_crc32": "another shard layout or selection of samples",
    "buckets_crc32": "other bucket members (key values or boundaries)",
    "source_sizes": "other sources, or another selection of them",
}


def fingerprint(*arrays: npt.NDArray[np.integer[Any]] | None) -> int:
    """CRC-32 of integer arrays as int64 (None skipped): tells layouts and selections apart."""
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


def saved_history(state: dict[str, Any], *, stream: bool) -> tuple[Segment, ...]:
    """The ``history`` of a saved state (absent in version 1: none)."""
    raw = state.get("history", [])
    if not isinstance(raw, list):
        raise ValueError(f"the state's history must be a list, got {raw!r}")
    return tuple(Segment.from_state(entry, stream=stream) for entry in raw)


def rest_after(
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
        left,
        world_size=seg.world_size,
        drop_last=drop_last,
        consumed=consumed,
        keep_unplanned=seg.weights is not None,
    )
    return base[keep]


def check_version(
    state: dict[str, Any], *, kind: str, what: str, readable: Sequence[int] = SAMPLER_READABLE
) -> int:
    """The version of `state`, checked to be `readable` and saved by a `kind` (`what` names it).

    Raises:
        ValueError: the version is not readable, or another class saved the state.
    """
    version = state["version"]
    saved_kind = state.get("kind", "ChunkShuffleSampler" if version == 1 else None)
    if version not in readable:
        raise ValueError(
            f"{what} state version {version!r} is not supported (this version reads "
            f"{', '.join(map(str, readable))})"
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
    """A sampler state (module docstring): plain JSON types only.

    Its version is `SAMPLER_STATE_VERSION`, or `REWEIGHTED_STATE_VERSION` when its history
    records a change of mixture weights.
    """
    changed = any(seg.weights is not None for seg in history)
    state = {
        "version": REWEIGHTED_STATE_VERSION if changed else SAMPLER_STATE_VERSION,
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
    unit: int = 1,
    reweight_from: tuple[float, ...] | None = None,
    rest_of: Callable[[tuple[Segment, ...]], IntArray | None] | None = None,
) -> SamplerResume:
    """The resume point of a saved sampler state, checked against the sampler's parameters.

    Args:
        state: As saved by `sampler_state` (or a version 1 or 2 state).
        params: The sampler's parameters (all but the world size), compared with the state's.
        kind: The sampler class's name; a state of another class is refused.
        world_size: Ranks now; another than the saved one is an elastic resume.
        num_units: Units in the epoch's global order (the same for every epoch).
        drop_last: The sampler's ``drop_last``.
        unit: Positions the state counts per unit: 1, or the batch size of a ``mix="batch"``
            mixture, whose state counts samples while ranks split whole batches. A change of
            world size then needs a position of whole batches.
        reweight_from: The state's mixture weights when the sampler continues with others
            (``load_state_dict(state, weights=...)``; `params` then holds the saved weights):
            the saved stretch is closed as a history entry carrying them, and the rest
            (every unconsumed unit, :mod:`readers.reweight`) starts at position 0.
        rest_of: The rest of the epoch after a history (default `rest_positions`), for a
            sampler whose change of weights changes the number of units (buckets).

    Raises:
        ValueError: the state is incomplete, of another version or class, of another dataset,
            saved with other parameters, its position lies beyond a rank's share, or (with
            ``unit > 1``) inside a batch at a change of world size.
    """
    check_complete(state, {"version", "epoch", "position", "world_size"}, what="sampler")
    version = check_version(state, kind=kind, what="sampler")
    required = set(params) - (ADDED_IN_2 if version == 1 else set())
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
    history = saved_history(state, stream=False)
    for seg in history:
        _check_whole_units(seg.position, unit, seg.world_size, "a history entry's position")
    if rest_of is None:
        rest = rest_positions(
            num_units, history, drop_last=drop_last, consumed_of=lambda seg: seg.position // unit
        )
    else:
        rest = rest_of(history)
    left = num_units if rest is None else rest.size
    length = rank_length(left, int(saved_size), drop_last)
    if position > length * unit:
        raise ValueError(
            f"saved position {position} exceeds a rank's {length * unit} "
            f"{'units' if unit == 1 else 'samples'} (world size {saved_size})"
        )
    if reweight_from is not None:
        _check_whole_units(
            int(position), unit, int(saved_size), "the saved position", "change the weights"
        )
        seg = Segment(int(saved_size), int(position), weights=reweight_from)
        if rest_of is not None:
            return SamplerResume(int(epoch), 0, (*history, seg), rest_of((*history, seg)))
        rest = rest_after(seg, rest, left, drop_last=drop_last, consumed=seg.position // unit)
        return SamplerResume(int(epoch), 0, (*history, seg), rest)
    if saved_size == world_size or position == 0:
        return SamplerResume(
            int(epoch), int(position) if saved_size == world_size else 0, history, rest
        )
    _check_whole_units(int(position), unit, int(saved_size), "the saved position")
    seg = Segment(int(saved_size), int(position))
    rest = rest_after(seg, rest, left, drop_last=drop_last, consumed=seg.position // unit)
    return SamplerResume(int(epoch), 0, (*history, seg), rest)


def _check_whole_units(
    position: int, unit: int, saved_size: int, what: str, to: str = "resume at another world size"
) -> None:
    """Refuse a position inside a unit (a mix="batch" batch) where ranks re-split the rest."""
    if position % unit:
        raise ValueError(
            f"cannot {to}: {what} ({position} samples, saved with "
            f"world_size={saved_size}) falls inside a mixed batch of {unit}; with mix='batch' "
            f"ranks split whole batches, so save state_dict(consumed_batches=k) (or a multiple "
            f"of {unit} samples)"
            + (f", or resume at world_size={saved_size}" if "world size" in to else "")
        )
