"""Open a packed dataset in object storage in place: its small files fetched, shards by range.

`open_remote_index` downloads ``meta.json`` and the index (a few MB at most) and loads them as
for a local dataset; a dataset without ``meta.json`` does not exist (it is uploaded last).
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
from readers.io.ranges import PIECE_BYTES, RangeCache, RemoteObjects, _credentials_error, open_fs

__all__ = ["RemoteShards", "open_remote_index", "record_ends", "run_pieces"]


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def open_remote_index(
    fs: Any, root: str, url: str, fmt: ShardFormat
) -> tuple[DatasetIndex, dict[str, Any]]:
    """The index of the packed dataset at `root` of `fs` (`url` names it in messages).

    Raises:
        DatasetFormatError: no ``meta.json`` (not a published dataset), or the index does not
            load or is of another format.
        RemoteCredentialsError: the store refused the request.
    """
    from readers.datasets.base import load_packed_index
    from readers.index import load_meta

    with tempfile.TemporaryDirectory(prefix="packer-remote-") as tmp:
        for name in (META_NAME, INDEX_COLUMNAR_NAME, INDEX_NAME):
            try:
                data = fs.cat_file(_join(root, name))
            except FileNotFoundError as exc:
                if name == META_NAME:
                    raise DatasetFormatError(
                        f"{url}: no {META_NAME}, so no published packer dataset (a build is "
                        f"uploaded with {META_NAME} last: is the upload still running, or did "
                        "it fail? publish it again)"
                    ) from exc
                continue
            except PermissionError as exc:
                raise _credentials_error(_join(url, name), exc) from exc
            (Path(tmp) / name).write_bytes(data)
        meta = load_meta(Path(tmp))
        return load_packed_index(Path(tmp), fmt, meta), meta


class RemoteShards:
    """The shard objects of a packed dataset opened in place, and the ranges read of them.

    Args:
        url: the dataset's URL (``s3://bucket/prefix``).
        storage_options: options of the fsspec filesystem.
        fmt: the dataset's format.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None, fmt: ShardFormat):
        self.url = url.rstrip("/")
        fs, root = open_fs(url, storage_options)
        self.index, self.meta = open_remote_index(fs, root, url, fmt)
        names = self.index.shard_names
        paths = [fmt.data_file(_join(root, fmt.shard_path(Path(), n))) for n in names]
        self.objects = RemoteObjects(url, storage_options, paths)
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
