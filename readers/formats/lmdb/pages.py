"""LMDB 0.9's page header, and reading values straight from ``data.mdb``.

A value is read from a mapping of ``data.mdb`` at its index offset, checked first against the
page header (an overflow value) or its leaf page's node (a small value); this module also finds
where each value of a freshly written shard lies in the file.
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
    """Return the `nbytes` at `offset` of a mapped ``data.mdb``, or None.

    They are returned if an overflow value of that size starts there (its page header says
    so: a page of that number, flagged overflow, spanning the value). Large values (above
    about half a page: every image but the tiniest) live on overflow pages of their own, right
    after the page header.
    """
    if offset % page_size != PAGE_HEADER.size or offset + nbytes > len(mapped):
        return None
    number, _, flags, pages = PAGE_HEADER.unpack_from(mapped, offset - PAGE_HEADER.size)
    if number != offset // page_size or not flags & P_OVERFLOW:
        return None
    if pages * page_size < nbytes + PAGE_HEADER.size:
        return None
    return memoryview(mapped)[offset : offset + nbytes]


NODE_HEADER = struct.Struct("<HHHH")
"""``MDB_node``'s header: the value's size (low, high 16 bits), flags, the key's size."""
_POINTER = struct.Struct("<H")


def leaf_value(
    mapped: Any, offset: int, nbytes: int, page_size: int, key: bytes
) -> memoryview | None:
    """Return the `nbytes` at `offset` of a mapped ``data.mdb`` if they are `key`'s value, or None.

    A value of up to about half a page lives in a leaf page, right after its node's header and
    key. They are returned if the page there is a leaf page of that number whose node pointers
    name a node right before `offset` that holds `key` and a plain value of `nbytes`.
    """
    page, at = divmod(offset, page_size)
    base = page * page_size
    node = at - NODE_HEADER.size - len(key)
    if node < PAGE_HEADER.size or at + nbytes > page_size or base + page_size > len(mapped):
        return None
    number, _, flags, bounds = PAGE_HEADER.unpack_from(mapped, base)
    lower, upper = bounds & 0xFFFF, bounds >> 16
    if number != page or flags & (P_BRANCH | P_OVERFLOW | P_META) or not flags & P_LEAF:
        return None
    if not PAGE_HEADER.size <= lower <= upper <= node or lower % 2:
        return None
    low, high, node_flags, key_size = NODE_HEADER.unpack_from(mapped, base + node)
    if low | high << 16 != nbytes or node_flags or key_size != len(key):
        return None
    if mapped[base + node + NODE_HEADER.size : base + at] != key:
        return None
    pointers = bytes(mapped[base + PAGE_HEADER.size : base + lower])
    target = _POINTER.pack(node)
    found = pointers.find(target)
    while found > 0 and found % 2:  # a pointer starts at an even position
        found = pointers.find(target, found + 1)
    if found < 0:  # no pointer names the node: bytes left in free space
        return None
    return memoryview(mapped)[offset : offset + nbytes]


def buffer_address(value: Any) -> int:
    """The address of the first byte of a buffer, without reading it."""
    return int(np.frombuffer(value, np.uint8).ctypes.data) if len(value) else 0


def map_base(data_file: str, address: int) -> int:
    """Return the address at which this process maps byte 0 of `data_file`.

    It is taken from the mapping that holds `address` (from /proc/self/maps; the file may be
    mapped more than once).

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
