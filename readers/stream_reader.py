"""How ``ShardStream`` gets items out of a dataset: stored records read run by run through a
bounded shuffle buffer, decoded as they leave it (``dataset.decode_stored``, which goes through
``readers.decode.decode_sample``)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from readers.decode import check_mode, decode_sample
from readers.errors import RecordError
from readers.order import IntArray, sequential_runs

__all__ = ["RunReader", "StreamSource"]


class StreamSource:
    """The dataset a stream reads, and how its items are finished (decoded, transformed).

    A dataset directory is opened with ``readers.open_dataset`` reading stored bytes. A packed
    dataset object (one with ``decode`` and ``transform`` attributes) is read as stored bytes
    from a shallow copy (``copy.copy`` goes through ``__getstate__``, so the copy starts
    without the original's handles) and decoded here; any other is read with ``ds[i]`` and its
    items pass through untouched.
    """

    def __init__(
        self,
        source: Any,
        *,
        decode: str | None,
        transform: Callable[[Any], Any] | None,
    ) -> None:
        if decode is not None:
            check_mode(decode)
        dataset: Any = source
        opened = False
        if isinstance(source, str | os.PathLike):
            from readers.datasets import open_dataset

            dataset, opened = open_dataset(source, decode="bytes"), True
            decode = "rgb" if decode is None else decode
        self.packed = hasattr(dataset, "decode") and hasattr(dataset, "transform")
        if self.packed and not opened:
            decode = dataset.decode if decode is None else decode
            transform = dataset.transform if transform is None else transform
            dataset = copy.copy(dataset)
            dataset.decode = "bytes"
            dataset.transform = None
        elif not self.packed and (decode is not None or transform is not None):
            raise ValueError(
                f"decode= and transform= apply to packed datasets (with .decode and "
                f".transform); {type(dataset).__name__} has neither, so its items are yielded "
                "as they are: decode and transform in the dataset instead"
            )
        self.dataset = dataset
        self.decode = decode
        self.transform = transform

    def finish(self, i: int, item: Any) -> Any:
        """The item of sample ``i`` from its stored record: decoded and transformed."""
        if not self.packed:
            return item
        image, label = item
        if self.decode != "bytes":
            # the dataset knows how its samples are stored (raw pixels need the index's
            # dimensions); a packed dataset without decode_stored stores encoded images
            decode_stored = getattr(self.dataset, "decode_stored", None)
            try:
                if callable(decode_stored):
                    image = decode_stored(image, i, str(self.decode))
                else:
                    image = decode_sample(image, str(self.decode))
            except ValueError as exc:
                raise RecordError(
                    f"{getattr(self.dataset, 'root', type(self.dataset).__name__)} sample {i}: "
                    f"cannot decode ({exc})"
                ) from exc
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def serve(
        self, ids: IntArray, order: IntArray, skip: int, *, buffer: int, chunk_lo: IntArray
    ) -> Iterator[Any]:
        """Read ``ids`` in order, emit them in ``order`` from ``skip`` on, holding at most
        ``buffer`` records (the bound ``order[o] < o + buffer`` of ``buffer_order``)."""
        m = ids.size
        reader = RunReader(self.dataset, ids, chunk_lo)
        held: dict[int, Any] = {}
        nxt = 0
        if skip:
            # Replay the buffer on positions: what it holds after `skip` outputs is every
            # input read by then that was not emitted yet.
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
            yield self.finish(int(ids[p]), held.pop(p))


class RunReader:
    """Reads a worker's ids by position; every sequential run is announced before its reads.

    A run is a stretch of consecutive ascending ids inside one chunk (``sequential_runs``):
    :meth:`enter_run` is the one place where the stream starts reading ids ``[start, stop)``
    one after the other, so read-ahead belongs there; today it passes the range to
    ``dataset.prefetch`` when the dataset has one.
    """

    def __init__(self, dataset: Any, ids: IntArray, chunk_lo: IntArray) -> None:
        self.dataset = dataset
        self.ids = ids
        prefetch = getattr(dataset, "prefetch", None)
        self._prefetch = prefetch if callable(prefetch) else None
        self._run, self._run_last = sequential_runs(ids, chunk_lo)
        self._current = -1

    def read(self, p: int) -> Any:
        """The dataset's item at position ``p`` of ``ids``."""
        run = int(self._run[p])
        if run != self._current:
            self._current = run
            self.enter_run(int(self.ids[p]), int(self.ids[self._run_last[run]]) + 1)
        return self.dataset[int(self.ids[p])]

    def enter_run(self, start: int, stop: int) -> None:
        """The stream is about to read ids ``start .. stop - 1`` in order."""
        if self._prefetch is not None:
            self._prefetch(start, stop)
