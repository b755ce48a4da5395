"""How ``ShardStream`` gets items out of a dataset.

Stored records are read run by run through a bounded shuffle buffer, decoded as they leave it
(``dataset.decode_stored``, which goes through ``readers.decode.decode_sample``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.augment_rng import transform_rng
from readers.decode import check_mode, decode_sample
from readers.draft import Draft, check_draft
from readers.errors import RecordError
from readers.order import IntArray, sequential_runs
from readers.transforms import is_planner, run_transform

__all__ = ["RunReader", "StreamSource", "finish_item", "open_source", "serve"]


@dataclass(frozen=True)
class StreamSource:
    """What a stream reads: the dataset, whether it is packed, and how items are finished."""

    dataset: Any
    decode: str | None  # None: not a packed dataset, items pass through
    transform: Callable[[Any], Any] | None
    draft: Draft | None = None


def open_source(
    source: Any,
    *,
    decode: str | None,
    transform: Callable[[Any], Any] | None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    draft: Any = None,
) -> StreamSource:
    """The dataset a stream reads from ``source``, with the decode mode and transform to use.

    A dataset directory is opened with ``readers.open_dataset`` reading stored bytes. A packed
    dataset object (one with ``decode`` and ``transform`` attributes) is read as stored bytes
    from a shallow copy (``copy.copy`` goes through ``__getstate__``, so the copy starts
    without the original's handles), and its own decode and transform are the defaults; any
    other is read with ``ds[i]`` and its items pass through untouched (``decode`` None). With
    ``cache_dir`` a dataset directory is read from its node-local copy (``readers.staging``).
    ``draft`` (default: a packed dataset's own) is set on the copy, which then decodes at
    that draft; the index's sizes it needs are loaded here, once, before workers start.
    """
    draft = check_draft(draft)
    if decode is not None:
        check_mode(decode)
    if cache_dir is not None:
        if not isinstance(source, str | os.PathLike):
            raise ValueError("cache_dir= needs a dataset path; give the dataset cache_dir=")
        from readers.staging import stage

        source = stage(source, cache_dir, cache_limit=cache_limit)
    dataset: Any = source
    opened = False
    if isinstance(source, str | os.PathLike):
        from readers.datasets import open_dataset

        dataset, opened = open_dataset(source, decode="bytes"), True
        decode = "rgb" if decode is None else decode
    packed = hasattr(dataset, "decode") and hasattr(dataset, "transform")
    if packed and not opened:
        decode = dataset.decode if decode is None else decode
        transform = dataset.transform if transform is None else transform
        draft = getattr(dataset, "draft", None) if draft is None else draft
        dataset = copy.copy(dataset)
        dataset.decode = "bytes"
        dataset.transform = None
    elif not packed and (decode is not None or transform is not None or draft is not None):
        raise ValueError(
            f"decode=, transform= and draft= apply to packed datasets (with .decode and "
            f".transform); {type(dataset).__name__} has neither, so its items are yielded "
            "as they are: decode and transform in the dataset instead"
        )
    if packed and hasattr(dataset, "draft"):
        dataset.draft = draft
        if (draft is not None or is_planner(transform)) and callable(
            getattr(dataset, "draft_sizes", None)
        ):
            dataset.draft_sizes()  # in this process, so forked workers share them
    return StreamSource(dataset, decode, transform, draft)


def finish_item(
    dataset: Any,
    i: int,
    item: Any,
    *,
    decode: str | None,
    transform: Callable[[Any], Any] | None,
) -> Any:
    """``(image, label)`` of sample ``i`` from its stored record: decoded and transformed.

    The dataset knows how its samples are stored (raw pixels need the index's dimensions), so
    its ``decode_stored`` decodes (at the dataset's ``draft``, and planned by `transform` when
    that is a `readers.transforms.DecodePlanner`); a packed dataset without one stores
    encoded images. ``decode`` None (a dataset that is not packed) returns ``item`` as it is.
    A transform that takes ``rng`` gets the generator of ``i`` when it is a
    `readers.augment_rng.SampleRef` (``ShardStream`` passes its seed and epoch so).
    """
    if decode is None:
        return item
    image, label = item
    rng = transform_rng(transform, i, int(i))
    if decode != "bytes":
        decode_stored = getattr(dataset, "decode_stored", None)
        try:
            if callable(decode_stored) and is_planner(transform):
                kw: dict[str, Any] = {} if rng is None else {"rng": rng}
                image = decode_stored(image, int(i), decode, planner=transform, **kw)
            elif callable(decode_stored):
                image = decode_stored(image, i, decode)
            else:
                image = decode_sample(image, decode)
        except ValueError as exc:
            raise RecordError(
                f"{getattr(dataset, 'root', type(dataset).__name__)} sample {i}: "
                f"cannot decode ({exc})"
            ) from exc
    if transform is not None:
        image = run_transform(transform, image, rng)
    return image, label


def serve(
    dataset: Any,
    ids: IntArray,
    order: IntArray,
    skip: int,
    *,
    buffer: int,
    chunk_lo: IntArray,
    finish: Callable[[int, Any], Any],
) -> Iterator[Any]:
    """Read ``ids`` in order, emit ``finish(id, item)`` in ``order`` from ``skip`` on.

    At most ``buffer`` records are held (the bound ``order[o] < o + buffer`` of ``buffer_order``).
    """
    m = ids.size
    reader = RunReader(dataset, ids, chunk_lo)
    held: dict[int, Any] = {}
    nxt = 0
    if skip:
        # Replay the buffer on positions: what it holds after `skip` outputs is every input
        # read by then that was not emitted yet.
        nxt = min(skip + buffer, m)
        pending = np.ones(nxt, dtype=np.bool_)
        pending[order[:skip]] = False
        for p in np.flatnonzero(pending).tolist():
            held[p] = reader.read(p)
    for o in range(skip, m):
        stop = min(o + buffer, m)
        while nxt < stop:
            held[nxt] = reader.read(nxt)
            nxt += 1
        p = int(order[o])
        yield finish(int(ids[p]), held.pop(p))


class RunReader:
    """Reads a worker's ids by position; every sequential run is announced before its reads.

    A run is a stretch of consecutive ascending ids inside one chunk (``sequential_runs``):
    :meth:`enter_run` announces ids ``[start, stop)`` to ``dataset.prefetch`` (when the
    dataset has one) one run ahead of the reads (``dataset.prefetch_runs`` runs ahead when the
    dataset has that attribute), so that the next run's bytes are on their
    way while this run's samples are decoded (a packed dataset leaves the reads inside the
    announced runs to these hints, `readers.readahead.Readahead`).
    """

    def __init__(self, dataset: Any, ids: IntArray, chunk_lo: IntArray) -> None:
        self.dataset = dataset
        self.ids = ids
        prefetch = getattr(dataset, "prefetch", None)
        self._prefetch = prefetch if callable(prefetch) else None
        self._run, self._run_last = sequential_runs(ids, chunk_lo)
        self._current = -1
        self._announced = -1  # the last run passed to enter_run
        # how many runs to announce ahead: 1 for a disk; more where a request has a latency
        # to hide (a dataset in object storage: `RecordIODataset.prefetch_runs`)
        self._runs_ahead = max(1, int(getattr(dataset, "prefetch_runs", 1)))

    def read(self, p: int) -> Any:
        """The dataset's item at position ``p`` of ``ids``."""
        run = int(self._run[p])
        if run != self._current:
            self._current = run
            if run > self._announced:  # runs are numbered in position order
                self.enter_run(int(self.ids[p]), int(self.ids[self._run_last[run]]) + 1)
            after = int(self._run_last[run]) + 1  # the next run starts at the next position
            for _ in range(self._runs_ahead):
                if after >= self.ids.size:
                    break
                following = int(self._run[after])
                last = int(self._run_last[following])
                if following > self._announced:
                    self.enter_run(int(self.ids[after]), int(self.ids[last]) + 1)
                    self._announced = following
                after = last + 1
        return self.dataset[int(self.ids[p])]

    def enter_run(self, start: int, stop: int) -> None:
        """The stream is about to read ids ``start .. stop - 1`` in order."""
        if self._prefetch is not None:
            self._prefetch(start, stop)
