"""The two values a build passes along: an :class:`Entry` and a :class:`Record`.

An entry is a file to pack and its label (from the label sources); a record is its bytes ready
for a shard writer (from encode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packer.problems import Note
from packer.scan import SourceFile


@dataclass(frozen=True)
class Entry:
    """One file to pack with its label (JSON-able: int, str, list, dict, or None).

    An entry without a label where one is required is still read, so that a file which is
    not an image is reported as such; one that is an image is then reported as ``no_label``
    (``note`` says why it has none).
    """

    file: SourceFile
    label: Any
    labelled: bool = True
    note: str = ""


@dataclass(frozen=True)
class Record:
    """An image ready for a shard writer."""

    rel: str
    label: Any
    data: bytes
    format: str
    width: int
    height: int
    channels: int
    crc32: int
    notes: tuple[Note, ...] = ()  # packed with a caveat: one warnings.jsonl line each
    compression: str | None = None  # of raw pixels (lz4, zstd): the index's compression
