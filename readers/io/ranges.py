"""Byte ranges of objects in object storage (any fsspec protocol): exact bytes or a clear error.

`RemoteObjects` remembers the size and ETag each shard object had when a dataset was opened and
reads ranges of them: a read returns exactly the bytes asked for, or raises an error that names
the object (``s3://bucket/key``) and what to do. A lost connection and a short body are retried
with backoff, `ATTEMPTS` times, each through the client's own retries (s3fs: 5 attempts for a
broken body). A throttled request (HTTP 503 SlowDown) is left to the client's backoff (s3fs x
botocore by default: 25 requests over about 45 s), then raises `RemoteReadError`; a request
refused for expired credentials raises `RemoteCredentialsError`; an object whose size or ETag
is no longer the one opened raises `RemoteObjectChangedError` (a `DatasetRebuiltError`, never
skipped).

`RangeCache` fetches ranges ahead of their reads on a small thread pool and keeps the latest few
blocks, per process, so that a run of records arrives in one large GET.

Nothing here imports paddle or knows a format.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from readers.errors import DatasetRebuiltError, ReaderError

__all__ = [
    "ATTEMPTS",
    "RangeCache",
    "RemoteCredentialsError",
    "RemoteObjectChangedError",
    "RemoteObjects",
    "RemoteReadError",
    "credentials_error",
]

ATTEMPTS = 4
"""Our attempts at one range, each through the client's own retries."""
BACKOFF_S = 0.2
"""The wait before our second attempt; it doubles for each further one."""
PIECE_BYTES = 4 << 20
"""The largest range fetched ahead in one GET (larger runs are split at record boundaries)."""
KEPT_BLOCKS = 16
"""How many fetched-ahead blocks a process keeps (at most ``KEPT_BLOCKS * PIECE_BYTES``)."""
THREADS = 4
"""Concurrent GETs ahead of the reads, per process."""


class RemoteReadError(ReaderError):
    """A range of an object in object storage could not be read after the retries."""


class RemoteCredentialsError(ReaderError):
    """Object storage refused a request: the credentials expired or are not allowed."""


class RemoteObjectChangedError(DatasetRebuiltError):
    """An object's size or ETag is not the one it had when the dataset was opened."""


def _expired(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("expiredtoken", "expired", "invalidaccesskeyid", "token"))


