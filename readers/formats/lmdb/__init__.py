"""The LMDB shard format: key layout, how a shard is opened and a bare LMDB recognised.

The key layout is PaddleOCR's (``num-samples``, ``image-%09d``, ``label-%09d``, ``wh-%09d`` from
1); shards are opened for reading.

The byte layout lives in ``keys`` (keys, file names, stored labels), ``pages`` (LMDB 0.9's page
header, reading a value at its offset, where values lie) and ``tree`` (meta pages, and
bounds-checked checks of every page a lookup can touch: the whole tree for ``packer verify``,
one lookup's path for readers); ``env`` opens a shard. This package imports no paddle and no packer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from readers.formats.base import ShardFormat, StoredRecords
from readers.formats.layout import META_NAME
from readers.formats.lmdb.env import open_lmdb_readonly, shared_lmdb
from readers.formats.lmdb.keys import (
    DATA_FILE,
    LOCK_FILE,
    NUM_SAMPLES_KEY,
    WH_PREFIX,
    encode_label,
    encode_wh,
    image_key,
    label_key,
    parse_wh,
    wh_key,
)
from readers.formats.lmdb.pages import (
    P_OVERFLOW,
    PAGE_HEADER,
    buffer_address,
    leaf_value,
    map_base,
    overflow_value,
    value_offsets,
)
from readers.formats.lmdb.tree import LookupGuard, MetaPage, check_tree, read_meta

__all__ = [
    "DATA_FILE",
    "FORMAT",
    "LOCK_FILE",
    "NUM_SAMPLES_KEY",
    "PAGE_HEADER",
    "P_OVERFLOW",
    "WH_PREFIX",
    "LmdbFormat",
    "LookupGuard",
    "MetaPage",
    "buffer_address",
    "check_tree",
    "encode_label",
    "encode_wh",
    "image_key",
    "label_key",
    "leaf_value",
    "map_base",
    "open_lmdb_readonly",
    "overflow_value",
    "parse_wh",
    "read_meta",
    "shared_lmdb",
    "value_offsets",
    "wh_key",
]


class LmdbFormat(ShardFormat):
    """LMDB shards: one environment directory per shard."""

    name = "lmdb"
    title = "LMDB"
    summary = "PaddleOCR key layout, one LMDB environment per shard"
    bare_hint = f"an LMDB ({DATA_FILE})"
    dataset = "readers.datasets.lmdb:LmdbDataset"

    def shard_path(self, root: Path, shard: str) -> str:
        """Return the path of the environment directory of `shard` under `root`."""
        return str(root / shard)

    def shard_files(self, shard: str) -> tuple[str, ...]:
        """Return the files of `shard`, relative to the dataset: its ``data.mdb``."""
        return (f"{shard}/{DATA_FILE}",)

    def data_file(self, shard_path: str) -> str:
        """Return the path of the data file of the shard at `shard_path`."""
        return os.path.join(shard_path, DATA_FILE)

    def open_shard(self, path: str) -> Any:
        """Return the shared read-only LMDB environment of the shard at `path`."""
        return shared_lmdb(path)

    def stored_records(self, found: Path) -> StoredRecords:
        """Return the records of the bare LMDB `found`, as stored."""
        from readers.formats.lmdb.stored import bare_records

        return bare_records(found)

    def read_stored(
        self, shard_path: str, positions: Sequence[int], offsets: Sequence[int]
    ) -> Iterator[bytes]:
        """Return the values of records `positions` of the packed shard at `shard_path`."""
        from readers.formats.lmdb.stored import read_stored

        return read_stored(shard_path, [p + 1 for p in positions])

    def find_bare(self, path: Path) -> Path | None:
        """Return `path` when it is a bare LMDB directory (a data file, no meta.json), else None."""
        if path.is_dir() and not (path / META_NAME).exists() and (path / DATA_FILE).exists():
            return path
        return None


FORMAT = LmdbFormat()
