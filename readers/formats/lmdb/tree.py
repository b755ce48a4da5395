"""A bounds-checked walk over every page of ``data.mdb`` that a main-database lookup can touch.

These are the meta pages, the B-tree's branch and leaf pages, and the first page of each
overflow value. What the walk finds is what would otherwise make LMDB read outside the file
(SIGBUS) or fail with a raw error, so ``packer verify`` walks a shard before it opens it with
LMDB.

LMDB 0.9's layout (``mdb.c``): pages of ``psize`` bytes; pages 0 and 1 are meta pages (the one
with the higher transaction id is current); each page starts with ``MDB_page`` (`PAGE_HEADER`);
branch and leaf pages hold ``uint16`` node offsets after the header, and their nodes lie between
``upper`` and the page's end; a node is ``MDB_node`` (`NODE`), then the key, then in a leaf the
value or, flagged ``F_BIGDATA``, the page number of the value's overflow pages.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.formats.lmdb.pages import P_BRANCH, P_LEAF, P_META, P_OVERFLOW, PAGE_HEADER

META = struct.Struct("<IIQQ")
"""``MDB_meta`` up to its databases: magic, version, fixed-map address, map size."""
DB = struct.Struct("<IHHQQQQQ")
"""``MDB_db``: pad (the page size, in the free database's), flags, depth, branch, leaf and
overflow page counts, entries, root page."""
TAIL = struct.Struct("<QQ")
"""After the two ``MDB_db``: the last page number and the transaction id."""
NODE = struct.Struct("<HHHH")
"""``MDB_node``: low and high 16 bits of the value size (a branch: of the child page number,
whose bits 32-47 are in the flags), flags, key size."""
MAGIC = 0xBEEFC0DE
VERSION = 1
P_INVALID = (1 << 64) - 1
F_BIGDATA = 0x01
_POINTER = struct.Struct("<H")
_PAGE_NUMBER = struct.Struct("<Q")
_DBS = PAGE_HEADER.size + META.size
_TAIL = _DBS + 2 * DB.size
MAX_PROBLEMS = 20
"""Problems a walk reports before it stops."""


class _Stop(Exception):
    """Enough problems were found."""


@dataclass(frozen=True)
class MetaPage:
    """The current meta page: what a reader of the environment starts from."""

    page_size: int
    last_page: int
    txnid: int
    root: int
    depth: int
    entries: int


def read_meta(buf: Any) -> MetaPage:
    """The current meta page of the ``data.mdb`` contents `buf` (bounds-checked).

    Raises:
        ValueError: neither meta page is valid, or the file is shorter than its pages.
    """
    size = len(buf)
    if size < _TAIL + TAIL.size:
        raise ValueError(f"{size} bytes, too short for an LMDB meta page")
    page_size = DB.unpack_from(buf, _DBS)[0]
    if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
        raise ValueError(f"meta page 0 gives a page size of {page_size}, not a power of 2")
    found: list[MetaPage] = []
    why: list[str] = []
    for number in (0, 1):
        at = number * page_size
        if at + _TAIL + TAIL.size > size:
            why.append(f"meta page {number} lies past the end ({size} bytes)")
            continue
        _, _, flags, _ = PAGE_HEADER.unpack_from(buf, at)
        magic, version, _, _ = META.unpack_from(buf, at + PAGE_HEADER.size)
        if not flags & P_META or magic != MAGIC or version != VERSION:
            why.append(
                f"page {number} is no LMDB 0.9 meta page (flags {flags:#x}, magic {magic:#x}, "
                f"version {version})"
            )
            continue
        main = DB.unpack_from(buf, at + _DBS + DB.size)
        last, txnid = TAIL.unpack_from(buf, at + _TAIL)
        found.append(MetaPage(page_size, last, txnid, main[7], main[2], main[6]))
    if not found:
        raise ValueError("; ".join(why))
    meta = max(found, key=lambda m: m.txnid)
    needed = (meta.last_page + 1) * page_size
    if meta.last_page < 1 or size < needed:
        raise ValueError(
            f"{size} bytes, but its last page (number {meta.last_page}, {page_size}-byte pages) "
            f"ends at byte {needed}: the file is cut short"
        )
    return meta


class _Walk:
    def __init__(self, buf: Any, meta: MetaPage) -> None:
        self.buf = buf
        self.meta = meta
        self.problems: list[str] = []
        self.used = bytearray(meta.last_page + 1)  # 1: a page the walk has met

    def report(self, line: str) -> None:
        self.problems.append(line)
        if len(self.problems) >= MAX_PROBLEMS:
            self.problems.append(f"(stopped after {MAX_PROBLEMS} problems)")
            raise _Stop

    def claim(self, page: int, what: str) -> bool:
        """Mark `page` as used; False (reported) when it is outside the file or used twice."""
        if not 2 <= page <= self.meta.last_page:
            self.report(f"{what} names page {page}, outside pages 2..{self.meta.last_page}")
            return False
        if self.used[page]:
            self.report(f"{what} names page {page}, which another node uses too")
            return False
        self.used[page] = 1
        return True

    def run(self) -> None:
        if self.meta.root == P_INVALID:
            return
        if not self.claim(self.meta.root, "the meta page's root"):
            return
        pages = [(self.meta.root, 1)]
        while pages:
            page, level = pages.pop()
            pages += self.page(page, level)

    def page(self, page: int, level: int) -> list[tuple[int, int]]:
        """Check one branch or leaf page; the child pages to check next."""
        psize = self.meta.page_size
        base = page * psize
        number, _, flags, lower, upper = struct.unpack_from("<QHHHH", self.buf, base)
        where = f"page {page}"
        if number != page:
            self.report(f"{where}: its header says page {number}")
            return []
        leaf = bool(flags & P_LEAF)
        if leaf == bool(flags & P_BRANCH) or flags & (P_OVERFLOW | P_META):
            self.report(f"{where}: flags {flags:#x}, expected a branch or a leaf page")
            return []
        if leaf != (level == self.meta.depth):
            self.report(
                f"{where}: a {'leaf' if leaf else 'branch'} page at level {level} of a "
                f"tree {self.meta.depth} deep"
            )
            return []
        if not PAGE_HEADER.size <= lower <= upper <= psize or lower % 2:
            self.report(f"{where}: free space {lower}..{upper} does not fit a {psize}-byte page")
            return []
        children: list[tuple[int, int]] = []
        for k in range((lower - PAGE_HEADER.size) // 2):
            at = _POINTER.unpack_from(self.buf, base + PAGE_HEADER.size + 2 * k)[0]
            if not upper <= at <= psize - NODE.size:
                self.report(f"{where} node {k}: at {at}, outside the nodes ({upper}..{psize})")
                continue
            lo, hi, nflags, ksize = NODE.unpack_from(self.buf, base + at)
            data = at + NODE.size + ksize
            if leaf:
                self.value(f"{where} node {k}", base, data, lo | hi << 16, nflags)
            elif data > psize:
                self.report(f"{where} node {k}: a {ksize}-byte key runs past the page")
            elif self.claim(lo | hi << 16 | nflags << 32, f"{where} node {k}"):
                children.append((lo | hi << 16 | nflags << 32, level + 1))
        return children

    def value(self, where: str, base: int, data: int, size: int, flags: int) -> None:
        psize = self.meta.page_size
        if not flags & F_BIGDATA:
            if data + size > psize:
                self.report(f"{where}: a {size}-byte value runs past its leaf page")
            return
        if data + _PAGE_NUMBER.size > psize:
            self.report(f"{where}: its overflow page number runs past the page")
            return
        first = _PAGE_NUMBER.unpack_from(self.buf, base + data)[0]
        if not self.claim(first, where):
            return
        number, _, oflags, pages = PAGE_HEADER.unpack_from(self.buf, first * psize)
        if number != first or not oflags & P_OVERFLOW:
            self.report(f"{where}: page {first} is not the overflow page of its value")
        elif not 1 <= pages <= self.meta.last_page - first + 1:
            self.report(
                f"{where}: overflow page {first} spans {pages} pages, past the last page "
                f"({self.meta.last_page})"
            )
        elif size + PAGE_HEADER.size > pages * psize:
            self.report(
                f"{where}: a {size}-byte value does not fit its {pages} overflow page(s) at "
                f"page {first}"
            )


def check_tree(data_file: str) -> list[str]:
    """Return the problems of the LMDB ``data.mdb`` at `data_file` that a lookup could run into.

    The list is empty when there are none. Problems are bad meta pages, a file shorter than its
    pages, branch or leaf pages whose header, node offsets, key or value sizes or child page
    numbers do not fit, and overflow values whose first page is not theirs or does not hold
    them.

    Raises:
        OSError: the file cannot be read.
    """
    with open(data_file, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return ["0 bytes, too short for an LMDB meta page"]
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                meta = read_meta(buf)
            except ValueError as exc:
                return [str(exc)]
            walk = _Walk(buf, meta)
            with contextlib.suppress(_Stop):  # enough found: the list says it stopped
                walk.run()
            return walk.problems


class LookupGuard:
    """Checks, before LMDB looks a key up, every page the lookup will touch.

    py-lmdb's ``Transaction.get`` touches one byte of every 4 KiB of the value it found before
    it returns (``preload``, even with ``buffers=True``), so a value whose length or page number
    is damaged kills the process inside ``get``: nothing can be checked after it. This guard
    descends the B-tree itself, as LMDB does (keys compared bytewise), with bounds-checked reads
    of a mapping of the file: each branch and leaf page on the way is checked once (header, node
    offsets, key and value sizes, child page numbers), then the found value's extent.

    Args:
        mapped: a bounds-checked mapping of the whole ``data.mdb`` (``handles.shared_mmap``).

    Raises:
        ValueError: the meta pages are damaged or the file is shorter than its pages.
    """

    def __init__(self, mapped: Any) -> None:
        self.buf = mapped
        self.meta = read_meta(mapped)
        self._checked: set[int] = set()

    def problem(self, key: bytes) -> str | None:
        """Say why looking `key` up would touch bytes outside the file or its page layout.

        None when the lookup is safe (the key need not exist).
        """
        meta = self.meta
        page = meta.root
        if page == P_INVALID:
            return None
        for level in range(1, meta.depth + 1):
            found = self._page(page, level)
            if isinstance(found, str):
                return found
            base, count, leaf = found
            if leaf:
                return self._leaf_value(page, base, count, key)
            page = self._child(base, count, key)
            if not 2 <= page <= meta.last_page:
                return f"a branch node names page {page}, outside pages 2..{meta.last_page}"
        return f"no leaf page {meta.depth} levels down from the root (page {meta.root})"

    def _page(self, page: int, level: int) -> tuple[int, int, bool] | str:
        """Return ``(file offset, node count, is a leaf)`` of a branch or leaf page.

        That is when the page's layout fits; else the problem is returned.
        """
        psize = self.meta.page_size
        base = page * psize
        number, _, flags, lower, upper = struct.unpack_from("<QHHHH", self.buf, base)
        count = (lower - PAGE_HEADER.size) // 2
        leaf = bool(flags & P_LEAF)
        if page in self._checked:
            return base, count, leaf
        if number != page:
            return f"page {page}: its header says page {number}"
        if leaf == bool(flags & P_BRANCH) or flags & (P_OVERFLOW | P_META):
            return f"page {page}: flags {flags:#x}, expected a branch or a leaf page"
        if leaf != (level == self.meta.depth):
            return f"page {page}: a {'leaf' if leaf else 'branch'} page at level {level}"
        if not PAGE_HEADER.size <= lower <= upper <= psize or lower % 2 or count < 1:
            return f"page {page}: free space {lower}..{upper} does not fit a {psize}-byte page"
        raw = np.frombuffer(self.buf, np.uint8, count=psize, offset=base)
        at = np.frombuffer(self.buf, "<u2", count=count, offset=base + PAGE_HEADER.size)
        at = at.astype(np.int64)
        if ((at < upper) | (at > psize - NODE.size)).any():
            return f"page {page}: a node offset lies outside its nodes ({upper}..{psize})"
        ksize = raw[at + 6].astype(np.int64) | raw[at + 7].astype(np.int64) << 8
        end = at + NODE.size + ksize
        if leaf:
            nflags = raw[at + 4].astype(np.int64) | raw[at + 5].astype(np.int64) << 8
            size = (raw[at].astype(np.int64) | raw[at + 1].astype(np.int64) << 8) | (
                raw[at + 2].astype(np.int64) | raw[at + 3].astype(np.int64) << 8
            ) << 16
            end = end + np.where(nflags & F_BIGDATA, _PAGE_NUMBER.size, size)
        if (end > psize).any():
            return f"page {page}: a node's key or value runs past the page"
        self._checked.add(page)
        return base, count, leaf

    def _node(self, base: int, k: int) -> tuple[int, int, int, bytes]:
        """``(offset, low 32 bits, flags, key)`` of node `k` of a checked page."""
        at = base + _POINTER.unpack_from(self.buf, base + PAGE_HEADER.size + 2 * k)[0]
        lo, hi, flags, ksize = NODE.unpack_from(self.buf, at)
        return at, lo | hi << 16, flags, bytes(self.buf[at + NODE.size : at + NODE.size + ksize])

    def _child(self, base: int, count: int, key: bytes) -> int:
        """Return the child page of a branch page that may hold `key`.

        It is the last node whose key is not above it (node 0's key counts as below every key).
        """
        lo, hi = 1, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self._node(base, mid)[3] <= key:
                lo = mid + 1
            else:
                hi = mid
        _, low, flags, _ = self._node(base, lo - 1)
        return low | flags << 32

    def _leaf_value(self, page: int, base: int, count: int, key: bytes) -> str | None:
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            at, size, flags, found = self._node(base, mid)
            if found == key:
                break
            if found < key:
                lo = mid + 1
            else:
                hi = mid
        else:
            return None  # not there: LMDB reads no value
        if not flags & F_BIGDATA:
            return None  # inside its leaf page: checked with the page
        psize, last = self.meta.page_size, self.meta.last_page
        first = _PAGE_NUMBER.unpack_from(self.buf, at + NODE.size + len(key))[0]
        if not 2 <= first <= last:
            return f"page {page}: the value's overflow page {first} lies outside pages 2..{last}"
        number, _, oflags, pages = PAGE_HEADER.unpack_from(self.buf, first * psize)
        if number != first or not oflags & P_OVERFLOW:
            return f"page {page}: page {first} is not the overflow page of the value"
        if size + PAGE_HEADER.size > min(pages, last - first + 1) * psize:
            return (
                f"page {page}: a {size}-byte value does not fit its overflow pages (page {first} "
                f"says it spans {pages}; the file ends after page {last})"
            )
        return None
