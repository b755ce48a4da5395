"""Object-store failures told in one line: no connection, not an S3 server, no such bucket.

`storage_failure(exc, url)` reads an exception chain (botocore, aiohttp, s3fs) and returns the
`StorageUnreachableError` that names the dataset's URL, the endpoint and the fix, or None when
the failure is something else. `probe(url, fs)` asks the store once (a listing of at most one
key under the URL's prefix) and returns that error when the store cannot serve the URL: it tells
a missing ``meta.json`` from a missing bucket or a server that is not S3. `redact(text)` drops
URL query strings (a presigned URL's signature, credential and session token) and userinfo.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from readers.errors import ReaderError

__all__ = ["StorageUnreachableError", "endpoint_of", "probe", "redact", "storage_failure"]

_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s?#'\"<>]*)\?[^\s'\"<>)]*")
_SIGNED = re.compile(
    r"(?i)\b(X-Amz-[A-Za-z-]+|Signature|AWSAccessKeyId|x-amz-security-token)=[^&\s'\"<>]*"
)
_USERINFO = re.compile(r"(://)[^/\s@'\"<>]+@")
_CONNECT = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ProxyConnectionError",
    "SSLError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "ClientConnectorSSLError",
    "ConnectionRefusedError",
    "gaierror",
}
_NOT_S3_CODES = {"NotImplemented", "MethodNotAllowed", "NotFound"}


class StorageUnreachableError(ReaderError):
    """The object store of a URL cannot serve it: no connection, not S3, or no such bucket."""


def redact(text: str) -> str:
    """`text` without URL query strings, signed-request parameters or URL userinfo."""
    text = _QUERY.sub(r"\1", text)
    text = _SIGNED.sub(r"\1=<redacted>", text)
    return _USERINFO.sub(r"\1", text)


def endpoint_of(fs: Any = None) -> str:
    """The endpoint `fs` (or the environment) sends requests to, for messages (no secrets)."""
    endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url") or (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    if not endpoint:
        return "AWS S3 (no AWS_ENDPOINT_URL set)"
    return redact(str(endpoint)).rstrip("/")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        yield at
        at = at.__cause__ or at.__context__


def _bucket(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def storage_failure(
    exc: BaseException, url: str, endpoint: str | None = None
) -> StorageUnreachableError | None:
    """The one-line error for `exc` when it says the store cannot serve `url`, else None.

    Args:
        exc: the exception raised by a request (its whole chain is read).
        url: the dataset or SRC URL the request was for (named in the message).
        endpoint: the endpoint, for the message (default: from the environment).
    """
    where = endpoint or endpoint_of()
    fix = "check AWS_ENDPOINT_URL (or storage_options' client_kwargs endpoint_url)"
    for error in _chain(exc):
        name = type(error).__name__
        if name in _CONNECT:
            reason = redact(str(error)).split(" [", 1)[0] or name
            return StorageUnreachableError(
                f"{url}: cannot connect to the object store at {where} ({name}: "
                f"{reason[:200]}); {fix}, and that the store is running and reachable"
            )
        if name == "ResponseParserError":
            return StorageUnreachableError(
                f"{url}: {where} did not answer as an S3 server (its reply is not S3's XML); "
                f"{fix}: it must be the address of the S3 API"
            )
        response = getattr(error, "response", None)
        if not isinstance(response, dict):
            continue
        code = str((response.get("Error") or {}).get("Code", ""))
        operation = str(getattr(error, "operation_name", ""))
        if code == "NoSuchBucket":
            bucket = _bucket(url)
            return StorageUnreachableError(
                f"{url}: the bucket {bucket} does not exist at {where}; create it (aws s3 mb "
                f"s3://{bucket}) or fix the URL, or {fix}"
            )
        if code in _NOT_S3_CODES or (code.isdigit() and not operation.startswith("Head")):
            # S3 names its errors (NoSuchKey, AccessDenied): a bare HTTP status to a request
            # with a body is a server that is not S3 (a web server, a proxy's error page)
            return StorageUnreachableError(
                f"{url}: {where} did not answer as an S3 server (HTTP {code} to {operation}); "
                f"{fix}: it must be the address of the S3 API"
            )
    return None


def probe(url: str, fs: Any, path: str) -> StorageUnreachableError | None:
    """Ask the store behind `fs` for one key under `path`; the error if it cannot serve `url`.

    Only S3 (s3fs) filesystems are asked; any other returns None.
    """
    if not hasattr(fs, "_call_s3"):
        return None
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)
    try:
        sync(fs.loop, fs._call_s3, "list_objects_v2", Bucket=bucket, Prefix=key, MaxKeys=1)
    except Exception as exc:
        return storage_failure(exc, url, endpoint_of(fs))
    return None
