"""A finished shard of another dataset reused whole: hard-linked, not written (merge, split).

A planned shard that holds exactly the records of one shard of a source dataset, in order,
whose stored bytes would not change (the same labels; for formats whose files hold global
ids, the same ids) is not written again: `link_part` hard-links the source's shard files
(``ShardWriter.link``; copied where the filesystem refuses a link) and writes the part's
index rows from the source's index, so that the merge treats it like any written shard. One
whose only change is its ids (a RecordIO shard that moves) is cloned (a reflink where the
filesystem shares blocks, else a copy in the kernel) and its ids rewritten in place.

A linked file is shared by two datasets, so nothing may write it in place afterwards; packer
never does: a shard is rewritten by unlinking its files first (`start_part`), an OUT replaced
with ``--overwrite`` is renamed away and removed (unlinked), LMDB gets its own copy of the lock
file (the only file readers write), and `renumber` breaks the link before it rewrites ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packer.errors import PackerError
from packer.records import Record
from packer.writers.base import ShardWriter
from packer.writers.batch import RecordBatch
from packer.writers.part import ShardPart, clear_part
from readers.formats.layout import shard_name


@dataclass
class ReusedShard:
    """A source shard that a planned shard reproduces byte for byte.

    Attributes:
        base: the source shard's base path (``SRC/shard-00003``).
        records: its records, described by the source's index (`RecordBatch` without data:
            ``stored_sizes`` set).
        offsets: their ``offset`` column in the source's index (-1 where unknown).
        file_bytes: the shard's size on disk, from the source's meta.json.
        renumber_from: None when the shard is reused as it is (linked); else its first id in
            the source, for a format whose files hold global ids: the shard is then cloned
            (a reflink or a copy) and its ids rewritten (``ShardWriter.renumber``).
    """

    base: Path
    records: RecordBatch
    offsets: np.ndarray
    file_bytes: int
    renumber_from: int | None = None


class LinkedShard(ShardWriter):
    """The writer of a planned shard that is a reused one: its files are links, not written."""

    format: ClassVar[str] = ""

    @classmethod
    def paths(cls, base: Path) -> list[Path]:  # pragma: no cover - never asked of this class
        """Not known without the format: ask the format's writer class."""
        raise NotImplementedError

    def __init__(
        self, base: Path, shard_cls: type[ShardWriter], reused: ReusedShard, *, first_id: int
    ) -> None:
        super().__init__(base)
        self.shard_cls = shard_cls
        self.file_bytes = reused.file_bytes
        if reused.renumber_from is None:
            self.how = "link" if shard_cls.link(reused.base, base) else "copy"
        else:
            shard_cls.clone(reused.base, base)
            offsets = reused.offsets.tolist()
            size = shard_cls.renumber(base, reused.renumber_from, first_id, offsets)
            self.file_bytes = reused.file_bytes if size is None else size
            self.how = "clone"
        self._offsets, self._late = shard_cls.shard_offsets(base, first_id, reused.offsets)

    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Refuse: a linked shard takes no new records."""
        raise TypeError(f"{self.base} is a reused shard; it takes no records")

    def write_batch(
        self, local: int, sample_id: int, batch: RecordBatch
    ) -> tuple[list[str], list[int | None]]:
        """Return the keys and offsets of the reused records `batch` (their bytes are there)."""
        keys = self.shard_cls.shard_keys(local, sample_id, len(batch))
        return keys, self._offsets[local - 1 : local - 1 + len(batch)]

    def close(self) -> int:
        """Return the shard's size on disk (nothing to flush)."""
        return self.file_bytes

    def record_offsets(self) -> np.ndarray | None:
        """Return the offsets known only once a shard of this format is written."""
        return self._late

    def abort(self) -> None:
        """Nothing to close."""

    def files(self) -> list[Path]:
        """Return the shard's files (or directory)."""
        return self.shard_cls.paths(self.base)


def link_part(
    tmp: Path,
    number: int,
    shard_cls: type[ShardWriter],
    reused: ReusedShard,
    *,
    first_id: int,
) -> dict[str, Any] | None:
    """Make planned shard `number` in `tmp` the reused shard `reused`; return its marker.

    The marker's ``reused`` says how: ``link`` (hard links), ``copy`` (the filesystem refused
    links) or ``clone`` (renumbered). None when a shard to renumber cannot be (a multi-part
    RecordIO record): nothing is left of it, and the caller writes its records instead.
    """
    clear_part(tmp, number, shard_cls)
    try:
        shard = LinkedShard(tmp / shard_name(number), shard_cls, reused, first_id=first_id)
    except PackerError:
        if reused.renumber_from is None:
            raise
        clear_part(tmp, number, shard_cls)
        return None
    part = ShardPart(tmp, number, shard_cls, first_id=first_id, shard=shard)
    part.marker["reused"] = shard.how
    part.add_batch(reused.records)
    return part.finish([])
