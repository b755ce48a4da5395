"""Open a dataset's files only when they are regular files.

A FIFO, a device node, a socket or a directory in place of ``meta.json``, the index or a shard
fails at once with a message (instead of blocking forever in ``open``), and `open_inside`
follows no symbolic link on its way. No paddle import.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from readers.errors import DatasetFormatError
from readers.formats.layout import (
    ERRORS_NAME,
    INDEX_COLUMNAR_NAME,
    INDEX_NAME,
    META_NAME,
    WARNINGS_NAME,
)

if TYPE_CHECKING:
    from readers.formats.base import ShardFormat

DATASET_FILES = (META_NAME, INDEX_NAME, INDEX_COLUMNAR_NAME, ERRORS_NAME, WARNINGS_NAME)
"""The files of a packed dataset besides its shards, as ``packer build`` writes them
(``meta.json`` first)."""

_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISREG, "regular file"),
)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class NotRegularFileError(DatasetFormatError):
    """A dataset file is a FIFO, a device, a directory or (where links are refused) a link."""

    def __init__(self, path: str | os.PathLike[str], kind: str, hint: str = "") -> None:
        super().__init__(
            f"{os.fspath(path)}: is a {kind}, not a regular file; "
            + (hint or "expected the file packer build wrote; restore it or rebuild the dataset")
        )
        self.path = os.fspath(path)
        self.kind = kind


def describe_mode(mode: int) -> str:
    """What kind of file `mode` (``st_mode``) is: ``"FIFO (named pipe)"``, ``"directory"``..."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "special file"


def check_regular(path: str | os.PathLike[str], *, follow: bool = True) -> os.stat_result:
    """The ``stat`` of `path`, which must be a regular file (links followed when `follow`).

    Raises:
        NotRegularFileError: it is something else; FileNotFoundError: it is missing.
    """
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(path, describe_mode(st.st_mode))
    return st


def check_shard_files(root: Path, fmt: ShardFormat, names: Iterable[str]) -> None:
    """Check that every file of the shards `names` that exists is a regular file.

    Links are followed (a staged dataset links its shards); this runs before any of them is
    opened.

    Raises:
        NotRegularFileError: naming the first that is a FIFO, a device, a directory...
    """
    for name in names:
        for rel in fmt.shard_files(name):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                check_regular(root / rel)  # a missing file is the format's to report


def _open_fd(
    name: str | os.PathLike[str], *, shown: str | os.PathLike[str], follow: bool, dir_fd: int | None
) -> int:
    """Open a regular file read-only without blocking on a FIFO.

    It stats first so that a device node is never opened (opening one can have effects), and
    fstats after to close the race.
    """
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(shown, describe_mode(st.st_mode))
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:  # replaced by a link since the stat
            raise NotRegularFileError(shown, "symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(shown, describe_mode(st.st_mode))
        if _NONBLOCK:  # reads of a regular file never block; leave the flag off regardless
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> BinaryIO:
    """Open the regular file `path` for binary reading, never blocking in ``open``.

    Args:
        path: the file.
        follow: follow a symbolic link at `path` (False: a link is refused).

    Raises:
        NotRegularFileError: `path` is a FIFO, a device, a socket, a directory (or a link,
            with ``follow=False``); OSError: it cannot be opened (FileNotFoundError: missing).
    """
    fd = _open_fd(path, shown=path, follow=follow, dir_fd=None)
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], *, follow: bool = True) -> bytes:
    """The bytes of the regular file `path` (see `open_regular`)."""
    with open_regular(path, follow=follow) as f:
        return f.read()


@contextlib.contextmanager
def _directory(root: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of ``root/parts...``, each of `parts` entered without following a link."""
    fds = [os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)]
    try:
        for n, part in enumerate(parts):
            shown = root.joinpath(*parts[: n + 1])
            st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise NotRegularFileError(shown, describe_mode(st.st_mode), _NO_LINKS)
            flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
            fds.append(os.open(part, flags, dir_fd=fds[-1]))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


_NO_LINKS = (
    "a dataset is staged only from the regular files and directories packer build wrote, "
    "and no symbolic link in it is followed; replace the entry with the file itself"
)


def _split(rel: str) -> tuple[tuple[str, ...], str]:
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ValueError(f"{rel!r}: expected a relative path inside the dataset")
    return tuple(parts[:-1]), parts[-1]


def open_inside(root: str | os.PathLike[str], rel: str) -> BinaryIO:
    """Open the regular file ``root/rel`` following no symbolic link below `root`.

    Raises:
        NotRegularFileError: ``rel`` or a directory on its way is a link, or the file is not
            a regular file; OSError: it cannot be opened (FileNotFoundError: missing).
    """
    parents, name = _split(rel)
    shown = Path(root, rel)
    with _directory(Path(root), parents) as dir_fd:
        try:
            fd = _open_fd(name, shown=shown, follow=False, dir_fd=dir_fd)
        except NotRegularFileError as exc:
            if exc.kind == "symbolic link":
                raise NotRegularFileError(shown, exc.kind, _NO_LINKS) from None
            raise
    return os.fdopen(fd, "rb")


def stat_inside(root: str | os.PathLike[str], rel: str) -> os.stat_result:
    """The ``lstat`` of the regular file ``root/rel``, reached through no symbolic link.

    Raises:
        NotRegularFileError, FileNotFoundError: as `open_inside`.
    """
    parents, name = _split(rel)
    shown = Path(root, rel)
    with _directory(Path(root), parents) as dir_fd:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        kind = describe_mode(st.st_mode)
        raise NotRegularFileError(shown, kind, _NO_LINKS if kind == "symbolic link" else "")
    return st
