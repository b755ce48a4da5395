"""Which build of a packed dataset a reader opened, and the check that later shards are of it.

A shard opened later (lazily, in a DataLoader worker, or again after its handle was closed) is
checked to be of that build.

``packer build --overwrite`` renames a new directory into place, so the directory a reader
opened and the one a path names afterwards differ in inode; an in-place change (a future
``append``) rewrites ``meta.json``. A `DatasetIdentity` records, at open, the directories
the shards may lie in (the dataset's own; for a staged copy its local data directory and the
origin, while the origin still holds the build that was staged) and ``meta.json``'s inode,
size and mtime. `check_shard` costs a few ``stat`` calls per shard opened, nothing per read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from readers.errors import DatasetRebuiltError
from readers.formats.layout import META_NAME

__all__ = ["DatasetIdentity", "identify_dataset", "meta_read", "meta_stamp", "read_meta_once"]

STAGING_DIR = ".staging"  # readers.staging.cache.STAGING: a staged copy's own state


def _dir_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _file_id(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def meta_stamp(root: str | os.PathLike[str]) -> tuple[int, int, int, int]:
    """``meta.json``'s device, inode, size and mtime: which one a read saw."""
    return _file_id(os.path.join(os.fspath(root), META_NAME))


_READ: ContextVar[tuple[str, tuple[int, int, int, int], dict[str, Any]] | None] = ContextVar(
    "meta_read", default=None
)


@contextlib.contextmanager
def read_meta_once(
    root: str | os.PathLike[str], meta: dict[str, Any], stamp: tuple[int, int, int, int]
) -> Iterator[None]:
    """Inside the block, `meta_read` hands out `meta`, so that it is read once.

    `meta` was read from `root`'s ``meta.json`` while it had `stamp`; ``open_dataset`` and the
    dataset both use it.
    """
    token = _READ.set((os.path.realpath(root), stamp, meta))
    try:
        yield
    finally:
        _READ.reset(token)


def meta_read(root: str | os.PathLike[str], stamp: tuple[int, int, int, int]) -> Any:
    """The ``meta.json`` of `root` read by the enclosing `read_meta_once`, or None.

    It is returned when it is the file of `stamp`; else None (read it again).
    """
    found = _READ.get()
    if found is None or found[0] != os.path.realpath(root) or found[1] != stamp:
        return None
    return found[2]


@dataclass(frozen=True)
class DatasetIdentity:
    """The build a reader opened (pickles with the dataset, so spawned workers check it)."""

    root: str
    meta: tuple[int, int, int, int]  # meta.json: device, inode, size, mtime
    dirs: frozenset[tuple[int, int]]  # directories a shard may lie in: device, inode

    def check_meta(self) -> None:
        """Raise `DatasetRebuiltError` unless ``root/meta.json`` is still the one opened."""
        try:
            found = _file_id(os.path.join(self.root, META_NAME))
        except OSError as exc:
            raise DatasetRebuiltError.of(self.root, f"{META_NAME} is gone: {exc}") from exc
        if found != self.meta:
            raise DatasetRebuiltError.of(self.root, f"{META_NAME} was replaced or rewritten")

    def check_shard(self, shard_path: str) -> None:
        """Raise `DatasetRebuiltError` unless the shard at `shard_path` is of the opened build.

        The shard (a file or an LMDB directory, links followed) must lie in a directory of the
        opened build.
        """
        self.check_meta()
        where = os.path.dirname(os.path.realpath(shard_path))
        try:
            found = _dir_id(where)
        except OSError as exc:
            raise DatasetRebuiltError.of(self.root, f"{where} is gone: {exc}") from exc
        if found not in self.dirs:
            raise DatasetRebuiltError.of(
                self.root, f"{os.path.basename(shard_path)} now lies in another directory"
            )


def identify_dataset(root: str | os.PathLike[str]) -> DatasetIdentity:
    """The identity of the packed dataset at `root` as it is now (call it when opening)."""
    root = os.fspath(root)
    real = os.path.realpath(root)
    meta = _file_id(os.path.join(root, META_NAME))
    dirs = {_dir_id(real)}
    data = os.path.join(real, STAGING_DIR, "data")
    if os.path.isdir(data):  # a staged copy: its local copies, and the origin's shards
        dirs.add(_dir_id(data))
        origin = _staged_origin(real)
        if origin is not None:
            dirs.add(_dir_id(origin))
    return DatasetIdentity(root=root, meta=meta, dirs=frozenset(dirs))


def _staged_origin(staged: str) -> str | None:
    """The origin of a staged copy, when it still holds the build staged (same meta.json)."""
    try:
        with open(os.path.join(staged, STAGING_DIR, "origin.json"), encoding="utf-8") as f:
            origin = os.path.realpath(str(json.load(f)["path"]))
        with open(os.path.join(staged, META_NAME), "rb") as f:
            ours = f.read()
        with open(os.path.join(origin, META_NAME), "rb") as f:
            theirs = f.read()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return origin if ours == theirs else None
