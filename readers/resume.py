"""Mid-epoch resume state of the samplers and of ``ShardStream``: what is saved, and checks on load.

A state records where training got in an epoch plus every parameter the order depends on; a
state saved with other parameters is refused, since resuming it would repeat some samples and
skip others.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.order import IntArray, check_nonneg, loader_batches, worker_counts

__all__ = [
    "SAMPLER_STATE_VERSION",
    "STREAM_STATE_VERSION",
    "StreamResume",
    "check_complete",
    "check_saved_params",
    "fingerprint",
    "loader_shape",
    "read_sampler_state",
    "read_stream_state",
    "stream_state",
]

SAMPLER_STATE_VERSION = 1
STREAM_STATE_VERSION = 1


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
    """Raise ValueError naming each parameter whose saved value differs from the current one."""
    diffs = [f"{k}: saved {state[k]!r}, now {v!r}" for k, v in params.items() if state[k] != v]
    if diffs:
        raise ValueError(
            f"cannot resume: the {what} state was saved with different parameters ("
            + "; ".join(diffs)
            + "), so the order would differ and resuming would repeat or skip samples; "
            + advice
        )


# --------------------------------------------------------------------------- samplers


def read_sampler_state(
    state: dict[str, Any], params: dict[str, Any], *, length: int
) -> tuple[int, int]:
    """``(epoch, position)`` of a sampler state, checked against the sampler's parameters.

    Raises:
        ValueError: the state is incomplete, of another version, saved with other parameters,
            or its position lies beyond this rank's ``length`` samples.
    """
    check_complete(state, {"version", "epoch", "position", *params}, what="sampler")
    if state["version"] != SAMPLER_STATE_VERSION:
        raise ValueError(
            f"sampler state version {state['version']} is not supported "
            f"(this version reads {SAMPLER_STATE_VERSION})"
        )
    check_saved_params(
        state,
        params,
        what="sampler",
        advice="build the sampler with the saved parameters and the same dataset selection",
    )
    epoch, position = state["epoch"], state["position"]
    check_nonneg("epoch", epoch)
    check_nonneg("position", position)
    if position > length:
        raise ValueError(f"saved position {position} exceeds this rank's {length} samples")
    return int(epoch), int(position)


# --------------------------------------------------------------------------- ShardStream


@dataclass(frozen=True)
class StreamResume:
    """Where the saved epoch continues: samples each worker skips, and the worker rotation."""

    epoch: int
    num_workers: int  # as the loader had them (0: in-process)
    skip: tuple[int, ...]  # per worker of the saved run
    rotation: int  # DataLoader worker j plays saved worker (j + rotation) % V

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
        "consumed_batches": k,
        "consumed_samples": int(size[:k].sum()),
        "batch_size": batch_size,
        "num_workers": num_workers,
        "drop_last_batch": drop,
    }
    return state | params


def read_stream_state(
    state: dict[str, Any], params: dict[str, Any], *, length: int
) -> StreamResume:
    """The resume point of a saved stream state, checked against the stream's parameters.

    Raises:
        ValueError: the state is incomplete, of another kind or version, or was saved with
            other order parameters or another dataset layout.
    """
    keys = ("epoch", "consumed_batches", "batch_size", "num_workers", "drop_last_batch")
    check_complete(state, {"version", "kind", *keys, *params}, what="stream")
    if state["kind"] != "ShardStream" or state["version"] != STREAM_STATE_VERSION:
        raise ValueError(
            f"stream state kind {state['kind']!r} version {state['version']} is not "
            f"supported (this reads ShardStream version {STREAM_STATE_VERSION})"
        )
    check_saved_params(
        state,
        params,
        what="stream",
        advice="build the stream with the saved parameters over the same dataset",
    )
    epoch, k = state["epoch"], state["consumed_batches"]
    batch_size, num_workers = state["batch_size"], state["num_workers"]
    for name, value, minimum in (
        ("epoch", epoch, 0),
        ("consumed_batches", k, 0),
        ("batch_size", batch_size, 1),
        ("num_workers", num_workers, 0),
    ):
        check_nonneg(name, value, minimum)
    counts = worker_counts(length, num_workers)
    worker, _, size = loader_batches(
        counts, batch_size=batch_size, drop_last=bool(state["drop_last_batch"])
    )
    if k > size.size:
        raise ValueError(f"saved consumed_batches={k} exceeds the {size.size} batches")
    skip = np.bincount(worker[:k], weights=size[:k], minlength=counts.size)
    return StreamResume(
        epoch=int(epoch),
        num_workers=int(num_workers),
        skip=tuple(int(s) for s in skip),
        rotation=int(worker[k]) if k < worker.size else 0,
    )
