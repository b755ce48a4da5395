"""What a shard format's writer implements: `ShardWriter`, one shard's bytes.

The format-independent rest is `packer.writers.part` (`ShardPart` drives a writer for a
planned shard and keeps its index rows, problems and completion marker beside it) and
`packer.writers.merge` (numbers the samples and writes ``index.jsonl`` and
``index.parquet``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np

from packer.problems import Problem
from packer.records import Record
from packer.writers.batch import RecordBatch


class ShardWriter(ABC):
    """Writes the records of one shard; subclasses define the byte layout."""

    format: ClassVar[str]
    # True when record offsets are known only once the shard is closed (LMDB): the dataset
    # writer then holds the shard's index.parquet rows until record_offsets() can fill them.
    late_offsets: ClassVar[bool] = False

    def __init__(self, base: Path) -> None:
        """`base` is the shard's path without suffix, e.g. ``OUT/shard-00000``."""
        self.base = base

    @abstractmethod
    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Store the `local`-th record (1-based) of the shard; return its (key, offset)."""

    @abstractmethod
    def close(self) -> int:
        """Flush, fsync and close the shard; return its size in bytes on disk."""

    @abstractmethod
    def abort(self) -> None:
        """Close without finishing (the build failed); the files are removed by the caller."""

    @abstractmethod
    def files(self) -> list[Path]:
        """The files this shard consists of."""

    def write_batch(
        self, local: int, sample_id: int, batch: RecordBatch
    ) -> tuple[list[str], list[int | None]]:
        """Store the records of `batch` as records `local`, `local + 1`, ... of the shard.

        Their sample ids are `sample_id`, `sample_id + 1`, ...; return their keys and offsets.
        The files must end up exactly as `write` of each record in turn leaves them; this
        default does just that, and formats override it with a faster way to the same bytes.
        """
        keys: list[str] = []
        offsets: list[int | None] = []
        for i in range(len(batch)):
            key, offset = self.write(local + i, sample_id + i, batch.record(i))
            keys.append(key)
            offsets.append(offset)
        return keys, offsets

    def record_offsets(self) -> np.ndarray | None:
        """After close(): each record's byte offset in its file, when only then known."""
        return None

    # --- per-format behaviour that the build asks the writer class about ---

    # True when an index key is the global sample id (it changes when a shard is renumbered);
    # False when keys count within the shard.
    global_keys: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def paths(cls, base: Path) -> list[Path]:
        """The files or directories a shard at `base` consists of (to clear before a rewrite)."""

    @classmethod
    def check(cls, record: Record) -> Problem | None:
        """A problem when `record` cannot be stored in this format, else None."""
        return None

    @classmethod
    def check_batch(cls, batch: RecordBatch) -> list[tuple[int, Problem]]:
        """The records of `batch` that `check` finds a problem with: (position, problem)."""
        if cls.check.__func__ is ShardWriter.check.__func__:  # type: ignore[attr-defined]
            return []  # the format takes every record
        found = []
        for i in range(len(batch)):
            problem = cls.check(batch.record(i))
            if problem is not None:
                found.append((i, problem))
        return found

    @classmethod
    def renumber(
        cls, base: Path, old_first: int, new_first: int, offsets: list[int | None]
    ) -> int | None:
        """Renumber the finished shard at `base`; return its new size or None.

        Give the finished shard at `base`, written with sample ids from `old_first`, the ids
        from `new_first` (`offsets`: where each record starts, as its writer returned them);
        return its new size in bytes, or None when it did not change.

        The default suits formats whose files hold no global ids: nothing to do.
        """
        return None

    # --- a finished shard of another dataset reused whole (packer merge, split) ---

    reusable: ClassVar[bool] = False
    """True when the format implements `shard_keys` and `shard_offsets`."""

    @classmethod
    def link(cls, source: Path, base: Path) -> bool:
        """Put the finished shard at `source` (its base path) at `base` without copying it.

        Its files become hard links of the source's (the same inodes: nothing may write them
        in place afterwards); where the filesystem refuses (another filesystem: EXDEV), they
        are copied. Returns True when every file was linked.
        """
        from packer.swap import link_entry

        linked = True
        for src, dst in zip(cls.paths(source), cls.paths(base), strict=True):
            linked = link_entry(src, dst) and linked
        return linked

    @classmethod
    def clone(cls, source: Path, base: Path) -> None:
        """Copy the finished shard at `source` to `base` as files of its own.

        A reflink where the filesystem shares blocks (btrfs, xfs: no bytes copied until one
        side is written), else a copy in the kernel.
        """
        for src, dst in zip(cls.paths(source), cls.paths(base), strict=True):
            clone_entry(src, dst)

    @classmethod
    def shard_keys(cls, local: int, sample_id: int, count: int) -> list[str]:
        """The index keys of records `local`.. (ids `sample_id`..) of a shard, as written."""
        raise NotImplementedError

    @classmethod
    def shard_offsets(
        cls, base: Path, first_id: int, offsets: np.ndarray
    ) -> tuple[list[int | None], np.ndarray | None]:
        """The offsets of the records of the finished shard at `base`, reused whole.

        `offsets` are their ``offset`` column in the index of the dataset the shard comes
        from (-1 where unknown). Returns them as `write` returns them and as `record_offsets`
        gives them after `close` (None: as the first).

        Raises:
            ValueError: the shard's files disagree with `offsets` or with ids from `first_id`.
        """
        raise NotImplementedError

    @classmethod
    def describe(cls) -> dict[str, str]:
        """What meta.json records under ``writer``: the library or layout that wrote it."""
        return {}


_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def clone_entry(src: Path, dst: Path) -> None:
    """Copy the file `src` (or each file of the directory `src`) to `dst`.

    A reflink where the filesystem can make one, else an ordinary copy (``shutil.copyfile``,
    in the kernel).
    """
    if src.is_dir():
        dst.mkdir()
        for child in sorted(src.iterdir()):
            clone_entry(child, dst / child.name)
        return
    import fcntl
    import shutil

    with open(src, "rb") as f, open(dst, "xb") as g:
        try:
            fcntl.ioctl(g.fileno(), _FICLONE, f.fileno())
            return
        except OSError:
            pass  # not a filesystem that shares blocks (or another one): copy
    shutil.copyfile(src, dst)
