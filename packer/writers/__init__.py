"""Shard writers: `ShardWriter`, `ShardPart` and `merge_parts`.

Shard writers: `ShardWriter` (one per format, in ``packer/writers/<fmt>.py``, registered in
`packer.formats`, the one table of writers and checks), `ShardPart` (one planned shard of a
build) and `merge_parts` (the index).
"""

from __future__ import annotations

from packer.writers.base import ShardWriter
from packer.writers.merge import merge_parts
from packer.writers.part import ShardPart

__all__ = ["ShardPart", "ShardWriter", "merge_parts"]
