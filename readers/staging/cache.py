"""The layout of a staging cache directory, its space accounting and LRU eviction.

::

    CACHE/
      .cache.lock                  held (exclusive) while space is counted, reserved or freed
      .<name>-<key>.use            flock: held (shared) by every process using that dataset
      <name>-<key>/                one staged dataset: a directory readers open as usual
        meta.json, index.jsonl ... copies of the dataset's small files
        shard-00000 -> .staging/data/shard-00000   (staged)  or  ORIGIN/shard-00000
        .staging/
          origin.json              {"path": ORIGIN, "generation": sha256 of its meta.json}
          data/<entry>             the staged copies
          shards/<shard>.json      manifest: files, sizes, CRCs; present = complete.  Its
                                   mtime is the shard's last use (LRU order).
          shards/<shard>.copy      flock: held (exclusive) by the one process copying it
          shards/<shard>.use       flock: held (shared) by every process using the copy
          shards/<shard>.reserve   bytes reserved for a copy in progress

A shard is evicted only when nobody copies it and nobody holds its ``.use`` lock; its links
are pointed back to the origin before its copy is removed.  A staged dataset none of whose
shards is left is removed whole when nobody holds ``CACHE/.<name>-<key>.use`` (shared while a
process stages or uses it; its mtime is the dataset's last use).

A rebuilt origin (another ``meta.json``) is another generation, staged in a directory of its
own; staging it removes the directories of the origin's older generations whole, each one only
when nobody holds its ``.use`` lock nor copies or uses any of its shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from readers.staging.files import TMP_MARK, locked, point_link, read_json, remove

CACHE_LOCK = ".cache.lock"
STAGING = ".staging"


@dataclass(frozen=True)
class ShardSlot:
    """Where one shard of one staged dataset keeps its state."""

    root: Path  # the staged dataset directory
    name: str  # the shard's name in meta.json

    @property
    def state(self) -> Path:
        """Return the directory of the shards' state files (manifests, locks, reservations)."""
        return self.root / STAGING / "shards"

    @property
    def data(self) -> Path:
        """Return the directory that holds the staged shards' copies."""
        return self.root / STAGING / "data"

    @property
    def manifest(self) -> Path:
        """Return the path of the shard's manifest (written once its copy is whole)."""
        return self.state / f"{self.name}.json"

    @property
    def copy_lock(self) -> Path:
        """Return the path of the lock held while the shard is copied."""
        return self.state / f"{self.name}.copy"

    @property
    def use_lock(self) -> Path:
        """Return the path of the lock that processes using the shard hold."""
        return self.state / f"{self.name}.use"

    @property
    def reservation(self) -> Path:
        """Return the path of the file that reserves cache space for the shard's copy."""
        return self.state / f"{self.name}.reserve"

    def unstage(self, manifest: dict[str, Any] | None) -> None:
        """Point the shard's links back to the origin, then remove its copy and manifest.

        The manifest goes first: a crash half-way leaves an incomplete, ignored copy.
        """
        origin = read_json(self.root / STAGING / "origin.json")
        self.manifest.unlink(missing_ok=True)
        for entry in (manifest or {}).get("entries", []):
            if origin is not None:
                point_link(self.root / entry, os.path.join(origin["path"], entry))
            remove(self.data / entry)
        self.clean_temporaries()

    def clean_temporaries(self) -> None:
        """Remove what a killed copy of this shard left behind."""
        if self.data.is_dir():
            for path in self.data.iterdir():
                if path.name.startswith(self.name) and TMP_MARK in path.name:
                    remove(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _slots(cache: Path) -> list[ShardSlot]:
    slots: list[ShardSlot] = []
    for state in cache.glob(f"*/{STAGING}/shards"):
        root = state.parent.parent
        names = {p.name.rsplit(".", 1)[0] for p in state.iterdir() if TMP_MARK not in p.name}
        slots.extend(ShardSlot(root, n) for n in sorted(names))
    return slots


def _manifest_bytes(slot: ShardSlot) -> int:
    manifest = read_json(slot.manifest)
    return int(manifest["bytes"]) if manifest else 0


def _reserved_bytes(slot: ShardSlot) -> int:
    """Bytes reserved for a copy in progress; a reservation whose copier died is dropped."""
    if not slot.reservation.exists():
        return 0
    with locked(slot.copy_lock, wait=False) as free:
        if free:  # nobody copies: the reserving process was killed
            slot.reservation.unlink(missing_ok=True)
            slot.clean_temporaries()
            return 0
    try:
        return int(slot.reservation.read_text() or 0)
    except (OSError, ValueError):
        return 0


def usage(cache: Path) -> int:
    """Return the bytes the cache holds or has reserved.

    That is staged shards, copies in progress and the small files of every staged dataset.
    """
    total = 0
    for root in cache.iterdir():
        if root.is_dir() and TMP_MARK not in root.name and not root.name.startswith("."):
            total += sum(_size(p) for p in root.iterdir() if p.is_file() and not p.is_symlink())
    for slot in _slots(cache):
        total += _manifest_bytes(slot) + _reserved_bytes(slot)
    return total


def _last_use(slot: ShardSlot) -> float:
    try:
        return slot.manifest.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def evict_one(slot: ShardSlot) -> int:
    """Evict `slot` if nobody copies or uses it; return the bytes freed (0: left alone)."""
    with locked(slot.copy_lock, wait=False) as no_copier:
        if not no_copier:
            return 0
        with locked(slot.use_lock, wait=False) as unused:
            if not unused:
                return 0
            manifest = read_json(slot.manifest)
            if manifest is None:
                return 0
            slot.unstage(manifest)
            return int(manifest["bytes"])


def dataset_lock(root: Path) -> Path:
    """Return the lock file every process flocks (shared) while it stages or uses `root`.

    `root` is a staged dataset; removing it takes this lock exclusively.
    """
    return root.parent / f".{root.name}.use"


def _dataset_last_use(root: Path) -> float:
    try:
        return dataset_lock(root).stat().st_mtime
    except FileNotFoundError:
        return 0.0


def evict_dataset(root: Path) -> int:
    """Remove the staged dataset `root` (its small files) when unused; return the bytes freed.

    It is unused when none of its shards is staged and no process stages or uses it.
    """
    if any((root / STAGING / "shards").glob("*.json")):
        return 0
    with locked(dataset_lock(root), wait=False) as unused:
        if not unused or not root.is_dir():
            return 0
        freed = sum(_size(p) for p in root.iterdir() if p.is_file() and not p.is_symlink())
        trash = root.with_name(f"{root.name}{TMP_MARK}evicted")
        os.rename(root, trash)  # gone at once; the files go after
        remove(trash)
        return freed


def compute_generation(meta_bytes: bytes) -> str:
    """Return the generation of a packed dataset: the SHA-256 of its ``meta.json`` bytes.

    A rebuild writes another ``created``, plan digest and index digest, hence another
    generation.
    """
    return hashlib.sha256(meta_bytes).hexdigest()


def evict_superseded(cache: Path, keep: Path, origin: str) -> list[str]:
    """Remove the staged directories of `origin` other than `keep`.

    These are older generations of the same origin; each is removed only when no process uses
    it or copies or uses any of its shards.

    Returns the names of the directories removed.
    """
    removed: list[str] = []
    with locked(cache / CACHE_LOCK):
        for root in sorted(cache.iterdir()):
            if root == keep or root.name.startswith(".") or TMP_MARK in root.name:
                continue
            info = read_json(root / STAGING / "origin.json")
            if not isinstance(info, dict) or info.get("path") != origin:
                continue
            if _remove_unused(root):
                removed.append(root.name)
    return removed


def _remove_unused(root: Path) -> bool:
    """Remove the staged dataset `root` whole, shards and all, unless it is in use.

    Its links are not pointed back to the origin: the origin now holds another generation.
    """
    with contextlib.ExitStack() as stack:
        if not stack.enter_context(locked(dataset_lock(root), wait=False)):
            return False
        state = root / STAGING / "shards"
        names = {p.name.rsplit(".", 1)[0] for p in state.iterdir()} if state.is_dir() else set()
        for name in sorted(n for n in names if TMP_MARK not in n):
            slot = ShardSlot(root, name)
            for lock in (slot.copy_lock, slot.use_lock):
                if not stack.enter_context(locked(lock, wait=False)):
                    return False
        trash = root.with_name(f"{root.name}{TMP_MARK}superseded")
        remove(trash)
        os.rename(root, trash)  # gone at once; the files go after
        remove(trash)
        return True


def reserve(cache: Path, slot: ShardSlot, need: int, limit: int | None) -> list[ShardSlot]:
    """Reserve `need` bytes for copying `slot`.

    Least recently used shards of other datasets are evicted as needed (the caller holds the
    slot's copy lock).

    Returns the evicted slots; raises `NoRoom` when the shard does not fit.
    """
    with locked(cache / CACHE_LOCK):
        evicted: list[ShardSlot] = []
        if limit is not None:
            used = usage(cache)
            candidates = sorted(
                (s for s in _slots(cache) if s.root != slot.root and s.manifest.exists()),
                key=_last_use,
            )
            for other in candidates:
                if used + need <= limit:
                    break
                freed = evict_one(other)
                if freed:
                    used -= freed
                    evicted.append(other)
            roots = {s.root for s in _slots(cache) if s.root != slot.root}
            for root in sorted(roots, key=_dataset_last_use):
                if used + need <= limit:
                    break
                used -= evict_dataset(root)
            if used + need > limit:
                raise NoRoom(used, need, limit)
        slot.reservation.write_text(str(need))
        return evicted


class NoRoom(Exception):
    """A shard does not fit under the cache limit, even after evicting what can be evicted."""

    def __init__(self, used: int, need: int, limit: int) -> None:
        super().__init__(f"{need} bytes do not fit: {used} of {limit} in use")


def release(slot: ShardSlot) -> None:
    """Drop the cache space that `slot` reserved for its copy, if any."""
    with contextlib.suppress(FileNotFoundError):
        slot.reservation.unlink()
