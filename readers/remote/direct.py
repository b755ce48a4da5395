"""Ranged GETs of S3 objects sent over s3fs's own HTTP session, each body kept as received.

s3fs sends every request through aiobotocore's pipeline (parameter checks, endpoint rules,
signing, event hooks, response parsing): 3-4 ms of CPU per GET on a 2-core machine, for a range
of 8 MiB as for one of 8 KB, and then joins the body into one new ``bytes`` (a copy of every
byte, and fresh memory to fault in). `DirectGets` asks that same client once per object for a
presigned GET URL (its credentials, region, endpoint, addressing style and signature version),
then sends each range as a GET with a ``Range`` header over the client's own HTTP session (its
connector: proxies, TLS verification and CA bundle, timeouts, connection pool): about 1 ms of
CPU. The body is kept as the chunks aiohttp received, never joined.

Only a 206 answer whose ``Content-Range`` starts and ends where asked is used. Any other answer
(403 for expired credentials, 404, 412, 503 SlowDown, ...) raises `DirectRefused` without its
body being read, and the caller sends that request through s3fs, whose retries and error
translation then decide; the object's URL is presigned again after such an answer, and always
before it is `RESIGN_S` old. A broken or short body is the caller's to retry, like one from s3fs;
a transfer error is raised as `DirectTransferError`, whose text holds no presigned URL.
A filesystem that adds parameters to its requests (requester pays, SSE-C keys, versions, any
``s3_additional_kwargs``) is not served: `DirectGets.for_fs` returns None.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

__all__ = ["DirectGets", "DirectRefused", "DirectTransferError"]

EXPIRES_S = 3600
"""How long a presigned URL is valid (its signature's ``X-Amz-Expires``)."""
RESIGN_S = 1800
"""A URL this old is presigned again before its next use (temporary credentials may expire
sooner: a 403 then makes the next request go through s3fs, which signs it anew)."""

_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class DirectRefused(Exception):  # not an error: the request is then made through s3fs
    """The store answered a direct GET with something else than the range: ask s3fs instead."""


class DirectTransferError(ConnectionError):
    """A direct GET failed in transfer (a lost connection, a timeout), told without its URL.

    The client's errors carry the presigned URL (its signature, access key id and session
    token); this one carries the error's type and its text with every URL's query string
    removed, and chains to nothing.
    """


class DirectGets:
    """Ranged GETs of the objects of one s3fs filesystem, over its client's HTTP session.

    Make it with `for_fs`; use it from any thread but the filesystem's event loop (`get`
    waits for the loop, as s3fs's own blocking calls do).
    """

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._urls: dict[str, tuple[str, float]] = {}  # path -> (presigned URL, when)
        self.sent = 0
        """Direct GETs sent by this process."""
        self.usable = True
        """False once the client cannot presign or its session is not aiohttp's: s3fs only."""

    @classmethod
    def for_fs(cls, fs: Any) -> DirectGets | None:
        """A `DirectGets` for `fs`, or None when `fs` is not a plain s3fs filesystem."""
        try:
            from s3fs import S3FileSystem
        except ImportError:
            return None
        if os.environ.get("PACKER_S3_DIRECT", "1") == "0":
            return None
        if not isinstance(fs, S3FileSystem):
            return None
        if fs.req_kw or fs.s3_additional_kwargs or fs.version_aware:
            return None  # parameters a presigned URL would have to carry: s3fs sends those
        return cls(fs)

    def forget(self, path: str) -> None:
        """Presign `path` again before its next direct GET (its URL was refused)."""
        self._urls.pop(path, None)

    def get(self, path: str, begin: int, end: int) -> list[bytes]:
        """The body of a GET of bytes ``[begin, end)`` of `path`, as the chunks received.

        A body cut short returns fewer bytes (the caller checks the length).

        Raises:
            DirectRefused: the store answered otherwise than with that range.
            DirectTransferError: a transfer error (a lost connection, a timeout), without the
                presigned URL in its text.
        """
        from fsspec.asyn import sync

        chunks: list[bytes] = sync(self.fs.loop, self._get, path, begin, end)
        return chunks

    async def _client(self, bucket: str) -> Any:
        await self.fs.set_session()
        return await self.fs.get_s3(bucket)

    async def _url(self, client: Any, path: str, bucket: str, key: str) -> str:
        known = self._urls.get(path)
        if known is not None and time.monotonic() - known[1] < RESIGN_S:
            return known[0]
        url = await client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES_S
        )
        self._urls[path] = (str(url), time.monotonic())
        return str(url)

    async def _get(self, path: str, begin: int, end: int) -> list[bytes]:
        from botocore.awsrequest import AWSPreparedRequest  # type: ignore[import-untyped]

        bucket, key, _ = self.fs.split_path(path)
        client = await self._client(bucket)
        try:
            url = await self._url(client, path, bucket, key)
            session = client._endpoint.http_session
        except Exception as exc:  # no presigning with this client
            self.usable = False
            raise DirectRefused(f"cannot presign ({exc!r})") from exc
        request = AWSPreparedRequest(
            "GET", url, {"Range": f"bytes={begin}-{end - 1}"}, None, stream_output=True
        )
        self.sent += 1
        try:
            return await self._send(session, request, path, begin, end)
        except DirectRefused:
            raise
        except Exception as exc:
            from readers.remote.errors import redact

            error = DirectTransferError(f"{type(exc).__name__}: {redact(str(exc))}")
        raise error  # outside the handler: no __context__ holding the presigned URL

    async def _send(
        self, session: Any, request: Any, path: str, begin: int, end: int
    ) -> list[bytes]:
        """Send `request` over `session`; the body's chunks, or `DirectRefused`."""
        response = await session.send(request)
        raw = response.raw
        content: Any = getattr(raw, "content", None)
        if not hasattr(content, "readchunk"):  # another HTTP backend (httpx)
            self.usable = False
            raw.close()
            raise DirectRefused("not an aiohttp response")
        if response.status_code != 206 or not _is_range(response.headers, begin, end):
            raw.close()  # unread: s3fs asks again and reads the error
            self.forget(path)
            raise DirectRefused(f"HTTP {response.status_code}")
        chunks: list[bytes] = []
        try:
            while True:
                chunk, boundary = await content.readchunk()
                if chunk:
                    chunks.append(chunk)
                elif not boundary:  # (b"", True) is the end of an HTTP chunk; (b"", False) EOF
                    break
        except BaseException:
            raw.close()
            raise
        raw.release()
        return chunks


def _is_range(headers: Any, begin: int, end: int) -> bool:
    """Whether `headers` say that the body holds bytes ``[begin, end)`` exactly."""
    match = _RANGE.match(str(headers.get("content-range", "")))
    return match is not None and (int(match[1]), int(match[2])) == (begin, end - 1)
