"""Read one source file as it is now: never blocking, never torn, never outside SRC.

A file is packed as it is when it is read: one that changed between the scan and the read
is packed in its new, whole state; one that changes *while* it is read (its size, mtime or
ctime differ before and after, or fewer bytes came than it holds) is ``changed``; one that
vanished is ``unreadable`` ("vanished after the scan"); one replaced by a FIFO or device is
``not_regular`` and never blocks the build (it is opened with ``O_NONBLOCK``); one whose path
leads outside SRC when it is opened (a folder swapped for a symlink after the scan) is
``outside_src``: the open descriptor's real path (``/proc/self/fd``) is checked against SRC's
before a byte is read.
"""

from __future__ import annotations

import os
import stat

from packer import problems as P
from packer.problems import Problem


def read_all(fd: int, size: int) -> bytes:
    """The bytes of `fd`, whose fstat gave `size`: one read when that many come.

    A read that returns exactly `size` bytes (of ``size + 1`` asked for) is not followed by
    one that would return none: bytes added after it change the size, mtime and ctime that
    `read_source` compares after reading, so such a file is ``changed`` either way.
    """
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    chunks = [data]
    while chunks[-1]:
        chunks.append(os.read(fd, max(size + 1, 1 << 16)))
    return b"".join(chunks)


def _file_state(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def is_within(root: str, real: str) -> bool:
    """Whether the real path `real` is `root` (a real path) or lies under it."""
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _opened_path(fd: int, path: str) -> str:
    """Return where the open `fd` leads.

    That is the kernel's name for it, or (without ``/proc``) where `path` leads now.
    """
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # pragma: no cover - not Linux
        return os.path.realpath(path)


def open_source(path: str, rel: str, *, root: str | None = None) -> int | Problem:
    """A read-only descriptor of the file at `path`, or the problem that prevents opening it.

    It is opened without blocking (a FIFO swapped in after the scan cannot hang the build).
    With `root` (the real path of SRC), the file the descriptor leads to must lie under it:
    a folder on `path` replaced by a link to elsewhere after the scan is ``outside_src``,
    and nothing of it is read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return Problem(rel, P.UNREADABLE, "vanished after the scan")
    except OSError as exc:
        return Problem(rel, P.UNREADABLE, f"cannot open ({exc.strerror or exc})")
    if root is not None:
        where = _opened_path(fd, path)
        if not is_within(root, where):
            os.close(fd)
            return Problem(
                rel,
                P.OUTSIDE_SRC,
                f"leads outside SRC when read (to {where}): a folder or file on its path was "
                "replaced by a link after the scan; not read",
            )
    return fd


def read_source(path: str, rel: str, *, root: str | None = None) -> bytes | Problem:
    """The bytes of one file, or the problem that prevents reading it.

    The file is opened with `open_source` (never blocking; with `root`, never outside it)
    and must still be a regular file; its size, mtime and ctime are compared before and
    after the read, so a file written to while we read it is reported (``changed``)
    instead of packed torn.
    """
    fd = open_source(path, rel, root=root)
    if isinstance(fd, Problem):
        return fd
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return Problem(rel, P.NOT_REGULAR, "no longer a regular file (replaced after the scan)")
        data = read_all(fd, before.st_size)
        after = os.fstat(fd)
    except OSError as exc:
        return Problem(rel, P.UNREADABLE, f"cannot read ({exc.strerror or exc})")
    finally:
        os.close(fd)
    if _file_state(before) != _file_state(after) or len(data) != after.st_size:
        return Problem(
            rel,
            P.CHANGED,
            f"changed while being read ({before.st_size} bytes at open, {len(data)} read, "
            f"{after.st_size} after); not packed torn",
        )
    if not data:
        return Problem(rel, P.EMPTY, "a zero-byte file")
    return data
