"""File primitives of staging: locks, a checked copy, atomic small-file writes, size parsing.

Locks are flock-based; the copy computes a CRC while reading, fsyncs, re-reads and compares,
follows no link, and gives permissions at most the origin's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from readers import sizes
from readers.errors import ReaderError

if TYPE_CHECKING:
    from readers.staging.origin import Origin

BLOCK = 4 << 20
TMP_MARK = ".tmp-"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

Progress = Callable[[int], None]


class StagingError(ReaderError):
    """A dataset could not be staged, or a staged copy does not match its origin."""


def parse_size(value: int | str | None) -> int | None:
    """``None`` -> ``None``; an int -> itself; ``"20GiB"``, ``"500MB"``, ``"1.5G"`` -> bytes."""
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value < 0:
            raise StagingError(f"cache limit {value}: expected a size >= 0")
        return value
    try:
        return sizes.parse_size(value)
    except sizes.SizeError:
        raise StagingError(
            f"cache limit {value!r}: expected bytes or a size such as 20GiB, 500MB"
        ) from None


@contextlib.contextmanager
def locked(path: Path, *, shared: bool = False, wait: bool = True) -> Iterator[bool]:
    """Hold an flock on `path` (created if missing) for the block.

    Yields False, holding nothing, when `wait` is False and another process holds a
    conflicting lock.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the only descriptor drops the lock


def hold_shared(path: Path) -> int | None:
    """Take a shared flock on `path` and return its descriptor, or None when the file is gone.

    The descriptor is kept open to keep the lock.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def fsync_dir(path: Path) -> None:
    """Call fsync on the directory `path`, so that a new entry or rename in it lasts."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc_file(path: Path, progress: Progress | None = None, digest: Any = None) -> int:
    """The CRC-32 of a whole file (`digest`, a hashlib object, is fed the same bytes)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            crc = zlib.crc32(block, crc)
            if digest is not None:
                digest.update(block)
            if progress is not None:
                progress(len(block))
    return crc


def copy_checked(
    origin: Origin, rel: str, dst: Path, progress: Progress | None = None, *, sha256: bool = False
) -> dict[str, Any]:
    """Copy the file `rel` of `origin` to the new file `dst`, checked.

    A local origin's file is reached through no symbolic link; `dst` is fsynced, re-read and
    its CRC-32 compared.

    The copy's permissions are at most the origin's (and the umask's), never executable: a
    file only its owner may read stays so in a shared cache.

    Returns ``{"size": ..., "crc32": ...}`` of the bytes read from the origin, and with
    `sha256` their ``"sha256"`` (hex, computed as the copy is re-read).

    Raises:
        NotRegularFileError: the origin is a link, a FIFO, a device...; StagingError: the copy
            does not read back as written.
    """
    crc = 0
    size = 0
    with contextlib.ExitStack() as stack:
        fin: IO[bytes] | None = None
        if origin.downloads(rel):  # an S3 object: several ranged GETs in flight, checked
            origin_mode = 0o600
        else:
            fin, origin_mode = stack.enter_context(origin.open(rel))
        # owner read/write while copying; the origin's bits (under the umask) once checked
        fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, origin_mode | 0o600)
        with os.fdopen(fd, "r+b") as fout:
            if fin is None:
                got = origin.download(rel, fout, progress)
                crc, size = got["crc32"], got["size"]
            while fin is not None and (block := fin.read(BLOCK)):
                crc = zlib.crc32(block, crc)
                size += len(block)
                fout.write(block)
                if progress is not None:
                    progress(len(block))
            fout.flush()
            os.fsync(fout.fileno())
            digest = hashlib.sha256() if sha256 else None
            copied = crc_file(dst, digest=digest)
            if copied != crc or os.fstat(fd).st_size != size:
                raise StagingError(
                    f"{dst}: copy of {origin.where(rel)} reads back with CRC-32 {copied:08x}, "
                    f"expected {crc:08x} (local disk or memory error?)"
                )
            os.fchmod(fd, os.fstat(fd).st_mode & origin_mode)
    if digest is not None:
        return {"size": size, "crc32": crc, "sha256": digest.hexdigest()}
    return {"size": size, "crc32": crc}


def remove(path: Path) -> None:
    """Remove a file, a symlink or a directory tree; missing is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` through a fsynced temporary file and a rename."""
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or unreadable (a torn write)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def point_link(link: Path, target: str) -> None:
    """Make `link` a symlink to `target`, replacing what is there atomically."""
    tmp = link.with_name(f"{link.name}{TMP_MARK}{os.getpid()}")
    remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
