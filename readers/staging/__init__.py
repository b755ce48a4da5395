"""Node-local staging: copy a packed dataset into a local cache directory once per machine.

The copy from slow or shared storage is shared by every process (DataLoader workers, ranks)
through file locks, each shard checked and renamed into place only when whole, least recently
used shards evicted past a size limit. No paddle import.

``stage(path, cache_dir)`` returns a directory that every reader opens as it opens `path`: the
dataset's small files copied, and each shard a link to its local copy, or to the origin when it
did not fit under `cache_limit`.  Only the files the dataset names are staged, each a regular
file reached through no symbolic link, with at most the origin's permissions; staging a rebuilt
origin removes the copies of its older generations that no process uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from readers.staging.files import Progress, StagingError, parse_size
from readers.staging.stager import Stager, StageResult, release

__all__ = ["StageResult", "Stager", "StagingError", "parse_size", "release", "stage"]


def stage(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    *,
    cache_limit: int | str | None = None,
    check: bool = False,
    hold: bool = True,
    progress: Progress | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Path:
    """Stage the packed dataset `path` into `cache_dir` and return the local dataset directory.

    Args:
        path: a packed dataset directory (``meta.json``, index, shards), or the URL of one
            published in object storage (``s3://bucket/out.lmdb``): every shard is then
            copied (one download per machine), none can be read in place.
        cache_dir: a local directory (``/dev/shm/...``, a local SSD) shared by every process
            of the machine; one subdirectory per dataset (keyed by its path and meta.json);
            those of older builds of `path` are removed when nobody uses them.
        cache_limit: the most bytes the whole cache may hold (``20GiB``); least recently
            used shards of other datasets are evicted to make room, and shards that still do
            not fit are read from the origin.  None: no limit.
        check: also re-read already staged shards and compare their CRC-32s (else sizes).
        hold: keep a shared lock on every staged shard until this process exits (or
            `release`), so that other processes never evict a shard this one uses.
        progress: called with a byte count as shards are copied or found staged.
        storage_options: for a URL: keyword arguments of its fsspec filesystem (credentials,
            endpoint); default: the standard environment variables (``AWS_*``).
    """
    stager = Stager(
        path,
        cache_dir,
        cache_limit=parse_size(cache_limit),
        check=check,
        hold=hold,
        progress=progress,
        storage_options=storage_options,
    )
    return stager.run().root
