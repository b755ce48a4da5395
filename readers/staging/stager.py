"""Stage one packed dataset into a cache directory.

Its named small files are staged once, then shard by shard under a per-shard lock, each copy
checked and renamed into place only when whole; older generations of the same origin are
removed once nobody uses them.

Only the files the dataset names are staged (``DATASET_FILES`` and the shard files of the shard
table), each a regular file reached through no symbolic link: anything else planted in the
origin is neither copied nor followed. A shard file whose SHA-256 meta.json records (a
published dataset's ``shard_sha256``) must have it once copied, else staging fails naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.files import DATASET_FILES, NotRegularFileError
from readers.formats import FORMATS, get_format
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.remote.dataset import shard_digests
from readers.staging import cache
from readers.staging.cache import STAGING, ShardSlot
from readers.staging.files import (
    TMP_MARK,
    Progress,
    StagingError,
    copy_checked,
    crc_file,
    fsync_dir,
    hold_shared,
    locked,
    point_link,
    read_json,
    remove,
    write_json_atomic,
)
from readers.staging.origin import Origin, make_origin

# Use locks this process holds on staged shards: staged dataset directory -> shard -> fd.
_HELD: dict[Path, dict[str, int]] = {}


@dataclass
class StageResult:
    """What one `stage` call did, shard names by outcome."""

    root: Path
    copied: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)  # did not fit: read from the origin
    repaired: list[str] = field(default_factory=list)  # a staged copy failed its check
    evicted: list[str] = field(default_factory=list)  # "<dataset dir>/<shard>" of others
    superseded: list[str] = field(default_factory=list)  # staged dirs of older builds, removed
    bytes_copied: int = 0


def _parse_meta(origin: Origin, data: bytes) -> dict[str, Any]:
    """The object that the meta.json bytes `data` of `origin` hold."""
    try:
        meta = json.loads(data)
    except ValueError as exc:
        raise StagingError(f"{origin.where(META_NAME)}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise StagingError(f"{origin.where(META_NAME)}: expected a JSON object")
    return meta


def _present(origin: Origin, names: Iterable[str]) -> list[str]:
    """Those of the optional small files `names` that `origin` has (each a regular file)."""
    found = []
    for name in names:
        try:
            origin.size(name)
        except FileNotFoundError:
            continue
        found.append(name)
    return found


class Stager:
    """Stages the packed dataset at `origin` into `cache_dir` (see `readers.staging.stage`).

    `origin` is a local directory or a URL (``s3://bucket/out.lmdb``, read with
    `storage_options`); a remote origin's shards must all fit under `cache_limit`.
    """

    def __init__(
        self,
        origin: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str],
        *,
        cache_limit: int | None = None,
        check: bool = False,
        hold: bool = True,
        progress: Progress | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.source: Origin = make_origin(origin, storage_options)
        self.origin = self.source.key  # a resolved local path, or the URL
        self.cache = Path(cache_dir)
        self.limit = cache_limit
        self.check = check
        self.hold = hold
        self.progress = progress
        self.meta_bytes = self.source.read_meta()
        self.meta = _parse_meta(self.source, self.meta_bytes)
        self.generation = cache.compute_generation(self.meta_bytes)
        key = hashlib.sha256(self.origin.encode() + b"\0" + self.meta_bytes).hexdigest()
        self.root = self.cache / f"{self.source.name}-{key[:16]}"
        fmt = get_format(str(self.meta.get("format")))
        if fmt is None:
            raise StagingError(
                f"{self.source.where(META_NAME)}: format {self.meta.get('format')!r} is not one of "
                f"{', '.join(FORMATS)}"
            )
        self.shards: list[dict[str, Any]] = list(self.meta.get("shards", []))
        # shard -> its files (relative paths) / its top-level entries (a file or a directory),
        # as the format names them; the entries are what the staged directory links.
        self.files = {str(s["name"]): list(fmt.shard_files(str(s["name"]))) for s in self.shards}
        self.entries = {n: sorted({f.split("/", 1)[0] for f in fs}) for n, fs in self.files.items()}
        self.small = [META_NAME, *_present(self.source, DATASET_FILES[1:])]
        if INDEX_NAME not in self.small:
            raise StagingError(
                f"{self.source.where(INDEX_NAME)}: missing; a packed dataset cannot be read "
                "without its index (packer verify)"
            )
        self.sizes: dict[str, dict[str, int]] = {}
        for n, fs in self.files.items():
            try:
                self.sizes[n] = {rel: self.source.size(rel) for rel in fs}
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise StagingError(
                    f"{exc.filename or exc}: missing, though {META_NAME} lists its shard; is the "
                    "dataset complete? (packer verify)"
                ) from None
        self.total_bytes = sum(sum(v.values()) for v in self.sizes.values())
        # the SHA-256 of each shard file, recorded when the dataset was published
        self.digests = shard_digests(self.meta)

    def run(self) -> StageResult:
        """Stage every shard that fits; return what was done."""
        self.cache.mkdir(parents=True, exist_ok=True)
        result = StageResult(self.root)
        use = cache.dataset_lock(self.root)
        use.touch()  # last use, for evicting whole datasets
        fd = hold_shared(use)  # nobody removes the dataset while this process stages it
        try:
            self._ensure_root()
            result.superseded = cache.evict_superseded(self.cache, self.root, str(self.origin))
            for shard in self.shards:
                slot = ShardSlot(self.root, str(shard["name"]))
                self._stage_shard(slot, shard, result)
        finally:
            held = _HELD.setdefault(self.root, {})
            if fd is not None and self.hold and "." not in held:
                held["."] = fd
            elif fd is not None:
                os.close(fd)
        return result

    def _ensure_root(self) -> None:
        """Create the staged dataset directory once, atomically.

        It holds the small files and links to the origin's shards.
        """
        if self.root.is_dir():
            return
        with locked(self.cache / f".{self.root.name}.lock"):
            if self.root.is_dir():
                return
            for stale in self.cache.glob(f"{self.root.name}{TMP_MARK}*"):
                remove(stale)
            tmp = self.cache / f"{self.root.name}{TMP_MARK}{os.getpid()}"
            mode = self.source.dir_mode()
            for sub in ("", STAGING, f"{STAGING}/data", f"{STAGING}/shards"):
                (tmp / sub).mkdir(mode)
            for name in self.small:
                copy_checked(self.source, name, tmp / name)
            self._check_index(tmp)
            write_json_atomic(
                tmp / STAGING / "origin.json",
                {"path": self.origin, "generation": self.generation},
            )
            for entries in self.entries.values():
                for entry in entries:  # a remote shard: dangling until it is copied
                    target = self.source.link_target(entry)
                    os.symlink(target or f"{STAGING}/data/{entry}", tmp / entry)
            fsync_dir(tmp)
            os.rename(tmp, self.root)
            fsync_dir(self.cache)

    def _check_index(self, root: Path) -> None:
        recorded = self.meta.get("index_sha256")
        if not recorded:
            return
        digest = hashlib.sha256()
        with open(root / INDEX_NAME, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        if digest.hexdigest() != recorded:
            self._check_unchanged(INDEX_NAME)
            raise StagingError(
                f"{self.source.where(INDEX_NAME)}: SHA-256 differs from {META_NAME}'s "
                "index_sha256; the index changed after the build (packer verify)"
            )

    def _check_unchanged(self, what: str) -> None:
        """Raise `StagingError` when the origin's meta.json is no longer the one staging read.

        Staging is pinned to the build it opened: a rebuild meanwhile would mix two builds.
        """
        if self.source.read_meta() != self.meta_bytes:
            raise StagingError(
                f"{self.origin} was rebuilt after staging began (its {META_NAME} changed), so "
                f"{what} may be of the new build; stage it again"
            )

    def _stage_shard(self, slot: ShardSlot, shard: dict[str, Any], result: StageResult) -> None:
        name = slot.name
        sizes = self.sizes[name]
        need = sum(sizes.values())
        with locked(slot.copy_lock):
            manifest = read_json(slot.manifest)
            if manifest is not None:
                if self._intact(slot, manifest):
                    os.utime(slot.manifest)  # last use, for LRU eviction
                    self._flip_links(slot)
                    result.reused.append(name)
                    self._advance(need)
                    self._hold(slot)
                    return
                result.repaired.append(name)
            slot.unstage(manifest)
            for entry in self.entries[name]:
                remove(slot.data / entry)
            self._check_meta_size(name, shard, sizes)
            try:
                evicted = cache.reserve(self.cache, slot, need, self.limit)
            except cache.NoRoom as exc:
                if self.source.link_target(name) is None:
                    raise StagingError(
                        f"{self.origin}: shard {name} ({need} bytes) does not fit in "
                        f"{self.cache} under the cache limit ({exc}), and a shard in object "
                        "storage cannot be read in place; raise cache_limit (--limit)"
                    ) from None
                result.origin.append(name)
                self._advance(need)
                return
            result.evicted.extend(f"{s.root.name}/{s.name}" for s in evicted)
            try:
                self._copy(slot)
            finally:
                cache.release(slot)
            result.copied.append(name)
            result.bytes_copied += need
            self._hold(slot)

    def _copy(self, slot: ShardSlot) -> None:
        name = slot.name
        before = {rel: self.source.stamp(rel) for rel in self.sizes[name]}
        files: dict[str, dict[str, Any]] = {}
        temporaries = []
        for entry in self.entries[name]:
            tmp = slot.data / f"{entry}{TMP_MARK}{os.getpid()}"
            temporaries.append((tmp, slot.data / entry))
            inside = [rel for rel in self.files[name] if Path(rel).parts[0] == entry]
            if inside != [entry]:  # a directory (an LMDB environment): its named files only
                tmp.mkdir(self.source.dir_mode(entry))
                for rel in inside:
                    inner = Path(*Path(rel).parts[1:])
                    (tmp / inner).parent.mkdir(parents=True, exist_ok=True)
                    files[rel] = self._copy_file(rel, tmp / inner)
                fsync_dir(tmp)
            else:
                files[entry] = self._copy_file(entry, tmp)
        self._check_unchanged(f"shard {name}")  # a rebuild first: the likelier cause
        after = {rel: self.source.stamp(rel) for rel in self.sizes[name]}
        if after != before:
            raise StagingError(f"{self.origin}: shard {name} changed while it was copied")
        for rel, record in files.items():
            want, got = self.digests.get(rel), record.pop("sha256", None)
            if want is not None and got != want:
                raise StagingError(
                    f"{self.source.where(rel)}: the staged bytes' SHA-256 differs from the one "
                    f"{META_NAME} recorded when the dataset was published: shard {name} was "
                    "replaced or altered since. Check it (packer verify) and publish the "
                    "dataset again (packer build ... --overwrite)"
                )
        for tmp, final in temporaries:
            os.rename(tmp, final)
        fsync_dir(slot.data)
        write_json_atomic(
            slot.manifest,
            {
                "entries": self.entries[name],
                "files": files,
                "origin": before,
                "bytes": sum(f["size"] for f in files.values()),
            },
        )
        self._flip_links(slot)

    def _copy_file(self, rel: str, dst: Path) -> dict[str, Any]:
        """Copy the shard file `rel` to `dst`, with its SHA-256 when meta.json records one."""
        if rel in self.digests:
            return copy_checked(self.source, rel, dst, self.progress, sha256=True)
        return copy_checked(self.source, rel, dst, self.progress)

    def _intact(self, slot: ShardSlot, manifest: dict[str, Any]) -> bool:
        """Say whether the staged copy of `slot` can be used.

        It is used when its origin is unchanged (sizes and mtimes) and its files have their
        recorded sizes (and, with `check`, their recorded CRC-32s).
        """
        try:
            if manifest.get("entries") != self.entries[slot.name]:
                return False
            stamps = {rel: self.source.stamp(rel) for rel in manifest["origin"]}
            if manifest["origin"] != stamps:
                return False
            for rel, record in manifest["files"].items():
                copy = slot.data / rel
                if copy.stat().st_size != record["size"]:
                    return False
                if self.check and crc_file(copy) != record["crc32"]:
                    return False
        except (OSError, KeyError, TypeError, NotRegularFileError):
            return False
        return True

    def _check_meta_size(self, name: str, shard: dict[str, Any], sizes: dict[str, int]) -> None:
        recorded = shard.get("file_bytes")
        if recorded is not None and int(recorded) != sum(sizes.values()):
            found = ", ".join(f"{rel} {size}" for rel, size in sizes.items())
            raise StagingError(
                f"{self.origin}: shard {name}: {META_NAME} records {recorded} bytes of "
                f"shard files, found {found}; the shard changed after the build (packer verify)"
            )

    def _flip_links(self, slot: ShardSlot) -> None:
        for entry in self.entries[slot.name]:
            target = f"{STAGING}/data/{entry}"
            link = self.root / entry
            if os.readlink(link) != target:
                point_link(link, target)
        fsync_dir(self.root)

    def _hold(self, slot: ShardSlot) -> None:
        held = _HELD.setdefault(self.root, {})
        if self.hold and slot.name not in held:
            slot.use_lock.touch()
            fd = hold_shared(slot.use_lock)
            if fd is not None:
                held[slot.name] = fd

    def _advance(self, nbytes: int) -> None:
        if self.progress is not None and nbytes:
            self.progress(nbytes)


def release(root: str | os.PathLike[str]) -> None:
    """Drop this process's use locks on the staged dataset `root`.

    Its shards may then be evicted by other processes.
    """
    for fd in _HELD.pop(Path(root), {}).values():
        with contextlib.suppress(OSError):
            os.close(fd)
