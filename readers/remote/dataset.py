"""A packed dataset published in object storage: ``URL/meta.json`` names where the rest lies.

Layout (written by ``packer build SRC s3://bucket/out.lmdb``; DESIGN.md "Object storage")::

    URL/meta.json                  written last: the dataset exists once it is there
    URL/<data_prefix>/index.jsonl  the files of a packed dataset directory, as on disk
    URL/<data_prefix>/shard-00000/data.mdb ...

``data_prefix`` is a field of the published meta.json (``g-<16 hex>``, one per build
content); without it the files lie beside meta.json, as in a dataset copied there by hand
(``aws s3 sync out.lmdb s3://bucket/out.lmdb``).  Readers follow meta.json, so replacing a
dataset writes the new generation under a new prefix and switches meta.json in one PUT.

`RemoteDataset` is what every remote reader uses: staging copies whole files through `open`;
byte-range readers (RecordIO, ShardStream) use `read_range` on the same object names.
"""

from __future__ import annotations

import json
import re
from typing import IO, Any

from readers.errors import DatasetFormatError
from readers.formats.layout import META_NAME
from readers.remote import DatasetNotFoundError, filesystem, join_url, read_small
from readers.remote.errors import endpoint_of, probe, storage_failure

__all__ = ["DATA_PREFIX_FIELD", "SHARD_DIGESTS_FIELD", "RemoteDataset", "shard_digests"]

DATA_PREFIX_FIELD = "data_prefix"
"""The meta.json field (object storage only) naming the prefix that holds the other files."""
SHARD_DIGESTS_FIELD = "shard_sha256"
"""The meta.json field (written by publishing) mapping each shard file's dataset-relative path
(``shard-00000/data.mdb``, ``shard-00000.rec``) to the hex SHA-256 of its bytes; staging checks
every copy against it. Datasets published without it are staged as before (sizes, ETags)."""

_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RemoteDataset:
    """The published dataset at `url`: its meta.json (read once) and its files by name.

    Args:
        url: ``s3://bucket/out.lmdb`` (the dataset's prefix).
        storage_options: keyword arguments of the fsspec filesystem.

    Raises:
        DatasetNotFoundError: no meta.json at `url` (nothing there, or an unfinished upload).
        StorageUnreachableError: the store cannot be reached, is not S3, or has no such bucket.
        DatasetFormatError: meta.json is not a JSON object, or names an unusable prefix.
        StorageExtraMissingError: fsspec/s3fs are not installed.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.path = filesystem(self.url, self.storage_options)
        meta_path = f"{self.path}/{META_NAME}"
        try:
            self.meta_bytes: bytes = read_small(self.fs, meta_path)
        except FileNotFoundError:
            # no meta.json, or no bucket, or a server that is not S3: ask the store which
            raise probe(self.url, self.fs, self.path) or DatasetNotFoundError(self.url) from None
        except IsADirectoryError:
            raise DatasetNotFoundError(self.url, "meta.json is a prefix") from None
        except Exception as exc:
            unreachable = storage_failure(exc, self.url, endpoint_of(self.fs))
            if unreachable is None:
                raise
            raise unreachable from None
        try:
            meta = json.loads(self.meta_bytes)
        except ValueError as exc:
            raise DatasetFormatError(f"{self.where(META_NAME)}: not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise DatasetFormatError(f"{self.where(META_NAME)}: expected a JSON object")
        self.meta: dict[str, Any] = meta
        prefix = meta.get(DATA_PREFIX_FIELD) or ""
        if prefix and (not isinstance(prefix, str) or not _PREFIX.match(prefix)):
            raise DatasetFormatError(
                f"{self.where(META_NAME)}: {DATA_PREFIX_FIELD} {prefix!r} is not a plain name "
                "(letters, digits, '.', '_', '-'); the dataset was not published by packer"
            )
        self.prefix: str = prefix
        self.name = self.path.rsplit("/", 1)[-1]

    def object_path(self, rel: str) -> str:
        """The filesystem path of the dataset file `rel` (``index.jsonl``, ``shard-00000.rec``)."""
        if rel == META_NAME:
            return f"{self.path}/{META_NAME}"
        return join_url(self.path, self.prefix, rel)

    def where(self, rel: str) -> str:
        """The URL of the dataset file `rel`, for messages."""
        if rel == META_NAME:
            return join_url(self.url, META_NAME)
        return join_url(self.url, self.prefix, rel)

    def stat(self, rel: str) -> dict[str, Any]:
        """``{"size": bytes, "etag": str}`` of the object `rel` (a change of either = changed).

        Raises:
            FileNotFoundError: no such object.
        """
        info = self.fs.info(self.object_path(rel))
        if info.get("type") == "directory":
            raise FileNotFoundError(self.where(rel))
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("mtime")
        return {"size": int(info["size"]), "etag": str(tag or "")}

    def open(self, rel: str) -> IO[bytes]:
        """A binary, seekable file object reading the object `rel` (sequentially: large blocks)."""
        f: IO[bytes] = self.fs.open(
            self.object_path(rel), "rb", block_size=8 << 20, cache_type="readahead"
        )
        return f

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``start..end-1`` of the object `rel`, in one ranged GET."""
        data: bytes = self.fs.cat_file(self.object_path(rel), start=start, end=end)
        return data


def shard_digests(meta: dict[str, Any]) -> dict[str, str]:
    """The ``SHARD_DIGESTS_FIELD`` map of `meta` (empty when absent or not a map of strings)."""
    digests = meta.get(SHARD_DIGESTS_FIELD)
    if not isinstance(digests, dict):
        return {}
    return {str(k): v.lower() for k, v in digests.items() if isinstance(v, str)}
