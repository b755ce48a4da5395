"""The page cache in the read benchmarks: making the data cold, and only the data.

`make_cold` evicts a dataset's files and checks with ``mincore`` that they are gone. `Pinned`
keeps other files (paddle's, OpenCV's and numpy's libraries) in memory meanwhile: this
machine's page cache shrinks by itself (13 MB of library pages in 5 s with 20 GB free, a
VM's memory reclaim), and paddle's workers then fault the libraries back in the middle of a
timed pass, through the throttled disk, counted as the dataset's reads (block tracing showed
80 MB of libpaddle, libphi_core and libdnnl in one pass after ``drop_caches``, and hundreds of
small reads without it). On a training machine these pages stay hot; the data is what is cold.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_INT = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _INT, _INT, _INT, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@contextlib.contextmanager
def mapped(path: str) -> Iterator[tuple[int, int]]:
    """``(address, size)`` of a read-only shared mapping of `path` (size 0: empty file)."""
    size = os.path.getsize(path)
    if size == 0:
        yield 0, 0
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
    finally:
        os.close(fd)
    try:
        yield addr, size
    finally:
        _libc.munmap(addr, size)


def resident_bytes(paths: Sequence[str]) -> int:
    """Bytes of the files' pages in the page cache now (``mincore``)."""
    total = 0
    for path in paths:
        with mapped(path) as (addr, size):
            if size:
                vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
                total += sum(v & 1 for v in vec) * mmap.PAGESIZE
    return total


def evict(paths: Sequence[str]) -> None:
    """Drop the files' pages from the page cache (pages mapped by a live process stay)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_cold(paths: Sequence[str], tries: int = 20) -> float:
    """Evict the files' pages, waiting for processes that still map them (DataLoader workers
    of the previous row shutting down) to let go; returns the fraction still cached."""
    size = sum(os.path.getsize(p) for p in paths) or 1
    left = 1.0
    for _ in range(tries):
        evict(paths)
        left = resident_bytes(paths) / size
        if left < 0.001:
            break
        time.sleep(0.1)
    return left


def drop_caches() -> bool:
    """``echo 3 > /proc/sys/vm/drop_caches`` (root); False when not allowed."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def mapped_files(exclude: Sequence[str] = ()) -> list[str]:
    """The regular files this process maps (its libraries), outside /dev and `exclude`."""
    skip = {os.path.realpath(p) for p in exclude}
    found: dict[str, None] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) == 6 else ""
            if path.startswith("/") and not path.startswith("/dev/") and path not in skip:
                found[path] = None
    return [p for p in found if os.path.isfile(p)]


def proactive_reclaim() -> str | None:
    """A line naming the kernel's DAMON page-out schemes that are on, or None: they evict
    page-cache pages judged cold, read-ahead included, before they are read."""
    root = "/sys/kernel/mm/damon/admin/kdamonds"
    found = []
    try:
        for kd in sorted(os.listdir(root)):
            path = os.path.join(root, kd)
            if not kd.isdigit() or Path(path, "state").read_text().strip() != "on":
                continue
            schemes = os.path.join(path, "contexts", "0", "schemes")
            for sc in sorted(os.listdir(schemes)):
                action = os.path.join(schemes, sc, "action")
                if sc.isdigit() and Path(action).read_text().strip() == "pageout":
                    found.append(f"kdamond {kd} scheme {sc}")
    except OSError:
        return None
    return f"DAMON page-out is on ({', '.join(found)})" if found else None


def _pin_and_wait(paths: Sequence[str]) -> None:
    """(The helper process.) Map and ``mlock`` the files, say how many bytes are locked,
    and hold them until stdin closes."""
    locked = 0
    with contextlib.ExitStack() as stack:
        for path in paths:
            try:
                addr, size = stack.enter_context(mapped(path))
            except OSError:
                continue
            if size and _libc.mlock(addr, size) == 0:
                locked += size
        print(locked, flush=True)
        sys.stdin.read()


class Pinned:
    """Files held in memory (``mlock``, root) by a helper process until `close` or until this
    process exits; `locked` says how many bytes it locked (0 without the right to)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, *paths],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        self.locked = int(line) if line.strip().isdigit() else 0

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(30)


if __name__ == "__main__":
    _pin_and_wait(sys.argv[1:])
