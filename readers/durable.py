"""Files that survive a crash once written: `write_durably`, `write_new_file` and `fsync_path`.

`write_durably` writes, flushes and fsyncs; `write_new_file` does the same to a file it creates
(never one that exists, never through a link); `fsync_path` fsyncs a file or a directory, by
path, so that a rename or a new entry in it lasts.

The build (``meta.json``, ``errors.jsonl``, the plan, shard side files) writes through these;
a writer that streams into a file it keeps open (a shard, ``index.jsonl``) fsyncs its own
descriptor before closing it, since it has no whole text to hand over.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def write_durably(path: str | os.PathLike[str], data: str | bytes | Iterable[str]) -> None:
    """Write `data` to `path` (created or truncated) and fsync it before returning.

    Args:
        path: the file to write.
        data: bytes as they are; text (one string, or lines that are joined as they are,
            so each must end in its own newline) as UTF-8, without newline translation.
    """
    if isinstance(data, str):
        raw = data.encode("utf-8")
    elif isinstance(data, bytes):
        raw = data
    else:
        raw = "".join(data).encode("utf-8")
    with open(path, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())


def write_new_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create `path` (refused when anything is there, a link included), write `data`, fsync it.

    Raises:
        FileExistsError: something already has that name.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Call fsync on a file or a directory, given by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
