"""Open a packed dataset in object storage in place: its small files fetched, shards by range.

`RemoteShards` reads ``meta.json`` (`readers.remote.dataset.RemoteDataset`: without it there is
no dataset), downloads the index (a few MB at most) and loads it as for a local dataset, and
notes the size and ETag of every shard object.
`record_ranges` and `run_pieces` map sample ids to byte ranges of the shard objects: one record
each, or a run of records in pieces of at most `PIECE_BYTES` cut at record boundaries.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import DatasetFormatError
from readers.formats.base import ShardFormat
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from readers.index import DatasetIndex
from readers.io.ranges import PIECE_BYTES, RangeCache, RemoteObjects, credentials_error
from readers.remote.dataset import RemoteDataset

__all__ = ["RemoteShards", "open_published", "open_remote_index", "record_ends", "run_pieces"]


def open_published(url: str, storage_options: dict[str, Any] | None) -> RemoteDataset:
    """`RemoteDataset` at `url`; a refused request says what to do about the credentials."""
    try:
        return RemoteDataset(url, storage_options)
    except PermissionError as exc:
        raise credentials_error(f"{url.rstrip('/')}/{META_NAME}", exc) from exc


def open_remote_index(remote: RemoteDataset, fmt: ShardFormat) -> DatasetIndex:
    """The index of the published dataset `remote`, loaded as for a local dataset.

    Raises:
        DatasetFormatError: the index does not load or is of another format.
        RemoteCredentialsError: the store refused the request.
    """
    from readers.datasets.base import load_packed_index
    from readers.index import load_meta

    with tempfile.TemporaryDirectory(prefix="packer-remote-") as tmp:
        (Path(tmp) / META_NAME).write_bytes(remote.meta_bytes)
        for name in (INDEX_COLUMNAR_NAME, INDEX_NAME):
            try:
                data = remote.fs.cat_file(remote.object_path(name))
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                raise credentials_error(remote.where(name), exc) from exc
            (Path(tmp) / name).write_bytes(data)
        return load_packed_index(Path(tmp), fmt, load_meta(Path(tmp)))


class RemoteShards:
    """The shard objects of a packed dataset opened in place, and the ranges read of them.

    Args:
        url: the dataset's URL (``s3://bucket/prefix``): its ``meta.json`` names where the
            other files lie (`readers.remote.dataset.RemoteDataset`).
        storage_options: options of the fsspec filesystem.
        fmt: the dataset's format.

    Raises:
        DatasetNotFoundError: no ``meta.json`` at `url`.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None, fmt: ShardFormat):
        remote = open_published(url, storage_options)
        self.url = remote.url
        self.index = open_remote_index(remote, fmt)
        rels = [fmt.data_file(fmt.shard_path(Path(), name)) for name in self.index.shard_names]
        self.objects = RemoteObjects(
            url,
            storage_options,
            [remote.object_path(rel) for rel in rels],
            [remote.where(rel) for rel in rels],
        )
        self.cache = RangeCache(self.objects)
        self.sizes = np.asarray([o.size for o in self.objects.objects], dtype=np.int64)

    @property
    def shard_urls(self) -> list[str]:
        """The URL of every shard object, in shard order."""
        return [o.url for o in self.objects.objects]


def run_pieces(
    begins: np.ndarray, ends: np.ndarray, *, piece: int = PIECE_BYTES
) -> list[tuple[int, int]]:
    """Byte ranges covering records ``[begins[k], ends[k])`` (ascending), cut at record bounds.

    Each range is at most `piece` bytes unless one record is larger.
    """
    if begins.size == 0:
        return []
    group = (begins - begins[0]) // piece
    _, first = np.unique(group, return_index=True)
    last = np.append(first[1:], begins.size) - 1
    return [(int(begins[a]), int(ends[b])) for a, b in zip(first, last, strict=True)]


def record_ends(offsets: np.ndarray, bounds: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Where each packed record ends: the next record's offset, the object's size for the last.

    Raises:
        DatasetFormatError: offsets of a shard not increasing, or past its object's end.
    """
    ends = np.empty_like(offsets)
    for shard in range(len(bounds) - 1):
        lo, hi = int(bounds[shard]), int(bounds[shard + 1])
        if hi <= lo:
            continue
        part = offsets[lo:hi]
        if np.any(np.diff(part) <= 0) or int(part[-1]) >= int(sizes[shard]):
            raise DatasetFormatError(
                f"shard {shard}: the index's offsets are not increasing inside the object's "
                f"{int(sizes[shard])} bytes; is the index from another build, or the object "
                "cut short? re-upload the dataset"
            )
        ends[lo : hi - 1] = part[1:]
        ends[hi - 1] = sizes[shard]
    return ends
