"""Replacing a dataset directory in one step, and reusing its files by hard link.

`exchange_dirs` swaps two directories with Linux ``renameat2(RENAME_EXCHANGE)``, so a path
always names a whole directory: the old one before the call, the new one after it.
``os.rename`` cannot replace a non-empty directory, and renaming the old one away first
leaves a moment when the path names nothing; the exchange has no such moment, and a
``kill -9`` cannot stop it half-way (it is one system call). `link_entry` puts a file or an
LMDB directory of one dataset into another without copying its bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
from pathlib import Path

from packer.errors import PackerError

RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100
# renameat2's system call number where glibc (before 2.28) has no wrapper
_SYSCALL_NUMBERS = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "s390x": 347}


class ExchangeUnsupportedError(PackerError):
    """The filesystem (or the kernel, or the platform) cannot exchange two directories."""

    def __init__(self, a: Path, b: Path, detail: str) -> None:
        super().__init__(
            f"cannot swap {b} into place of {a} in one step ({detail}); packer append needs "
            "renameat2(RENAME_EXCHANGE) (Linux 3.15+ on ext4, xfs, btrfs, tmpfs, ...) so that "
            "readers never see a missing dataset: append on such a filesystem, or build a new "
            "dataset with packer build --overwrite"
        )


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def exchange_dirs(a: Path, b: Path) -> None:
    """Atomically swap the directories `a` and `b` (both must exist); fsync their parent.

    Raises:
        ExchangeUnsupportedError: not Linux, or the filesystem refuses the exchange.
        OSError: another failure (`a` or `b` missing, on different filesystems, ...).
    """
    if platform.system() != "Linux":
        raise ExchangeUnsupportedError(a, b, f"not Linux but {platform.system()}")
    libc = _libc()
    fa, fb = os.fsencode(a), os.fsencode(b)
    func = getattr(libc, "renameat2", None)
    if func is not None:
        func.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        rc = func(AT_FDCWD, fa, AT_FDCWD, fb, RENAME_EXCHANGE)
    else:
        number = _SYSCALL_NUMBERS.get(platform.machine())
        if number is None:
            raise ExchangeUnsupportedError(a, b, f"no renameat2 for {platform.machine()}")
        rc = libc.syscall(
            ctypes.c_long(number),
            ctypes.c_int(AT_FDCWD),
            ctypes.c_char_p(fa),
            ctypes.c_int(AT_FDCWD),
            ctypes.c_char_p(fb),
            ctypes.c_uint(RENAME_EXCHANGE),
        )
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise ExchangeUnsupportedError(a, b, os.strerror(err))
        raise OSError(err, os.strerror(err), str(a), None, str(b))
    fd = os.open(a.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_entry(src: Path, dst: Path) -> bool:
    """Hard-link the file `src` (or each file of the directory `src`) as `dst`.

    The bytes are shared, not copied, so the new dataset holds the very inodes of the old one.
    Where the filesystem refuses hard links, the files are copied instead.

    Returns:
        True when every file was linked, False when some had to be copied.
    """
    if src.is_dir():
        dst.mkdir()
        linked = True
        for child in sorted(src.iterdir()):
            linked = link_entry(child, dst / child.name) and linked
        return linked
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(src, dst)
        return False
    return True
