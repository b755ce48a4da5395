"""Read-only handles of shard files, shared per process, a bounded number open.

They are never used across ``fork``.

Handles are whatever a format opens (``ShardFormat.open_shard``: a database environment, a
read-only ``mmap``), and file descriptors for page-cache hints.

Some libraries refuse to open the same database twice in one process, or to reopen one whose
handle was inherited through ``fork`` while that handle is still registered. So every dataset
object in a process shares the handles kept here, and a forked child closes the inherited
ones (its own copies of the parent's mappings) before it opens anything.

A dataset of a few hundred shards would otherwise hold a descriptor per shard it ever touched
(and one more per file hinted), past the usual soft limit of 1024. Handles are kept in least
recently used order: before a handle is opened, the least recently used ones are closed until
the descriptors held stay within `max_open_files` (a quarter of ``RLIMIT_NOFILE``, 16 to 1024;
``PACKER_MAX_OPEN_FILES`` sets it). Holders keep an `Entry` and reopen when it is closed.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = [
    "Entry",
    "ShardHandles",
    "acquire",
    "close_all",
    "entry_of",
    "is_resource_error",
    "max_open_files",
    "open_mmap_readonly",
    "set_max_open_files",
    "shared_fd",
    "shared_handle",
    "shared_mmap",
]

_lock = threading.RLock()
_entries: OrderedDict[tuple[str, str], Entry] = OrderedDict()
_by_id: dict[int, Entry] = {}
_limit: int | None = None
# Bumped in a forked child and by close_all, so that datasets know their entries are stale.
generation = 0

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


class Entry:
    """One open handle: `handle`, whether it is still `open`, and the descriptors it holds."""

    __slots__ = ("fds", "handle", "key", "open")

    def __init__(self, key: tuple[str, str], handle: Any, fds: int) -> None:
        self.key = key
        self.handle = handle
        self.fds = fds
        self.open = True

    def close(self) -> None:
        """Close the handle.

        A mapping whose memory is still exported closes with its last view.
        """
        self.open = False
        _by_id.pop(id(self.handle), None)
        with contextlib.suppress(Exception):
            self.handle.close()


def is_resource_error(exc: BaseException) -> bool:
    """Whether `exc` is the OS running out of descriptors or memory, not a bad record."""
    return isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS


def max_open_files() -> int:
    """The most descriptors this process's handles hold at once."""
    global _limit
    if _limit is None:
        value = os.environ.get("PACKER_MAX_OPEN_FILES", "")
        if value.strip():
            _limit = max(1, int(value))
        else:
            soft = 1024
            with contextlib.suppress(ImportError, OSError, ValueError):
                import resource

                found = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                soft = found if found > 0 else soft
            _limit = min(1024, max(16, soft // 4))
    return _limit


def set_max_open_files(limit: int | None) -> None:
    """Set `max_open_files` (None: the default again); closes what is over it now."""
    global _limit
    _limit = None if limit is None else max(1, int(limit))
    with _lock:
        _evict(0)


def _evict(room: int) -> None:
    """Close least recently used handles until `room` more descriptors fit (lock held)."""
    limit = max_open_files()
    held = sum(e.fds for e in _entries.values())
    while _entries and held + room > limit:
        _, oldest = _entries.popitem(last=False)
        held -= oldest.fds
        oldest.close()


def _drop_inherited() -> None:
    global generation, _lock
    _lock = threading.RLock()  # the parent's may have been held by another thread at fork
    for entry in _entries.values():
        entry.close()
    _entries.clear()
    _by_id.clear()
    generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)


def acquire(
    kind: str,
    path: str,
    opener: Callable[[str], Any],
    *,
    fds: int = 1,
    identity: str | None = None,
) -> Entry:
    """The process's open `Entry` of `kind` for `path`, opened by ``opener(path)`` if needed.

    `fds` is how many descriptors the handle keeps open. Opening first closes least recently
    used handles to make room; an open that fails for lack of descriptors closes every other
    handle and is tried once more. The file's identity is part of the key, so a path replaced
    since (a rebuild with ``--overwrite``) is opened afresh, never served the old handle.
    """
    real = os.path.realpath(path)
    try:
        if identity is not None:  # one handle per file, whichever path (hard link) names it
            st = os.stat(identity)
            key = (f"{kind}:{st.st_dev}:{st.st_ino}", "")
        else:
            st = os.stat(real)
            key = (f"{kind}:{st.st_dev}:{st.st_ino}", real)
    except OSError:
        key = (kind, real)  # the opener says what is wrong
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
            return entry
        _evict(fds)
        try:
            handle = opener(path)
        except Exception as exc:
            if not _entries or not _caused_by_resources(exc):
                raise
            _evict(max_open_files() + 1)  # everything
            handle = opener(path)
        entry = Entry(key, handle, fds)
        _entries[key] = entry
        _by_id[id(handle)] = entry
        return entry


def _caused_by_resources(exc: BaseException) -> bool:
    """`exc` or what it was raised from is a resource error (libraries wrap OSErrors)."""
    seen: BaseException | None = exc
    while seen is not None:
        if is_resource_error(seen) or "Too many open files" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def touch(entry: Entry) -> None:
    """Mark `entry` used now (it is closed last)."""
    with contextlib.suppress(KeyError):
        if entry.open:
            _entries.move_to_end(entry.key)


def entry_of(handle: Any) -> Entry | None:
    """The open `Entry` of a handle returned by `shared_handle` (None: not kept here)."""
    return _by_id.get(id(handle))


class ShardHandles:
    """One reader's handles of its shards in this process, by shard number.

    Each is taken on first use and again after it was closed to make room; none survive
    ``fork`` or a pickle (``ShardHandles()`` is what a copy starts with).
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.entries: list[Entry | None] = []
        self.generation = -1

    def get(self, shard: int, count: int, open_shard: Callable[[int], Any]) -> Any:
        """Shard `shard`'s open handle (of `count` shards), ``open_shard(shard)`` if needed."""
        if self.generation != generation:
            self.handles, self.entries = [None] * count, [None] * count
            self.generation = generation
        handle, entry = self.handles[shard], self.entries[shard]
        if handle is not None and (entry is None or entry.open):
            if entry is not None:
                touch(entry)
            return handle
        handle = open_shard(shard)
        self.handles[shard], self.entries[shard] = handle, entry_of(handle)
        return handle

    def closed(self, shard: int) -> bool:
        """Whether shard `shard`'s handle was closed since it was taken."""
        entry = self.entries[shard] if shard < len(self.entries) else None
        return entry is not None and not entry.open


def shared_handle(
    kind: str, path: str, opener: Callable[[str], Any], *, identity: str | None = None
) -> Any:
    """The process's handle of `kind` for `path`, opened by `opener(path)` on first use.

    `identity`: the file whose device and inode alone key the handle (an LMDB shard's
    ``data.mdb``: py-lmdb refuses a second environment of the same file in one process, also
    through another hard link, as ``packer append`` and ``merge`` leave them).

    It stays valid until it is closed to make room for others (`entry_of(handle).open`).
    """
    return acquire(kind, path, opener, identity=identity).handle


def open_mmap_readonly(path: str) -> mmap.mmap | bytes:
    """Map a file read-only (``b""`` for an empty file, which cannot be mapped).

    The file is closed at once (``mmap`` keeps its own duplicate descriptor). The
    kernel's read-ahead is off on the mapping (``MADV_RANDOM``), as for LMDB: a page fault
    otherwise reads up to read_ahead_kb around it (48 MB for 300 random 5 KB records on an
    8 MiB read_ahead_kb disk); sequential reads get hints instead (`readers.io.readahead`).
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return mapped


def shared_mmap(path: str) -> mmap.mmap | bytes:
    """The process's read-only mapping of the file `path` (``mmap`` keeps a descriptor).

    The file's identity and size are part of the key, so a file replaced or rewritten since
    it was first mapped (a rebuild with ``--overwrite``) is mapped afresh, not read stale.
    """
    st = os.stat(path)
    kind = f"mmap:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    return acquire(kind, path, open_mmap_readonly).handle  # type: ignore[no-any-return]


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
        for entry in _entries.values():
            entry.close()
        _entries.clear()
        _by_id.clear()
        generation += 1
