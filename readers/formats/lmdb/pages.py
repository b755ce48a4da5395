"""LMDB 0.9's page layout as far as readers rely on it: the page header, where a value lies in
``data.mdb``, and whether a value LMDB hands out lies inside the file and its page layout
before anything touches it.

LMDB maps ``data.mdb`` and gives out pointers into the mapping; it trusts the lengths and page
numbers stored in its pages. A damaged length makes a value run past the end of the file, and
touching it kills the process with SIGBUS, which no ``except`` catches. So a value's extent is
checked here against the file and against the page that must hold it: a value of more than
about half a page starts right after the header of its own overflow pages, a smaller one lies
inside its leaf page.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from readers.formats.lmdb.keys import DATA_FILE, image_key

PAGE_HEADER = struct.Struct("<QHHI")
"""LMDB 0.9's page header (``MDB_page``, 16 bytes): page number, pad, flags, and for an
overflow page the number of pages its value spans (for other pages: ``lower``, ``upper``)."""
P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_META = 0x08


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


def value_problem(mapped: Any, offset: int, nbytes: int, page_size: int) -> str | None:
    """Why the `nbytes` at `offset` of ``data.mdb`` (`mapped`: a bounds-checked mapping of the
    whole file) cannot be a value LMDB stored, or None when they can: they must lie inside
    the file, and either on overflow pages whose header spans them or inside one leaf page."""
    size = len(mapped)
    if offset < 0 or offset + nbytes > size:
        return (
            f"a value of {nbytes} bytes at offset {offset} lies outside data.mdb ({size} "
            "bytes): a damaged length or page number"
        )
    if overflow_value(mapped, offset, nbytes, page_size) is not None:
        return None
    page = offset // page_size
    if offset % page_size >= PAGE_HEADER.size and (offset + nbytes - 1) // page_size <= page:
        _, _, flags, _ = PAGE_HEADER.unpack_from(mapped, page * page_size)
        if flags & P_LEAF:
            return None
    return (
        f"a value of {nbytes} bytes at offset {offset} (page {page}) is neither on overflow "
        "pages that span it nor inside a leaf page: a damaged length or page number"
    )


def buffer_address(value: Any) -> int:
    """The address of the first byte of a buffer, without reading it."""
    return int(np.frombuffer(value, np.uint8).ctypes.data) if len(value) else 0


def map_base(data_file: str, address: int) -> int:
    """The address at which this process maps byte 0 of `data_file`, in the mapping that holds
    `address` (from /proc/self/maps; the file may be mapped more than once).

    Raises:
        OSError: no mapping of `data_file` holds `address`, or /proc is not there.
    """
    st = os.stat(data_file)
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 5 or fields[4] != str(st.st_ino):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            if start <= address < end and os.makedev(major, minor) == st.st_dev:
                return start - int(fields[2], 16)
    raise OSError(f"{data_file} is not mapped by this process at {address:#x}")


def value_offsets(path: str, count: int) -> np.ndarray | None:
    """The file offset of the image of each record 1..count of the shard at `path`.

    LMDB does not say where a value lives, but a value read with ``buffers=True`` is a view
    into the map, so its address minus the map's base is its offset in ``data.mdb``.  Read
    right after the shard is written, from the page cache.  None where /proc is not there.
    """
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True, create=False)
    try:
        addresses = np.empty(count, dtype=np.int64)
        base: int | None = None
        with env.begin(buffers=True) as txn:
            for local in range(1, count + 1):
                value = txn.get(image_key(local))
                if value is None:
                    return None
                addresses[local - 1] = address = buffer_address(value)
                if base is None and len(value):
                    base = map_base(os.path.join(path, DATA_FILE), address)
        return None if base is None else addresses - base
    except OSError:
        return None
    finally:
        env.close()
