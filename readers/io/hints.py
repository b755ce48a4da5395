"""Chunk sizes and read-ahead hints of the samplers.

A default chunk holds about ``CHUNK_BYTES`` of stored bytes (``resolve_chunk_size``); each chunk
is hinted to ``dataset.prefetch`` a bounded distance before its first sample is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from readers.order import IntArray, chunk_ranges

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "PREFETCH_BYTES",
    "ChunkHints",
    "ids_within_bytes",
    "lookahead_samples",
    "mean_record_bytes",
    "resolve_chunk_size",
    "stored_sizes",
]

PREFETCH_BYTES = 32 << 20
"""At most this many bytes of upcoming chunks are hinted to the OS ahead of the reads."""

DEFAULT_CHUNK_SIZE = 64
"""Samples per chunk without a byte count (no ``dataset.index.nbytes``), and the fewest a
default chunk has: 64 typical JPEGs are a few MB."""

CHUNK_BYTES = 1 << 20
"""Stored bytes a default chunk aims at: one hint and a few large disk requests per chunk."""

MAX_CHUNK_SIZE = 4096
"""The most samples a default chunk has (tiny records: keep the order mixed)."""

Prefetch = Callable[[int, int], Any]


def stored_sizes(dataset: Any, ids: IntArray | None = None) -> tuple[int, int] | None:
    """Return ``(total bytes, samples)`` stored for the selected samples, or None.

    ``(total bytes, samples)`` stored for the selected samples (``ids``; None: all) by
    ``dataset.index.nbytes``, in integers so that every rank and process agrees; None when
    the dataset has no such index (or one of another length), or nothing is selected.
    """
    nbytes = getattr(getattr(dataset, "index", None), "nbytes", None)
    if nbytes is None or len(nbytes) != len(dataset):
        return None
    sizes = np.asarray(nbytes) if ids is None else np.asarray(nbytes)[ids]
    if sizes.size == 0:
        return None
    return int(sizes.sum(dtype=np.int64)), int(sizes.size)


def mean_record_bytes(dataset: Any, default: float) -> float:
    """The mean stored size of `dataset`'s records (at least 1), or `default` without one."""
    found = stored_sizes(dataset)
    return default if found is None else max(1.0, found[0] / found[1])


def ids_within_bytes(dataset: Any, start: int, nbytes: int, *, most: int) -> int | None:
    """Return how many ids from `start` on hold `nbytes` stored bytes, or None.

    How many ids from `start` on hold `nbytes` stored bytes by ``dataset.index.nbytes`` (at
    least 1, at most `most` and the ids left); None without such an index.

    Reads at most `most` entries of the index (no cumulative column for the whole dataset:
    that would cost 8 bytes per sample in every worker).
    """
    sizes = getattr(getattr(dataset, "index", None), "nbytes", None)
    if sizes is None or len(sizes) != len(dataset):
        return None
    ahead = np.asarray(sizes[start : start + max(1, int(most))], dtype=np.int64)
    if ahead.size == 0:
        return None
    reach = int(np.searchsorted(np.cumsum(ahead), nbytes, side="left")) + 1
    return min(reach, int(ahead.size))


def resolve_chunk_size(dataset: Any, chunk_size: int | None, ids: IntArray | None) -> int:
    """Samples per chunk: ``chunk_size`` itself when given, else about ``CHUNK_BYTES`` of them.

    The default counts the mean stored size of the selected samples (``ids``; None: all) in
    ``dataset.index.nbytes`` (`stored_sizes`), and keeps it within
    ``[DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE]``. A dataset without that index (or an index of
    another length) gets ``DEFAULT_CHUNK_SIZE``. A dataset with a ``chunk_bytes`` attribute
    gets chunks of that many bytes instead (a dataset read by ranged GETs from object storage
    asks for larger ones: `readers.datasets.recordio.REMOTE_CHUNK_BYTES`).
    """
    if chunk_size is not None:
        return int(chunk_size)
    found = stored_sizes(dataset, ids)
    if found is None or found[0] <= 0:
        return DEFAULT_CHUNK_SIZE
    total, count = found
    per_chunk = int(getattr(dataset, "chunk_bytes", CHUNK_BYTES)) * count // total
    return min(MAX_CHUNK_SIZE, max(DEFAULT_CHUNK_SIZE, per_chunk))


def lookahead_samples(dataset: Any, *, chunk_size: int, window: int) -> int:
    """How many samples ahead of the reads the hints run.

    One shuffle block ahead, so the next block's chunks are on their way from disk while this
    block's samples are decoded; but never more than ``PREFETCH_BYTES`` ahead (by the mean
    stored size in ``dataset.index.nbytes``): hinting 200 MB at once on a 100 MB/s disk
    stalled the reads for seconds (bench_orders.py --sweep: 1,000/s -> 15/s). With default
    chunks (``CHUNK_BYTES``) a block of 8 is about 8 MiB, under the cap.
    """
    ahead = chunk_size * max(1, window)
    if stored_sizes(dataset) is not None:
        per_sample = mean_record_bytes(dataset, 1.0)
        ahead = min(ahead, max(chunk_size, int(PREFETCH_BYTES / per_sample)))
    return ahead


class ChunkHints:
    """The chunks a pass over ``ids`` enters, in order, and a cursor over the ones hinted.

    Args:
        prefetch: ``dataset.prefetch(start, stop)``: hint the ids ``[start, stop)``.
        ids: The ids the pass yields, in order.
        bounds: The dataset's shard bounds.
        chunk_size: Selected samples per chunk.
        selected: The sorted selected ids the chunks are made of (None: all).
        chunks: The chunks as id ranges ``(lo, hi)`` in id order, instead of cutting them
            from ``bounds``, ``chunk_size`` and ``selected`` (a mixture of sources, each with
            its own chunk size: ``readers.mixing.Mixture.chunk_table``).
    """

    def __init__(
        self,
        prefetch: Prefetch,
        ids: IntArray,
        *,
        bounds: IntArray,
        chunk_size: int,
        selected: IntArray | None,
        chunks: tuple[IntArray, IntArray] | None = None,
    ) -> None:
        self._prefetch = prefetch
        entries = np.zeros(0, dtype=np.int64)
        lo = hi = entries
        if ids.size:
            if chunks is None:
                chunks = chunk_ranges(bounds, chunk_size=chunk_size, ids=selected)
            lo_all, hi_all = chunks
            chunk = np.searchsorted(lo_all, ids, side="right") - 1
            _, first = np.unique(chunk, return_index=True)
            entries = np.sort(first).astype(np.int64)
            lo, hi = lo_all[chunk[entries]], hi_all[chunk[entries]]
        self.entries = entries  # positions in ``ids`` where a chunk is entered, ascending
        self._lo = lo  # that chunk's id range
        self._hi = hi
        self._next = 0  # the first entry not hinted yet

    def until(self, stop: int) -> None:
        """Hint every chunk entered before position ``stop`` that is not hinted yet."""
        e = self._next
        while e < self.entries.size and self.entries[e] < stop:
            self._prefetch(int(self._lo[e]), int(self._hi[e]))
            e += 1
        self._next = e

    def due(self, ahead: int) -> int:
        """The position at which the next hint, ``ahead`` samples early, is due; -1: none."""
        e = self._next
        return int(self.entries[e]) - ahead if e < self.entries.size else -1
