"""File names and version of a packed dataset directory (see DESIGN.md, "A packed dataset")."""

from __future__ import annotations

FORMAT_VERSION = 1
META_NAME = "meta.json"
INDEX_NAME = "index.jsonl"
INDEX_COLUMNAR_NAME = "index.parquet"
ERRORS_NAME = "errors.jsonl"

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


def shard_name(number: int) -> str:
    """The base name of shard `number`: ``shard-00000``."""
    return f"shard-{number:05d}"
