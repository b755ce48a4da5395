"""The LMDB shard format: PaddleOCR's key layout (``num-samples``, ``image-%09d``,
``label-%09d`` from 1), how a shard is opened for reading, and how a bare LMDB is recognised."""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from readers import handles
from readers.errors import DatasetFormatError
from readers.formats.base import ShardFormat
from readers.formats.layout import META_NAME

NUM_SAMPLES_KEY = b"num-samples"
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"


def image_key(local: int) -> bytes:
    """The key of the image of the `local`-th record (1-based) of a shard."""
    return b"image-%09d" % local


def label_key(local: int) -> bytes:
    """The key of the label of the `local`-th record (1-based) of a shard."""
    return b"label-%09d" % local


def encode_label(label: Any) -> bytes:
    """A label as stored in LMDB: a class id as its decimal string, text as itself, anything
    structured as compact JSON, and ``None`` as the empty string."""
    if label is None:
        return b""
    if isinstance(label, bool):
        return json.dumps(label).encode()
    if isinstance(label, int):
        return str(label).encode()
    if isinstance(label, str):
        return label.encode("utf-8")
    return json.dumps(label, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def open_lmdb_readonly(path: str) -> Any:
    """Open an LMDB environment for reading only: no lock file, no write access needed.

    LMDB maps the file and reads pages straight from the mapping, so a ``data.mdb`` cut short
    (an interrupted copy, a full disk) would kill the process with SIGBUS at the first read
    past its end.  The file's size is therefore checked against the last page the
    environment uses before the environment is handed out.

    Raises:
        DatasetFormatError: not an LMDB, or its data file is shorter than its pages.
    """
    import lmdb

    from readers.files import check_regular  # here: readers.files imports readers.formats

    data = os.path.join(path, DATA_FILE)
    with contextlib.suppress(FileNotFoundError):  # missing: lmdb.open says so
        check_regular(data)  # py-lmdb would block forever opening a FIFO
    try:
        env = lmdb.open(
            path,
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=2048,
            subdir=True,
            create=False,
        )
    except lmdb.Error as exc:
        raise DatasetFormatError(f"{data}: cannot open as an LMDB ({exc})") from exc
    try:
        page = int(env.stat()["psize"])
        last = int(env.info()["last_pgno"])
        size = os.path.getsize(data)
    except (lmdb.Error, OSError) as exc:
        env.close()
        raise DatasetFormatError(f"{data}: cannot read the LMDB header ({exc})") from exc
    needed = (last + 1) * page
    if size < needed:
        env.close()
        raise DatasetFormatError(
            f"{data}: {size} bytes, but its last page (number {last}, {page}-byte pages) ends at "
            f"byte {needed}: the file is cut short (an interrupted copy or a full disk?)"
        )
    return env


PAGE_HEADER = struct.Struct("<QHHI")
"""LMDB 0.9's page header (``MDB_page``, 16 bytes): page number, pad, flags, and for an
overflow page the number of pages its value spans."""
P_OVERFLOW = 0x04


def overflow_value(mapped: Any, offset: int, nbytes: int, page_size: int) -> memoryview | None:
    """The `nbytes` at `offset` of a mapped ``data.mdb``, if an overflow value of that size
    starts there (its page header says so: a page of that number, flagged overflow, spanning
    the value); else None. Large values (above about half a page: every image but the
    tiniest) live on overflow pages of their own, right after the page header."""
    if offset % page_size != PAGE_HEADER.size or offset + nbytes > len(mapped):
        return None
    number, _, flags, pages = PAGE_HEADER.unpack_from(mapped, offset - PAGE_HEADER.size)
    if number != offset // page_size or not flags & P_OVERFLOW:
        return None
    if pages * page_size < nbytes + PAGE_HEADER.size:
        return None
    return memoryview(mapped)[offset : offset + nbytes]


def shared_lmdb(path: str) -> Any:
    """The process's read-only LMDB environment for the shard directory `path`."""
    return handles.shared_handle("lmdb", path, open_lmdb_readonly)


class LmdbFormat(ShardFormat):
    """LMDB shards: one environment directory per shard."""

    name = "lmdb"
    title = "LMDB"
    summary = "PaddleOCR key layout, one LMDB environment per shard"
    bare_hint = f"an LMDB ({DATA_FILE})"
    dataset = "readers.datasets.lmdb:LmdbDataset"

    def shard_path(self, root: Path, shard: str) -> str:
        return str(root / shard)

    def shard_files(self, shard: str) -> tuple[str, ...]:
        return (f"{shard}/{DATA_FILE}",)

    def data_file(self, shard_path: str) -> str:
        return os.path.join(shard_path, DATA_FILE)

    def open_shard(self, path: str) -> Any:
        return shared_lmdb(path)

    def find_bare(self, path: Path) -> Path | None:
        if path.is_dir() and not (path / META_NAME).exists() and (path / DATA_FILE).exists():
            return path
        return None


FORMAT = LmdbFormat()
