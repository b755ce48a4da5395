"""Shard writers: `ShardWriter` (one per format, in ``packer/writers/<fmt>.py``, registered in
`packer.formats`), `ShardPart` (one planned shard of a build) and `merge_parts` (the index)."""

from __future__ import annotations

from typing import Any

from packer.writers.base import ShardWriter
from packer.writers.merge import merge_parts
from packer.writers.part import ShardPart


def __getattr__(name: str) -> Any:
    if name == "WRITERS":  # format name -> writer class, from the registry (imported late:
        # packer.formats imports this package)
        from packer.formats import FORMATS

        return {fmt.name: fmt.writer for fmt in FORMATS.values()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["WRITERS", "ShardPart", "ShardWriter", "merge_parts"]