def _throttled(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno == errno.EBUSY) or "SlowDown" in str(exc)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, PermissionError | FileNotFoundError):
        return False
    if isinstance(exc, ConnectionError | TimeoutError | EOFError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in (None, errno.EBUSY, errno.EAGAIN, errno.EIO, errno.ECONNRESET)
    # aiohttp / botocore errors that the client did not map (payload, protocol, parsing)
    return type(exc).__module__.split(".")[0] in ("aiohttp", "botocore", "urllib3", "http")


@dataclass(frozen=True)
class RemoteObject:
    """One object as opened: its URL, its path in the filesystem, size and ETag (or None)."""

    url: str
    path: str
    size: int
    etag: str | None


class RemoteObjects:
    """The shard objects of one dataset in object storage, as they were when it was opened.

    The filesystem is made again in a forked or unpickled process (fsspec's async clients are
    not fork-safe), from the URL and options it was made from.

    Args:
        url: the dataset's URL: it and the options make the filesystem.
        storage_options: fsspec options for it.
        paths: the objects' paths in that filesystem, in shard order.
        urls: their URLs, for messages.

    Raises:
        RemoteReadError: an object is missing or cannot be listed.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None,
        paths: Iterable[str],
        urls: Iterable[str],
    ) -> None:
        self.source = url
        self.storage_options = storage_options
        self._fs: Any = None
        self._pid = -1
        self._urls = dict(zip(paths, urls, strict=True))
        self.objects = [self._stat(path) for path in self._urls]
        self.retries = 0
        """Our retries in this process (the client's own are not counted)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1, "retries": 0}

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this process."""
        if self._pid != os.getpid():
            from readers.remote import filesystem

            self._fs, self._pid = filesystem(self.source, self.storage_options)[0], os.getpid()
        return self._fs

    def url(self, path: str) -> str:
        """The URL of `path`, for messages."""
        return self._urls.get(path, path)

    def _stat(self, path: str, *, refresh: bool = False) -> RemoteObject:
        url = self.url(path)
        try:
            if refresh:
                self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except FileNotFoundError as exc:
            raise RemoteReadError(
                f"{url}: no such object; the dataset lists it as a shard (was it deleted or "
                "not uploaded? re-upload the dataset)"
            ) from exc
        except PermissionError as exc:
            raise credentials_error(url, exc) from exc
        etag = info.get("ETag") or info.get("etag")
        return RemoteObject(url, path, int(info["size"]), None if etag is None else str(etag))

    def check_unchanged(self, shard: int, why: str) -> None:
        """Raise `RemoteObjectChangedError` when `shard`'s object is not the one opened.

        `why` is what made the caller look (a short body, a CRC mismatch); it is in the message.
        """
        opened = self.objects[shard]
        try:
            now = self._stat(opened.path, refresh=True)
        except RemoteReadError as exc:
            raise RemoteObjectChangedError(
                f"{opened.url}: {why}, and the object is gone ({exc}); the dataset was changed "
                "since it was opened: reopen it"
            ) from exc
        if (now.size, now.etag) != (opened.size, opened.etag):
            raise RemoteObjectChangedError(
                f"{opened.url}: {why}: the object changed since the dataset was opened "
                f"(size {opened.size} -> {now.size}, ETag {opened.etag} -> {now.etag}); "
                "reopen the dataset"
            )

    def read(self, shard: int, begin: int, end: int) -> bytes:
        """Exactly the bytes ``[begin, end)`` of `shard`'s object.

        Raises:
            RemoteCredentialsError: the request was refused (expired credentials).
            RemoteObjectChangedError: the object's size or ETag changed since opening.
            RemoteReadError: the range could not be read in `ATTEMPTS` attempts.
        """
        obj = self.objects[shard]
        end = min(end, obj.size)
        last: BaseException | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                self.retries += 1
                time.sleep(BACKOFF_S * (1 << (attempt - 1)))
            try:
                data = self.fs.cat_file(obj.path, start=begin, end=end)
            except PermissionError as exc:
                raise credentials_error(obj.url, exc) from exc
            except FileNotFoundError as exc:
                raise RemoteObjectChangedError(
                    f"{obj.url}: the object is gone since the dataset was opened; reopen it "
                    "(or re-upload the dataset)"
                ) from exc
            except Exception as exc:
                if _throttled(exc):
                    # The client backed off already (s3fs and botocore by default: 25 requests
                    # over about 45 s); more attempts here would only multiply that.
                    raise RemoteReadError(
                        f"{obj.url}: bytes {begin}..{end}: the store kept throttling the "
                        f"requests (HTTP 503 SlowDown) through the client's retries ({exc}); "
                        "read with fewer DataLoader workers or ranks, or retry later"
                    ) from exc
                if not _retryable(exc):
                    self.check_unchanged(shard, f"a read of bytes {begin}..{end} failed ({exc})")
                    raise RemoteReadError(
                        f"{obj.url}: bytes {begin}..{end} could not be read ({exc!r})"
                    ) from exc
                last = exc
                continue
            if len(data) == end - begin:
                return bytes(data)
            last = RemoteReadError(f"got {len(data)} bytes of {end - begin}")
            self.check_unchanged(shard, f"a read of bytes {begin}..{end} got {len(data)} bytes")
        raise RemoteReadError(
            f"{obj.url}: bytes {begin}..{end} could not be read in {ATTEMPTS} attempts, each "
            f"with the client's own retries (the last: {last!r}); check the connection to the "
            "object store and retry"
        ) from last


def credentials_error(url: str, exc: BaseException) -> RemoteCredentialsError:
    if _expired(exc):
        return RemoteCredentialsError(
            f"{url}: access refused, the credentials expired ({exc}); refresh AWS credentials "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and reopen the dataset"
        )
    return RemoteCredentialsError(
        f"{url}: access refused ({exc}); check the AWS credentials and the object's permissions"
    )


class RangeCache:
    """Ranges fetched ahead of their reads on a thread pool; the latest few kept, per process.

    `prefetch` queues GETs of ranges (one block each); `read` serves a range from a block
    that holds it, waiting for it when it is on its way, and else reads the range alone.
    Pickles without its pool and blocks.
    """

    def __init__(self, objects: RemoteObjects, *, kept: int = KEPT_BLOCKS) -> None:
        self.objects = objects
        self.kept = kept
        self._blocks: OrderedDict[tuple[int, int, int], Future[bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.gets = 0
        """Range GETs this process made (ahead and alone)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_blocks=OrderedDict(), _lock=None, _pool=None, _pid=-1, gets=0)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _forked(self) -> None:
        """Start afresh in a forked process: the parent's threads and blocks are not here."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._pool, self._blocks, self.gets = None, OrderedDict(), 0

    def _fetch(self, shard: int, begin: int, end: int) -> bytes:
        self.gets += 1
        return self.objects.read(shard, begin, end)

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Queue GETs of ``(shard, begin, end)`` ranges not fetched or on their way yet."""
        self._forked()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="packer-ranges")
            for key in ranges:
                if key in self._blocks or self._find(*key) is not None:
                    continue
                self._blocks[key] = self._pool.submit(self._fetch, *key)
            while len(self._blocks) > self.kept:
                _, dropped = self._blocks.popitem(last=False)
                dropped.cancel()

    def _find(self, shard: int, begin: int, end: int) -> tuple[int, Future[bytes]] | None:
        for (s, b, e), future in reversed(self._blocks.items()):
            if s == shard and b <= begin and end <= e and not future.cancelled():
                return b, future
        return None

    def read(self, shard: int, begin: int, end: int) -> bytes:
        """The bytes ``[begin, end)`` of `shard`: from a fetched block, or one GET of their own.

        Raises:
            ReaderError: as `RemoteObjects.read` (a failed fetch ahead is retried here once).
        """
        self._forked()
        with self._lock:
            found = self._find(shard, begin, end)
        if found is not None:
            b, future = found
            try:
                data = future.result()
            except (ReaderError, CancelledError):
                with self._lock:  # read it alone below; the error repeats there if it lasts
                    self._blocks = OrderedDict(
                        (k, f) for k, f in self._blocks.items() if f is not future
                    )
            else:
                return data[begin - b : end - b]
        return self._fetch(shard, begin, end)
