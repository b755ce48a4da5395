"""Shard writers: the base owns rollover, checksums and the index; a format writes bytes."""

from __future__ import annotations

from packer.writers.base import ShardWriter
from packer.writers.lmdb import LmdbShardWriter
from packer.writers.merge import merge_parts
from packer.writers.part import ShardPart
from packer.writers.recordio import RecordIOShardWriter

# format name -> writer class (until the packer-side registry, packer.formats, takes over)
WRITERS: dict[str, type[ShardWriter]] = {
    cls.format: cls for cls in (LmdbShardWriter, RecordIOShardWriter)
}

__all__ = [
    "WRITERS",
    "LmdbShardWriter",
    "RecordIOShardWriter",
    "ShardPart",
    "ShardWriter",
    "merge_parts",
]
