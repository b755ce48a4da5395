"""Many records at once, as columns: `RecordBatch`, what ``ShardPart.add_batch`` writes.

A batch is a run of consecutive records that need no per-record preparation: records copied
as stored from a packer dataset (``packer convert``, merge, split), whose description (size,
dimensions, format, CRC-32) comes from the source's index. Writing them a batch at a time lets
the shard writers and the index rows do their per-record work in C (numpy, ``bytes.join``,
``map``) instead of one Python call chain per record; the bytes written are exactly those
that writing the batch's records one by one (`ShardPart.add`) gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.records import Record


@dataclass
class RecordBatch:
    """Records as columns, all of one length (one entry per record, in order).

    Attributes:
        rel: the records' paths (``Record.rel``).
        data: their stored bytes.
        label: their labels (JSON-able values, as in `Record`).
        format: their stored formats (``jpeg``, ``png``, ``raw``, ...).
        width, height, channels: their dimensions.
        crc32: the CRC-32 of each one's stored bytes (checked by whoever made the batch).
        compression: the compression of raw pixels, or None.
        int_labels: when every label is an int (not a bool), the labels as int64: the fast
            path of the writers (a class-id dataset); None otherwise.
        stored_sizes: the size of each record's stored bytes; None: ``len`` of each of `data`
            (then kept here). Given with `data` empty, the batch describes records whose bytes
            are not read: a shard reused whole (`packer.writers.reuse`).
    """

    rel: list[str]
    data: list[bytes]
    label: list[Any]
    format: list[str]
    width: list[int]
    height: list[int]
    channels: list[int]
    crc32: list[int]
    compression: list[str | None]
    int_labels: np.ndarray | None = None
    stored_sizes: list[int] | None = None

    def __len__(self) -> int:
        return len(self.rel)

    def sizes(self) -> list[int]:
        """The size of each record's stored bytes."""
        if self.stored_sizes is None:
            self.stored_sizes = list(map(len, self.data))  # (kept: the same from now on)
        return self.stored_sizes

    def record(self, i: int) -> Record:
        """Record `i` of the batch as a `Record` (for the per-record paths)."""
        return Record(
            self.rel[i],
            self.label[i],
            self.data[i],
            self.format[i],
            self.width[i],
            self.height[i],
            self.channels[i],
            self.crc32[i],
            compression=self.compression[i],
        )

    def take(self, keep: Sequence[int]) -> RecordBatch:
        """The batch of records `keep` (positions, ascending)."""
        return RecordBatch(
            [self.rel[i] for i in keep],
            [self.data[i] for i in keep] if self.data else [],
            [self.label[i] for i in keep],
            [self.format[i] for i in keep],
            [self.width[i] for i in keep],
            [self.height[i] for i in keep],
            [self.channels[i] for i in keep],
            [self.crc32[i] for i in keep],
            [self.compression[i] for i in keep],
            None if self.int_labels is None else self.int_labels[np.asarray(keep, np.int64)],
            None if self.stored_sizes is None else [self.stored_sizes[i] for i in keep],
        )

    def nbytes(self) -> np.ndarray:
        """The size of each record's stored bytes (int64)."""
        return np.asarray(self.sizes(), dtype=np.int64).reshape(len(self))
