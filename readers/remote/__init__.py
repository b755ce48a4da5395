"""Datasets in object storage: URLs (``s3://bucket/prefix``, any fsspec protocol) to filesystems.

``is_url(path)`` says whether a dataset path is a URL; ``filesystem(url)`` returns the fsspec
filesystem and the path inside it, importing fsspec (and s3fs for ``s3://``) only then, with a
`StorageExtraMissingError` that names ``pip install fsspec s3fs`` when they are missing.
Credentials and the endpoint come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ...), which botocore
reads itself, or from ``storage_options`` (passed to the fsspec filesystem, e.g.
``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}``).

A published dataset is `RemoteDataset` (``readers/remote/dataset.py``): its ``meta.json`` is
what makes it exist; the rest lies under the prefix that meta.json names. A store that cannot
serve a URL at all (no connection, not S3, no such bucket) raises
`readers.remote.errors.StorageUnreachableError`, one line naming the URL, the endpoint and the fix;
no error text carries a credential or a URL's query string (`readers.remote.errors.redact`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from readers.errors import ReaderError

__all__ = [
    "EXTRA_HINT",
    "DatasetNotFoundError",
    "StorageExtraMissingError",
    "filesystem",
    "is_url",
    "join_url",
    "read_small",
    "s3_session",
]

EXTRA_HINT = "pip install fsspec s3fs (from a packer clone: pip install '.[s3]')"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# protocols whose fsspec implementation lives in a package of its own, and that package
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hdfs": "pyarrow"}


class StorageExtraMissingError(ModuleNotFoundError):
    """A URL was given, but the object-storage packages (fsspec, s3fs) are not installed."""

    def __init__(self, url: str, package: str) -> None:
        super().__init__(
            f"{url}: reading or writing object storage needs the package {package}, which is "
            f"not installed; install the extra: {EXTRA_HINT}"
        )
        self.name = package


class DatasetNotFoundError(ReaderError):
    """No published dataset at a URL: its ``meta.json`` is missing."""

    def __init__(self, url: str, reason: str = "") -> None:
        super().__init__(
            f"{url}: no dataset there (no meta.json{': ' + reason if reason else ''}); a "
            "dataset in object storage exists once its upload wrote meta.json last. If an "
            "upload was interrupted, run the same packer build again with --resume"
        )
        self.url = url


def is_url(path: str | os.PathLike[str]) -> bool:
    """Say whether `path` is a URL (``s3://...``, ``gs://...``) rather than a local path.

    ``file://`` URLs count as URLs too: they go through fsspec like any other protocol.
    """
    return isinstance(path, str) and _URL.match(path) is not None


def protocol_of(url: str) -> str:
    """The protocol of `url`: ``s3`` for ``s3://bucket/key``."""
    return url.split("://", 1)[0].lower()


def join_url(url: str, *parts: str) -> str:
    """`url` with the relative POSIX paths `parts` appended, one slash between each."""
    out = url.rstrip("/")
    for part in parts:
        if part:
            out = f"{out}/{part.strip('/')}"
    return out


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """Return ``(fsspec filesystem, path inside it)`` for `url`.

    Args:
        url: ``s3://bucket/prefix`` or any URL of an installed fsspec protocol.
        storage_options: keyword arguments of the filesystem (credentials, endpoint, ...);
            without them the standard environment variables of the protocol apply.

    Raises:
        StorageExtraMissingError: fsspec, or the protocol's package (s3fs), is not installed.
    """
    try:
        import fsspec.core
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "fsspec":
            raise
        raise StorageExtraMissingError(url, "fsspec") from None
    options = dict(storage_options or {})
    protocol = protocol_of(url)
    if protocol in ("s3", "s3a"):
        _endpoint_from_env(options)
        # another process may publish or replace objects: ask S3, not a listing read earlier
        options.setdefault("use_listings_cache", False)
        if "session" not in options and "profile" not in options:
            options["session"] = s3_session()
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        package = _PACKAGES.get(protocol, getattr(exc, "name", None) or protocol)
        raise StorageExtraMissingError(url, package) from None
    except ValueError as exc:  # an unknown protocol
        raise ReaderError(f"{url}: {exc}") from None
    return fs, str(path).rstrip("/")


_LOADER: Any = None  # botocore's data loader, its parsed models kept across fork
_SESSION: tuple[int, Any] | None = None  # (pid, the aiobotocore session of that process)


def s3_session() -> Any:
    """The aiobotocore session of s3fs filesystems made in this process.

    One per process (fsspec's async clients are not fork-safe), made with the data loader of
    the first one: a process forked from one that used S3 (a DataLoader worker, each epoch)
    makes its client from the service models parsed there, in 5-10 ms of CPU instead of
    100-140 ms (botocore's JSON models and endpoint rules parsed again). Credentials are the
    session's, resolved once per process, as they were by the one filesystem fsspec kept per
    URL and options.
    """
    global _LOADER, _SESSION
    if _SESSION is not None and _SESSION[0] == os.getpid():
        return _SESSION[1]
    from aiobotocore.session import AioSession  # type: ignore[import-untyped]

    session = AioSession()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    _SESSION = (os.getpid(), session)
    return session


def read_small(fs: Any, path: str) -> bytes:
    """All bytes of the small object at `path` (a ``meta.json``) in one request.

    s3fs's ``cat_file`` first asks the object's size (a HEAD) to split a large object into
    concurrent ranged GETs (its ``max_concurrency``); for a file of a few KB that doubles the
    requests, so it is told to make one GET.

    Raises:
        FileNotFoundError: no such object.
    """
    if int(getattr(fs, "max_concurrency", 1)) > 1:
        data: bytes = fs.cat_file(path, max_concurrency=1)
    else:
        data = fs.cat_file(path)
    return data


def _endpoint_from_env(options: dict[str, Any]) -> None:
    """Pass ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) to s3fs explicitly.

    botocore reads it itself from version 1.31; older ones ignore it, and an S3-compatible
    store (MinIO, Ceph RGW, BOS, OSS) would then be silently replaced by AWS.
    """
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return
    client = dict(options.get("client_kwargs") or {})
    client.setdefault("endpoint_url", endpoint)
    options["client_kwargs"] = client


def default_cache_dir() -> str:
    """Where a dataset read from a URL without ``cache_dir=`` is staged on this machine.

    ``PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer/staging``, else
    ``~/.cache/packer/staging``: per user, shared by every process of that user.
    """
    explicit = os.environ.get("PACKER_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "packer", "staging")
