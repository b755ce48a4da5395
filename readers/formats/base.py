"""What generic code may ask of a registered shard format; one subclass per format.

A format object knows its byte layout's files, how to recognise a bare (not packed) copy of
the format, how to open a shard for reading, and which dataset class reads it. Generic code
(``open_dataset``, ``load_index``, ``packer verify``, the CLI) asks the object instead of
testing the format's name. Nothing here imports paddle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StoredProblem:
    """Why a record, or a part of a bare input that is no record, is not converted.

    Attributes:
        reason: a stable reason code, as ``errors.jsonl`` holds it (``bad_label``, ``no_label``,
            ``extra_member``, ``damaged``, ``truncated``, ``empty``, ``broken_link``, ...).
        message: what was found, for a person.
        path: what it names (in `StoredRecords.problems`; a record's problem is named by the
            record's name).
    """

    reason: str
    message: str
    path: str = ""


StoredItem = tuple[bytes, Any] | str | StoredProblem
"""One record as stored: ``(bytes, label)``, or why it cannot be converted (a message: the
record is unreadable; a `StoredProblem`: for another reason)."""


@dataclass(frozen=True)
class StatedSize:
    """The width and height a bare input states for a record, beside its image bytes.

    Attributes:
        shown: how the input states it, for messages (``wh-000000002 is '30_25'``).
        size: ``(width, height)``, or None when the stated value does not parse.
    """

    shown: str
    size: tuple[int, int] | None


@dataclass
class StoredRecords:
    """The records of a bare copy of a format, read as stored (nothing is decoded).

    Attributes:
        files: the files they are read from (what identifies the copy).
        names: per record, the name it is known by (a key, a tar member).
        sizes: per record, the stored bytes (0 for one that holds no image).
        read: ``read(start, stop)`` yields records ``start..stop-1``, one `StoredItem` each.
        label_source: how the labels were found (for meta.json).
        problems: what of the input is not among the records and is not converted (a damaged
            stretch of a file, a member beside a sample's image), found when it was opened.
        stated_sizes: None, or ``stated_sizes(start, stop)`` yields, per record, the size
            the input states without decoding (an LMDB's ``wh-%09d``), as a `StatedSize`, or
            None where it states none.
    """

    files: list[Path]
    names: list[str]
    sizes: list[int]
    read: Callable[[int, int], Iterator[StoredItem]]
    label_source: str = "none"
    problems: list[StoredProblem] = field(default_factory=list)
    stated_sizes: Callable[[int, int], Iterator[StatedSize | None]] | None = None


class ShardFormat:
    """One on-disk shard format, as registered in ``readers.formats.REGISTRY``.

    Subclasses set the class attributes and implement the methods that raise
    ``NotImplementedError``.
    """

    name: str = ""
    """The registry key and the ``format`` field of meta.json."""
    title: str = ""
    """How messages name the format."""
    summary: str = ""
    """One line for ``--format`` help: what the shards are and who else reads them."""
    bare_hint: str = ""
    """How messages describe a bare copy of the format that can be opened without meta.json."""
    dataset: str = ""
    """``module:Class`` of the paddle Dataset, imported only when asked for (keeps paddle out)."""
    offsets_locate_records: bool = False
    """True: the index ``offset`` is where each record starts, and reading needs it. False: it
    is where the stored bytes lie in a shard file, a page-cache hint kept only when known for
    every sample."""

    def shard_path(self, root: Path, shard: str) -> str:
        """The path a dataset opens for shard `shard` (a name from meta.json) of `root`."""
        raise NotImplementedError

    def shard_files(self, shard: str) -> tuple[str, ...]:
        """The files of shard `shard`, relative to the dataset directory."""
        raise NotImplementedError

    def data_file(self, shard_path: str) -> str:
        """The file that holds the stored bytes of the shard opened at `shard_path`."""
        return shard_path

    def open_shard(self, path: str) -> Any:
        """The process's shared read-only handle of the shard at `path` (see readers.handles)."""
        raise NotImplementedError

    def find_bare(self, path: Path) -> Any | None:
        """Return what `path` names when it is a bare copy of this format, else None.

        The result is what to pass to the dataset or to ``packer verify``. A packed dataset
        directory is never bare.
        """
        raise NotImplementedError

    def stored_records(self, found: Any) -> StoredRecords:
        """The records of the bare copy that `find_bare` found, as stored (for conversion)."""
        raise NotImplementedError

    def read_stored(
        self, shard_path: str, positions: Sequence[int], offsets: Sequence[int]
    ) -> Iterator[bytes]:
        """The stored bytes of records `positions` of the packed shard at `shard_path`.

        `positions` count from 0 within the shard, ascending; the bytes come in that order.
        `offsets` are the records' index ``offset`` fields.
        """
        raise NotImplementedError

    def near_miss(self, path: Path) -> str | None:
        """Why `path` is almost, but not quite, a bare copy of this format (for messages)."""
        del path
        return None

    def index_offsets(self, offset: np.ndarray, count: int) -> np.ndarray | None:
        """The index's ``offset`` column as readers keep it (-1 marks an unknown offset)."""
        if self.offsets_locate_records:
            return offset
        if len(offset) != count or (offset < 0).any():
            return None
        if len(offset) and int(offset.max()) < 2**32:
            return offset.astype(np.uint32)
        return offset

    def dataset_class(self) -> Any:
        """The paddle Dataset class of this format (imports paddle)."""
        module, _, name = self.dataset.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def dataset_name(self) -> str:
        """The dataset class's name, for messages, without importing it."""
        return self.dataset.partition(":")[2]

    def __repr__(self) -> str:
        return f"<shard format {self.name}>"
