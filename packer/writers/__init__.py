"""Shard writers: the base owns rollover, checksums and the index; a format writes bytes."""

from __future__ import annotations

from packer.writers.base import ShardPart, ShardWriter, merge_parts
from packer.writers.lmdb import LmdbShardWriter
from packer.writers.recordio import RecordIOShardWriter

WRITERS: dict[str, type[ShardWriter]] = {
    "lmdb": LmdbShardWriter,
    "recordio": RecordIOShardWriter,
}

__all__ = [
    "WRITERS",
    "LmdbShardWriter",
    "RecordIOShardWriter",
    "ShardPart",
    "ShardWriter",
    "merge_parts",
]
