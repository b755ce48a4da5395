"""Publish a finished local dataset to object storage: the data first, ``meta.json`` last.

::

    URL/meta.json                       the last PUT: the dataset exists from then on
    URL/g-<generation>/index.jsonl ...  every other file of the dataset, as on disk

The generation is a digest of the build's plan and index (``plan_digest``, ``index_sha256``
of meta.json), so the same build always goes to the same prefix: ``--resume`` of an
interrupted upload compares the objects already there (size, and for S3 the SHA-256 kept in
the object's metadata) and sends only those missing or different.  ``--overwrite`` uploads
the new generation beside the old one, switches meta.json in one PUT, then deletes the old
generation: readers that staged the old version keep their local copy; one staging it at
that moment fails with a clear error and stages the new one when reopened; none ever mixes
the two. The published meta.json records the SHA-256 of every shard file (``shard_sha256``):
staging checks each copy against it, so a shard replaced out of band is refused by name.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import OutputExistsError, PackerError
from readers.formats import get_format
from readers.formats.layout import META_NAME
from readers.remote import filesystem, join_url, read_small
from readers.remote.dataset import DATA_PREFIX_FIELD, SHARD_DIGESTS_FIELD
from readers.remote.errors import probe, redact

SHA_KEY = "packer-sha256"
"""The S3 user-metadata key that holds an uploaded object's SHA-256 (checked by --resume)."""
PAUSE_ENV = "PACKER_UPLOAD_PAUSE_AFTER"
"""Tests: pause (sleep) once this many objects are uploaded, to be killed mid-upload."""
ATTEMPTS = 4


class UploadError(PackerError):
    """An object could not be uploaded after retries."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"{url}: upload failed after {ATTEMPTS} attempts ({redact(reason)}); nothing was "
            "published (no meta.json written). Run the same packer build again with --resume to "
            "send only what is missing"
        )


class StoreUnreachableError(PackerError):
    """The object store of OUT cannot be reached, is not S3, or lacks the bucket."""


def check_store(url: str, fs: Any, base: str) -> None:
    """Ask the store of `url` once; raise `StoreUnreachableError` when it cannot serve it."""
    unreachable = probe(url, fs, base)
    if unreachable is not None:
        raise StoreUnreachableError(str(unreachable))


@dataclass
class UploadResult:
    """What `publish` did: objects sent and kept (already there), bytes, the old generation."""

    url: str
    prefix: str
    sent: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    removed: str | None = None  # the replaced generation's prefix (--overwrite)
    already_complete: bool = False

    def line(self) -> str:
        """The line ``packer build`` prints about the upload."""
        if self.already_complete:
            return f"{self.url} is already published from the same build: nothing to upload"
        line = (
            f"uploaded {len(self.sent)} object(s) ({self.bytes_sent / 1e6:.1f} MB), "
            f"{len(self.kept)} already there, then {META_NAME} -> {self.url}"
        )
        if self.removed:
            line += f"; removed the replaced generation {self.removed}/"
        return line


def generation_prefix(meta: dict[str, Any]) -> str:
    """The prefix a build's files are published under: ``g-`` and 16 hex digits."""
    text = f"{meta.get('plan_digest')}\0{meta.get('index_sha256')}"
    return "g-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_remote_meta(fs: Any, base: str) -> dict[str, Any] | None:
    """The published meta.json under `base`, or None when there is none (no dataset)."""
    try:
        data = read_small(fs, f"{base}/{META_NAME}")
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        meta = json.loads(data)
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _local_files(root: Path) -> list[str]:
    """The dataset's files besides meta.json, as sorted relative POSIX paths."""
    names = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(root).as_posix()
            if rel != META_NAME:
                names.append(rel)
    return sorted(names)


def _retry(action: Callable[[], Any], url: str) -> Any:
    """Run `action`, retrying transient failures with backoff; UploadError when they last."""
    for attempt in range(ATTEMPTS):
        try:
            return action()
        except (FileNotFoundError, PermissionError):
            raise
        except OSError as exc:  # s3fs maps throttling, resets and 5xx to OSError
            if attempt == ATTEMPTS - 1:
                raise UploadError(url, str(exc) or type(exc).__name__) from exc
            time.sleep(0.25 * 2**attempt)
    raise AssertionError("unreachable")


class _Uploader:
    def __init__(self, fs: Any, base: str, prefix: str, local: Path) -> None:
        self.fs, self.base, self.prefix, self.local = fs, base, prefix, local
        self.s3 = bool({"s3", "s3a"} & set(_protocols(fs)))

    def remote(self, rel: str) -> str:
        return join_url(self.base, self.prefix, rel)

    def is_there(self, rel: str, size: int, sha: str, listing: dict[str, Any]) -> bool:
        info = listing.get(self.remote(rel))
        if info is None or int(info.get("size", -1)) != size:
            return False
        if not self.s3:
            return True  # no object metadata: same generation and size
        try:
            metadata = self.fs.metadata(self.remote(rel))
        except OSError:
            return False
        return bool(metadata.get(SHA_KEY) == sha)

    def send(self, rel: str, sha: str) -> None:
        extra = {"Metadata": {SHA_KEY: sha}} if self.s3 else {}
        path = self.remote(rel)
        _retry(lambda: self.fs.put_file(str(self.local / rel), path, **extra), path)


