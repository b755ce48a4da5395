"""File names and version of a packed dataset directory (see DESIGN.md, "A packed dataset")."""

from __future__ import annotations

import re

FORMAT_VERSION = 1
META_NAME = "meta.json"
INDEX_NAME = "index.jsonl"
INDEX_COLUMNAR_NAME = "index.parquet"
ERRORS_NAME = "errors.jsonl"
WARNINGS_NAME = "warnings.jsonl"
"""Inputs packed with a caveat (see ``packer.problems.Note``), one JSON object per line."""
SHARD_PREFIX = "shard-"

# The order of the fields of one index.jsonl line; fields a format does not use are omitted.
INDEX_FIELDS = (
    "id",
    "path",
    "label",
    "shard",
    "key",
    "offset",
    "nbytes",
    "width",
    "height",
    "channels",
    "format",
    "crc32",
)


_SHARD_NAME = re.compile(re.escape(SHARD_PREFIX) + r"([0-9]{5,})(?:\.|$)")


def shard_name(number: int) -> str:
    """The base name of shard `number`: ``shard-00000``."""
    return f"{SHARD_PREFIX}{number:05d}"


def parse_shard_name(name: str) -> int | None:
    """Return the shard number of a file or directory name that `shard_name` begins.

    For ``shard-00012``, ``shard-00012.rec`` or ``shard-00012.done.json`` it is 12; None for
    any other name.
    """
    found = _SHARD_NAME.match(name)
    return None if found is None else int(found.group(1))
