"""``packer build|verify|info`` with URLs: a local work directory on each side of the network.

- SRC URL: its objects are listed and downloaded concurrently (`packer.mirror.mirror_source`)
  into a local tree with the same relative paths, which the normal build reads: labels, errors
  and the order are those of a local tree, because the tree is the same.
- OUT URL: the normal build writes a local dataset in the work directory, then
  `packer.publish.publish` uploads it, ``meta.json`` last. The work directory outlives a kill,
  so ``--resume`` finds the finished local build (or its finished shards) and uploads only
  what is missing; it is removed once the dataset is published.
- verify: the dataset is staged into a temporary cache (checked, as readers stage it) and the
  staged copy verified; info: only meta.json and the index are downloaded.

The work directory is ``PACKER_WORK_DIR``, else ``~/.cache/packer/work``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.feedback import on_interrupt
from packer.mirror import mirror_source
from packer.publish import UploadResult, check_store, publish, read_remote_meta
from readers.files import DATASET_FILES
from readers.formats.layout import META_NAME
from readers.remote import filesystem


def work_root() -> Path:
    """Where builds to and from URLs keep their local files."""
    explicit = os.environ.get("PACKER_WORK_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packer" / "work"


def _slot(kind: str, url: str) -> Path:
    """A work directory of its own for `url` (the same one on every run)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    name = url.rstrip("/").rsplit("/", 1)[-1] or "root"
    return work_root() / f"{kind}-{name}-{digest}"


def build_remote(
    src: str,
    out: str,
    make_build: Callable[[Path, Path], Any],
    *,
    src_is_url: bool,
    out_is_url: bool,
    overwrite: bool,
    resume: bool,
    log: Callable[[str], None],
) -> tuple[Any, UploadResult | None]:
    """Run a build whose SRC or OUT (or both) is a URL.

    Args:
        src: SRC as given (a URL or a local path).
        out: OUT as given.
        make_build: runs the normal build from a local SRC into a local OUT and returns its
            `BuildSummary`.
        src_is_url: SRC is a URL (mirrored first).
        out_is_url: OUT is a URL (built locally, then published).
        overwrite: --overwrite.
        resume: --resume.
        log: progress lines.

    Returns:
        The build's summary and, for an OUT URL, what the upload did.
    """
    local_src = Path(src)
    mirror = None
    if out_is_url:  # before building: the store must be there to take the result
        fs, base = filesystem(out)
        check_store(out, fs, base)
    if out_is_url and not overwrite and not resume and read_remote_meta(fs, base) is not None:
        from packer.errors import OutputExistsError

        raise OutputExistsError(out)
    if src_is_url:
        mirror = _slot("src", src) / (src.rstrip("/").rsplit("/", 1)[-1] or "src")
        count = mirror_source(src, mirror)
        log(f"downloaded {count} object(s) of {src}")
        local_src = mirror
    try:
        if not out_is_url:
            return make_build(local_src, Path(out)), None
        work = _slot("out", out)
        local_out = work / (out.rstrip("/").rsplit("/", 1)[-1] or "out")
        if local_out.exists() and not resume:
            shutil.rmtree(local_out)  # a build left by an earlier run: start over
        work.mkdir(parents=True, exist_ok=True)
        summary = make_build(local_src, local_out)
        with on_interrupt(
            f"{out} is not published (no {META_NAME} there); the local build {local_out} and "
            "the objects uploaded so far are kept: run the same command with --resume to finish"
        ):
            upload = publish(
                local_out,
                out,
                overwrite=overwrite,
                resume=resume,
                source=src if src_is_url else None,
                log=log,
            )
        shutil.rmtree(work, ignore_errors=True)
        return summary, upload
    finally:
        if mirror is not None:
            shutil.rmtree(mirror.parent, ignore_errors=True)


def fetch_small_files(url: str, dest: Path) -> Path:
    """Download meta.json and the index files of the dataset at `url` into `dest`.

    Returns `dest`, laid out as a dataset directory without its shards.

    Raises:
        DatasetNotFoundError: no meta.json at `url`.
    """
    from readers.remote.dataset import RemoteDataset

    remote = RemoteDataset(url)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / META_NAME).write_bytes(remote.meta_bytes)
    for name in DATASET_FILES[1:]:
        try:
            data = remote.fs.cat_file(remote.object_path(name))
        except FileNotFoundError:
            continue
        (dest / name).write_bytes(data)
    return dest


def describe_url(url: str) -> dict[str, Any]:
    """`packer.info.describe` of the dataset at `url`, from its meta.json and index only."""
    from packer.info import describe

    with tempfile.TemporaryDirectory(prefix="packer-info-") as tmp:
        root = fetch_small_files(url, Path(tmp) / "dataset")
        summary = describe(root)
    text = str(root)
    summary["path"] = url
    summary["meta_problems"] = [p.replace(text, url) for p in summary.get("meta_problems", [])]
    return summary


def verify_url(url: str, *, deep: bool, notes: list[str] | None = None) -> list[str]:
    """`packer.verify.verify` of the dataset at `url`, staged into a temporary cache first.

    Staging checks each shard's size against meta.json and the index's SHA-256; verify then
    re-reads every record. Problems name the URL, not the temporary copy.

    Raises:
        StorageUnreachableError: the store cannot be reached, is not S3, or lacks the bucket.
    """
    from packer.verify import verify
    from readers.errors import ReaderError
    from readers.remote.errors import StorageUnreachableError
    from readers.staging import stage

    with tempfile.TemporaryDirectory(prefix="packer-verify-") as tmp:
        try:
            root = stage(url, Path(tmp) / "cache", hold=False)
        except StorageUnreachableError:
            raise  # not a problem of the dataset: the command fails (packer: error: ...)
        except ReaderError as exc:
            return [str(exc)]
        found: list[str] = []
        problems = verify(root, deep=deep, notes=found)
        if notes is not None:
            notes.extend(n.replace(str(root), url) for n in found)
        return [p.replace(str(root), url) for p in problems]