def _shard_shas(meta: dict[str, Any], shas: dict[str, str]) -> dict[str, str]:
    """The SHA-256 of every shard file that `meta`'s shard table names (staging checks them)."""
    fmt = get_format(str(meta.get("format")))
    if fmt is None:
        return {}
    names = [str(shard["name"]) for shard in meta.get("shards", [])]
    return {rel: shas[rel] for name in names for rel in fmt.shard_files(name) if rel in shas}


def _protocols(fs: Any) -> list[str]:
    protocol = fs.protocol
    return [protocol] if isinstance(protocol, str) else list(protocol)


def publish(
    local: Path,
    url: str,
    *,
    overwrite: bool = False,
    resume: bool = False,
    source: str | None = None,
    storage_options: dict[str, Any] | None = None,
    workers: int = 8,
    log: Callable[[str], None] | None = None,
) -> UploadResult:
    """Upload the finished dataset `local` to `url`: every other file, then meta.json.

    Args:
        local: a dataset directory that ``packer build`` finished.
        url: where to publish it (``s3://bucket/out.lmdb``).
        overwrite: replace a dataset published there (see the module docstring).
        resume: a dataset published there from the same build is fine (nothing to do).
        source: recorded as meta.json's ``source`` (the SRC URL a local mirror stood for).
        storage_options: keyword arguments of the fsspec filesystem.
        workers: objects uploaded at a time (s3fs sends a large file in parts, in parallel).
        log: called with progress lines.

    Raises:
        OutputExistsError: a dataset is published at `url` and neither flag allows it.
        StoreUnreachableError: the store cannot be reached, is not S3, or lacks the bucket.
        UploadError: an object failed after retries (nothing published).
    """
    say = log or (lambda msg: print(msg, file=sys.stderr))
    fs, base = filesystem(url, storage_options)
    meta = json.loads((local / META_NAME).read_text(encoding="utf-8"))
    prefix = generation_prefix(meta)
    result = UploadResult(url=url, prefix=prefix)
    check_store(url, fs, base)
    old = read_remote_meta(fs, base)
    if old is not None and not overwrite:
        if resume and old.get(DATA_PREFIX_FIELD) == prefix:
            result.already_complete = True
            return result
        raise OutputExistsError(url)
    up = _Uploader(fs, base, prefix, local)
    files = _local_files(local)
    try:
        listing = fs.find(join_url(base, prefix), detail=True)
    except FileNotFoundError:
        listing = {}
    listing = {str(k).rstrip("/"): v for k, v in listing.items()}
    sizes = {rel: (local / rel).stat().st_size for rel in files}
    shas = {rel: sha256_file(local / rel) for rel in files}
    todo = []
    for rel in files:
        if listing and up.is_there(rel, sizes[rel], shas[rel], listing):
            result.kept.append(rel)
        else:
            todo.append(rel)
    if result.kept:
        say(f"{url}: {len(result.kept)} object(s) of this build already uploaded, kept")
    pause = int(os.environ.get(PAUSE_ENV, "0") or 0)
    # the largest first: a multipart shard should not be the last one left running
    todo.sort(key=lambda rel: -sizes[rel])
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {pool.submit(up.send, rel, shas[rel]): rel for rel in todo}
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                rel = futures[future]
                result.sent.append(rel)
                result.bytes_sent += sizes[rel]
                if pause and len(result.sent) == pause:
                    say(f"upload paused after {pause} object(s) ({PAUSE_ENV})")
                    time.sleep(3600)
        except BaseException:  # Ctrl-C, a failed upload: only the uploads under way finish
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    result.sent.sort()
    published = dict(meta)
    published[DATA_PREFIX_FIELD] = prefix
    published[SHARD_DIGESTS_FIELD] = _shard_shas(meta, shas)
    if source is not None:
        published["source"] = source
    body = (json.dumps(published, ensure_ascii=False, indent=2) + "\n").encode()
    meta_url = f"{base}/{META_NAME}"
    _retry(lambda: fs.pipe_file(meta_url, body), join_url(url, META_NAME))
    old_prefix = (old or {}).get(DATA_PREFIX_FIELD)
    if isinstance(old_prefix, str) and old_prefix and old_prefix != prefix:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(join_url(base, old_prefix), recursive=True)
        result.removed = old_prefix
    return result
