"""One read-only handle per shard per process, never used across ``fork``.

Handles are LMDB environments and read-only ``mmap`` mappings of RecordIO files.

py-lmdb refuses to open the same environment twice in one process, and refuses to reopen one
whose handle was inherited through ``fork`` while that handle is still registered. So every
dataset object in a process shares the handles kept here, and a forked child closes the
inherited ones (its own copies of the parent's mappings) before it opens anything.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

from readers.errors import DatasetFormatError

_lock = threading.Lock()
_handles: dict[tuple[str, str], Any] = {}
# Bumped in a forked child so that datasets know their cached handles are stale.
generation = 0


def _drop_inherited() -> None:
    global generation, _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at fork
    for handle in _handles.values():
        with contextlib.suppress(Exception):
            handle.close()
    _handles.clear()
    generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)


def shared_handle(kind: str, path: str, opener: Callable[[str], Any]) -> Any:
    """The process's handle of `kind` for `path`, opened by `opener(path)` on first use."""
    key = (kind, os.path.realpath(path))
    handle = _handles.get(key)
    if handle is None:
        with _lock:
            handle = _handles.get(key)
            if handle is None:
                handle = opener(path)
                _handles[key] = handle
    return handle


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

    data = os.path.join(path, "data.mdb")
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


def shared_lmdb(path: str) -> Any:
    """The process's read-only LMDB environment for the shard directory `path`."""
    return shared_handle("lmdb", path, open_lmdb_readonly)


def open_mmap_readonly(path: str) -> mmap.mmap | bytes:
    """Map a file read-only (``b""`` for an empty file, which cannot be mapped).

    The descriptor is closed at once; the mapping keeps the file's pages reachable.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def shared_mmap(path: str) -> mmap.mmap | bytes:
    """The process's read-only mapping of the file `path` (a RecordIO ``.rec``).

    The file's identity and size are part of the key, so a file replaced or rewritten since
    it was first mapped (a rebuild with ``--overwrite``) is mapped afresh, not read stale.
    """
    st = os.stat(path)
    kind = f"mmap:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    return shared_handle(kind, path, open_mmap_readonly)  # type: ignore[no-any-return]


class _Fd:
    """A read-only file descriptor that closes like the other handles."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def close(self) -> None:
        os.close(self.fd)


def shared_fd(path: str) -> int:
    """The process's read-only descriptor of `path`, for page-cache hints."""
    return int(shared_handle("fd", path, _Fd).fd)


def close_all() -> None:
    """Close every handle of this process (tests, or before deleting a dataset)."""
    global generation
    with _lock:
        for handle in _handles.values():
            with contextlib.suppress(Exception):
                handle.close()
        _handles.clear()
        generation += 1
