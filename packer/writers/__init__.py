"""Shard writers: the base owns rollover, checksums and the index; a format writes bytes."""

from __future__ import annotations

from packer.writers.base import DatasetWriter, ShardWriter
from packer.writers.lmdb import LmdbShardWriter

WRITERS: dict[str, type[ShardWriter]] = {"lmdb": LmdbShardWriter}

__all__ = ["WRITERS", "DatasetWriter", "LmdbShardWriter", "ShardWriter"]
