"""One read-only handle per shard per process, never used across ``fork``.

Handles are whatever a format opens (``ShardFormat.open_shard``: a database environment, a
read-only ``mmap``), and file descriptors for page-cache hints.

Some libraries refuse to open the same database twice in one process, or to reopen one whose
handle was inherited through ``fork`` while that handle is still registered. So every dataset
object in a process shares the handles kept here, and a forked child closes the
inherited ones (its own copies of the parent's mappings) before it opens anything.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

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


def open_mmap_readonly(path: str) -> mmap.mmap | bytes:
    """Map a file read-only (``b""`` for an empty file, which cannot be mapped).

    The descriptor is closed at once; the mapping keeps the file's pages reachable. The
    kernel's read-ahead is off on the mapping (``MADV_RANDOM``), as for LMDB: a page fault
    otherwise reads up to read_ahead_kb around it (48 MB for 300 random 5 KB records on an
    8 MiB read_ahead_kb disk); sequential reads get hints instead (`readers.readahead`).
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return mapped


def shared_mmap(path: str) -> mmap.mmap | bytes:
    """The process's read-only mapping of the file `path`.

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
