"""A whole S3 object copied into a local file by several ranged GETs in flight, checked.

One GET at a time (s3fs's file, 8 MiB blocks read ahead one after another) leaves the link idle
while each block is written and checked. Here `THREADS` GETs of `PIECE_BYTES` are in flight
(`readers.io.ranges.RemoteObjects`: direct GETs, exact lengths, retries of lost connections and
short bodies, errors that name the object), and the pieces are written and CRC-ed in order as
they arrive; at most `2 x THREADS` pieces are held.

The bytes are then checked against what the store says of the whole object: its full-object
CRC-32 (``x-amz-checksum-crc32``, which S3 keeps for objects uploaded with it), else the
SHA-256 that ``packer build s3://...`` stores in the object's metadata (``packer-sha256``). A
mismatch raises `StagingError` (stage again; if it persists, re-upload). An object with
neither is checked by its size, as before; the stager compares sizes and ETags before and after.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from readers.errors import ReaderError
from readers.fastzlib import crc32
from readers.io.ranges import (
    PIECE_BYTES,
    RemoteCredentialsError,
    RemoteObjects,
    RemoteReadError,
    credentials_error,
)
from readers.remote.errors import redact
from readers.staging.files import Progress, StagingError

__all__ = ["SHA_METADATA", "THREADS", "download", "supports"]

THREADS = 4
"""Ranged GETs in flight while a file is staged."""
SHA_METADATA = "packer-sha256"
"""The object metadata key holding the hex SHA-256 of the object (``packer.publish.SHA_KEY``)."""


def supports(fs: Any) -> bool:
    """Whether objects of `fs` are staged by `download` (S3 through s3fs); else one GET a time."""
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return False
    return isinstance(fs, S3FileSystem)


def _expected(fs: Any, path: str) -> tuple[int | None, str | None]:
    """The object's full-object CRC-32 and metadata SHA-256 (hex), each None when not kept."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)
    head = sync(fs.loop, fs._call_s3, "head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    crc: int | None = None
    value = head.get("ChecksumCRC32")
    if value and "-" not in value and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        crc = int.from_bytes(base64.b64decode(value), "big")  # not one of parts ("...-N")
    sha = (head.get("Metadata") or {}).get(SHA_METADATA)
    return crc, (str(sha).lower() if sha else None)


def download(
    fs: Any, path: str, where: str, out: IO[bytes], progress: Progress | None = None
) -> dict[str, int]:
    """Write the object `path` of `fs` to `out`; return ``{"size": ..., "crc32": ...}``.

    Args:
        fs: the s3fs filesystem.
        path: the object's path in it.
        where: its URL, for messages.
        out: a binary file open for writing, at its start.
        progress: called with the number of bytes of each piece written.

    Raises:
        StagingError: the bytes do not match the object's checksum, or could not be read.
        RemoteCredentialsError: the store refused the requests.
    """
    try:
        objects = RemoteObjects(where, None, [path], [where], fs=fs)
        crc_expected, sha_expected = _expected(fs, path)
    except PermissionError as exc:
        raise credentials_error(where, exc) from exc
    except (FileNotFoundError, RemoteReadError) as exc:
        raise StagingError(f"{where}: cannot be staged ({redact(str(exc))})") from exc
    size = objects.objects[0].size
    digest = hashlib.sha256() if sha_expected and crc_expected is None else None
    crc = 0
    starts = range(0, size, PIECE_BYTES)
    held: deque[Future[Any]] = deque()
    with ThreadPoolExecutor(THREADS, thread_name_prefix="packer-stage") as pool:
        try:
            for at in [*starts, None]:
                if at is not None:
                    held.append(pool.submit(objects.read, 0, at, min(at + PIECE_BYTES, size)))
                while held and (at is None or len(held) >= 2 * THREADS or held[0].done()):
                    for chunk in held.popleft().result().chunks:
                        crc = crc32(chunk, crc)
                        if digest is not None:
                            digest.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
        except RemoteCredentialsError:
            raise
        except ReaderError as exc:
            raise StagingError(f"{exc}; stage again") from exc
        finally:
            for future in held:
                future.cancel()
    got = None
    if crc_expected is not None and crc != crc_expected:
        got, want = f"CRC-32 {crc:08x}", f"{crc_expected:08x}"
    elif digest is not None and digest.hexdigest() != sha_expected:
        got, want = f"SHA-256 {digest.hexdigest()}", str(sha_expected)
    if got is not None:
        raise StagingError(
            f"{where}: the bytes received do not match the object's checksum ({got}, the store "
            f"says {want}); stage again (a transfer error), and if it persists re-upload the "
            "object"
        )
    return {"size": size, "crc32": crc}
