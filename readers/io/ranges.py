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

`RangeCache` fetches aligned blocks of the objects ahead of their reads on a small thread pool
and keeps the latest few, per process, so that runs of records arrive in large GETs.

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
    "is_retryable",
    "is_throttled",
]

ATTEMPTS = 4
"""Our attempts at one range, each through the client's own retries."""
BACKOFF_S = 0.2
"""The wait before our second attempt; it doubles for each further one."""
BLOCK_BYTES = 8 << 20
"""The unit fetched ahead: aligned blocks of a shard object, one GET each."""
PIECE_BYTES = BLOCK_BYTES
"""The most bytes a run of records is hinted in at once (`readers.datasets.remote.run_pieces`)."""
KEPT_BLOCKS = 12
"""How many blocks a process keeps (``KEPT_BLOCKS * BLOCK_BYTES``: 96 MiB)."""
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


def is_throttled(exc: BaseException) -> bool:
    """Whether `exc` is the store throttling requests (HTTP 503 SlowDown)."""
    return (isinstance(exc, OSError) and exc.errno == errno.EBUSY) or "SlowDown" in str(exc)


def is_retryable(exc: BaseException) -> bool:
    """Whether `exc` is a transfer fault worth another attempt (a lost connection, a short body)."""
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
                if is_throttled(exc):
                    # The client backed off already (s3fs and botocore by default: 25 requests
                    # over about 45 s); more attempts here would only multiply that.
                    raise RemoteReadError(
                        f"{obj.url}: bytes {begin}..{end}: the store kept throttling the "
                        f"requests (HTTP 503 SlowDown) through the client's retries ({exc}); "
                        "read with fewer DataLoader workers or ranks, or retry later"
                    ) from exc
                if not is_retryable(exc):
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
    """Return the error that says the credentials for `url` failed and what to do."""
    if _expired(exc):
        return RemoteCredentialsError(
            f"{url}: access refused, the credentials expired ({exc}); refresh AWS credentials "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and reopen the dataset"
        )
    return RemoteCredentialsError(
        f"{url}: access refused ({exc}); check the AWS credentials and the object's permissions"
    )


class RangeCache:
    """Aligned blocks of the shard objects fetched ahead of their reads; the latest few kept.

    `prefetch` queues GETs of the `BLOCK_BYTES`-aligned blocks that hold a range (large GETs:
    on loopback a 1 MiB GET moves 80 MB/s, an 8 MiB one 250-300 MB/s; a store far away
    favours them more), on a small thread pool; `read` serves a range from the blocks that
    hold it, waiting for those on their way, and reads any other range alone (a random read
    stays one record). At most `kept` blocks stay in memory, least recently used dropped.
    Pickles without its pool and blocks; a forked process starts with none.
    """

    def __init__(self, objects: RemoteObjects, *, kept: int = KEPT_BLOCKS) -> None:
        self.objects = objects
        self.kept = kept
        self._blocks: OrderedDict[tuple[int, int], Future[bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._last: tuple[int, int, bytes] | None = None
        self.gets = 0
        """Range GETs this process made (blocks ahead and ranges alone)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_blocks=OrderedDict(), _lock=None, _pool=None, _pid=-1, _last=None, gets=0)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _forked(self) -> None:
        """Start afresh in a forked process: the parent's threads and blocks are not here."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._pool, self._blocks, self._last, self.gets = None, OrderedDict(), None, 0

    def _fetch(self, shard: int, begin: int, end: int) -> bytes:
        self.gets += 1
        return self.objects.read(shard, begin, end)

    def _fetch_block(self, shard: int, block: int) -> bytes:
        return self._fetch(shard, block * BLOCK_BYTES, (block + 1) * BLOCK_BYTES)

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Queue GETs of the blocks holding the ``(shard, begin, end)`` ranges, if not there."""
        self._forked()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="packer-ranges")
            for shard, begin, end in ranges:
                for block in range(begin // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1):
                    key = (shard, block)
                    if key in self._blocks:
                        self._blocks.move_to_end(key)
                    else:
                        self._blocks[key] = self._pool.submit(self._fetch_block, *key)
            while len(self._blocks) > self.kept:
                _, dropped = self._blocks.popitem(last=False)
                dropped.cancel()

    def read(self, shard: int, begin: int, end: int) -> bytes:
        """The bytes ``[begin, end)`` of `shard`: from fetched blocks, or one GET of their own.

        Raises:
            ReaderError: as `RemoteObjects.read` (a failed fetch ahead is retried here once).
        """
        data, at = self.locate(shard, begin, end)
        return data if at == 0 and len(data) == end - begin else data[at : at + end - begin]

    def locate(self, shard: int, begin: int, end: int) -> tuple[bytes, int]:
        """A buffer holding bytes ``[begin, end)`` of `shard`, and where they start in it.

        A range inside one fetched block is served from the block itself, without a copy; one
        that spans blocks is joined from the parts it needs of them; any other is one GET.

        Raises:
            ReaderError: as `RemoteObjects.read` (a failed fetch ahead is retried here once).
        """
        first = begin // BLOCK_BYTES
        last = self._last  # the block read last: most reads of a run fall in it
        if last is not None and last[0] == shard and last[1] == first:
            at = begin - first * BLOCK_BYTES
            if at + end - begin <= len(last[2]):
                return last[2], at
        self._forked()
        keys = [(shard, b) for b in range(first, (end - 1) // BLOCK_BYTES + 1)]
        with self._lock:
            futures = [self._blocks.get(key) for key in keys]
            for key, future in zip(keys, futures, strict=True):
                if future is not None:
                    self._blocks.move_to_end(key)
        if all(f is not None and not f.cancelled() for f in futures):
            try:
                blocks = [f.result() for f in futures if f is not None]
            except (ReaderError, CancelledError):
                with self._lock:  # read it alone below; the error repeats there if it lasts
                    for key in keys:
                        self._blocks.pop(key, None)
            else:
                at = begin - first * BLOCK_BYTES
                if len(blocks) == 1:
                    self._last = (shard, first, blocks[0])
                    if at + end - begin <= len(blocks[0]):
                        return blocks[0], at
                else:  # only the parts of the blocks that the range covers
                    parts = [blocks[0][at:]]
                    parts.extend(blocks[1:-1])
                    parts.append(blocks[-1][: end - (first + len(blocks) - 1) * BLOCK_BYTES])
                    joined = b"".join(parts)
                    if len(joined) == end - begin:
                        return joined, 0
        return self._fetch(shard, begin, end), 0
