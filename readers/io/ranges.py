"""Byte ranges of objects in object storage (any fsspec protocol): exact bytes or a clear error.

`RemoteObjects` remembers the size and ETag each shard object had when a dataset was opened and
reads ranges of them: a read returns exactly the bytes asked for (a `readers.io.pieces.Piece`:
the body as received), or raises an error that names the object (``s3://bucket/key``) and what
to do. On S3 a range is one GET over s3fs's own HTTP session with a URL its client presigned
(`readers.remote.direct.DirectGets`: a quarter of the CPU of a request through aiobotocore);
any answer but the range sends that request, and the next one of that object, through s3fs
itself, so that errors are what s3fs and botocore make of them. A lost connection and a short
body are retried with backoff, `ATTEMPTS` times (through s3fs, each also with its own retries:
5 attempts for a broken body). A throttled request (HTTP 503 SlowDown) is left to the client's
backoff (s3fs x botocore by default: 25 requests over about 45 s), then raises
`RemoteReadError`; a request refused for expired credentials raises `RemoteCredentialsError`;
an object whose size or ETag is no longer the one opened raises `RemoteObjectChangedError` (a
`DatasetRebuiltError`, never skipped).

`RangeCache` fetches the ranges that reads will want (hinted runs of records, neighbours merged)
ahead of the reads on a small thread pool and keeps the latest few MB, per process, so that runs
of records arrive in large GETs and a shuffled order fetches no more than it reads.

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
from readers.io.pieces import Piece

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
PIECE_BYTES = 8 << 20
"""The most bytes one GET ahead asks for, and a run of records is hinted in at once
(`readers.datasets.remote.run_pieces`): on loopback a 1 MiB GET moves 80 MB/s, an 8 MiB one
250-300 MB/s; a store far away favours large GETs more."""
FIRST_BYTES = 1 << 20
"""The first GET ahead of a process asks for at most this much, each next one twice as much,
up to `PIECE_BYTES`: the first records arrive after a small GET, not after a whole piece
(a pass over a 20 MB shard on moto waited 0.2 s for its first record behind three 8 MiB GETs)."""
GAP_BYTES = 1 << 20
"""Hinted ranges of a shard at most this far apart are fetched in one GET (the gap included)."""
KEPT_BYTES = 96 << 20
"""How many fetched bytes a process keeps, least recently used dropped first."""
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
        fs: the filesystem to use in this process (default: made from `url` and the options).

    Raises:
        RemoteReadError: an object is missing or cannot be listed.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None,
        paths: Iterable[str],
        urls: Iterable[str],
        *,
        fs: Any = None,
    ) -> None:
        self.source = url
        self.storage_options = storage_options
        self._fs: Any = None
        self._direct: Any = None  # readers.remote.direct.DirectGets of `_fs`, or None
        self._pid = -1
        if fs is not None:
            from readers.remote.direct import DirectGets

            self._fs, self._direct, self._pid = fs, DirectGets.for_fs(fs), os.getpid()
        self._urls = dict(zip(paths, urls, strict=True))
        self._through_client: set[str] = set()  # paths whose last direct GET was refused
        self.objects = [self._stat(path) for path in self._urls]
        self.retries = 0
        """Our retries in this process (the client's own are not counted)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_direct": None, "_pid": -1, "retries": 0}

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this process."""
        if self._pid != os.getpid():
            from readers.remote import filesystem
            from readers.remote.direct import DirectGets

            self._fs = filesystem(self.source, self.storage_options)[0]
            self._direct = DirectGets.for_fs(self._fs)
            self._through_client = set()
            self._pid = os.getpid()
        return self._fs

    @property
    def direct(self) -> Any:
        """The `readers.remote.direct.DirectGets` of this process, or None (not plain S3)."""
        _ = self.fs
        return self._direct

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

    def _get(self, path: str, begin: int, end: int) -> Piece:
        """One GET of bytes ``[begin, end)`` of `path`: direct, or through the client."""
        direct = self.direct
        if direct is not None and direct.usable and path not in self._through_client:
            from readers.remote.direct import DirectRefused

            try:
                return Piece(begin, direct.get(path, begin, end))
            except DirectRefused:
                # an error answer: this request and the next of this object go through s3fs,
                # whose retries and errors decide (the next direct one after a success)
                self._through_client.add(path)
        data = self.fs.cat_file(path, start=begin, end=end)
        self._through_client.discard(path)
        return Piece(begin, [data])

    def read(self, shard: int, begin: int, end: int) -> Piece:
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
                piece = self._get(obj.path, begin, end)
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
                        "requests (HTTP 503 SlowDown) through the client's retries "
                        f"({_text(exc)}); read with fewer DataLoader workers or ranks, or retry "
                        "later"
                    ) from exc
                if not is_retryable(exc):
                    self.check_unchanged(
                        shard, f"a read of bytes {begin}..{end} failed ({_text(exc)})"
                    )
                    raise RemoteReadError(
                        f"{obj.url}: bytes {begin}..{end} could not be read ({_text(exc, repr)})"
                    ) from exc
                last = exc
                continue
            if len(piece) == end - begin:
                return piece
            last = RemoteReadError(f"got {len(piece)} bytes of {end - begin}")
            self.check_unchanged(shard, f"a read of bytes {begin}..{end} got {len(piece)} bytes")
        raise RemoteReadError(
            f"{obj.url}: bytes {begin}..{end} could not be read in {ATTEMPTS} attempts, each "
            f"with the client's own retries (the last: {_text(last, repr)}); check the "
            "connection to the object store and retry"
        ) from last


def _text(exc: BaseException | None, form: Any = str) -> str:
    """`exc` as text for a message, without URL query strings (a presigned URL's secrets)."""
    from readers.remote.errors import redact

    return redact(form(exc))


def credentials_error(url: str, exc: BaseException) -> RemoteCredentialsError:
    """Return the error that says the credentials for `url` failed and what to do."""
    if _expired(exc):
        return RemoteCredentialsError(
            f"{url}: access refused, the credentials expired ({_text(exc)}); refresh AWS "
            "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and reopen "
            "the dataset"
        )
    return RemoteCredentialsError(
        f"{url}: access refused ({_text(exc)}); check the AWS credentials and the object's "
        "permissions"
    )


class RangeCache:
    """Byte ranges of the shard objects fetched ahead of their reads; the latest few MB kept.

    `prefetch` is told the ranges that reads will want soon (a run of records, or pieces of
    one cut at record boundaries) and fetches each exactly, never a larger aligned block
    around it: in a shuffled order or split across DataLoader workers, a run costs its own
    bytes (with 8 MiB aligned blocks, a 1 MiB chunk of a large shard read in random order
    fetched 8 MiB). At most `THREADS` GETs are in flight; hinted ranges wait in a queue, and
    a GET takes the oldest with its queued neighbours (gaps up to `GAP_BYTES`, up to
    `PIECE_BYTES` in all), so a store slower than the reads gets fewer, larger requests.
    A cold cache ramps up: its first GET asks for at most `FIRST_BYTES` and goes alone, each
    next one may be twice as large and one more may run beside it, so the first records
    arrive after a small GET (what a cut would leave over, under twice the next step, goes
    with the last part: no small GET of a remainder). `locate` serves a range from the
    hinted range that holds it (or the adjacent ones that do, where a ramp cut it), waiting
    for those on their way, and reads any other range alone (a random read stays one
    record). Hinted ranges stay in memory, as the chunks received, up to `kept_bytes`: those
    read already are dropped first (least recently used first), then the oldest hinted.
    Pickles without its pool and ranges; a forked process starts with none.
    """

    def __init__(self, objects: RemoteObjects, *, kept_bytes: int = KEPT_BYTES) -> None:
        self.objects = objects
        self.kept_bytes = kept_bytes
        self._reset()

    def _reset(self) -> None:
        # hinted range -> the piece fetched for it (which may hold more: its merged neighbours)
        self._pieces: OrderedDict[tuple[int, int, int], Future[Piece]]
        self._pieces = OrderedDict()
        self._queued: list[tuple[int, int, int]] = []  # hinted, no GET started yet
        self._cut: set[tuple[int, int, int]] = set()  # queued parts of a range cut to ramp up
        self._ramp = FIRST_BYTES  # the most bytes the next range queued is fetched in at once
        self._held = 0  # bytes of the hinted ranges in `_pieces`
        self._read: set[tuple[int, int, int]] = set()  # hinted ranges read from since hinted
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # a GET ended: one more may start
        self._counting = threading.Lock()  # `gets` and `fetched`, counted from several threads
        self._running = 0  # GETs ahead in flight
        self._slots = 1  # how many may be: one more after each GET ends, up to THREADS
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._last: tuple[int, int, int, Piece] | None = None
        self.gets = 0
        """Range GETs this process made (ahead and alone)."""
        self.fetched = 0
        """Bytes those GETs asked for."""

    def __getstate__(self) -> dict[str, Any]:
        return {"objects": self.objects, "kept_bytes": self.kept_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _forked(self) -> None:
        """Start afresh in a forked process: the parent's threads and ranges are not here."""
        if self._pid != os.getpid():
            self._reset()

    def _fetch(self, shard: int, begin: int, end: int) -> Piece:
        with self._counting:
            self.gets += 1
            self.fetched += end - begin
        return self.objects.read(shard, begin, end)

    def _holder(self, shard: int, begin: int, end: int) -> tuple[int, int, int] | None:
        """The key of a hinted range that holds ``[begin, end)`` of `shard` (lock held)."""
        for key in reversed(self._pieces):  # the newest first: reads follow the hints
            if key[0] == shard and key[1] <= begin and end <= key[2]:
                return key
        return None

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Queue GETs of the ``(shard, begin, end)`` ranges that no hinted range holds yet."""
        self._forked()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="packer-ranges")
            for shard, begin, end in ranges:
                key = self._holder(shard, begin, end)
                if key is not None:
                    self._pieces.move_to_end(key)
                    self._read.discard(key)  # to be read again
                    continue
                for key in self._ramped(shard, begin, end):
                    self._pieces[key] = Future()
                    self._queued.append(key)
                    self._held += key[2] - key[1]
                    self._pool.submit(self._get_queued)
            if self._held > self.kept_bytes:
                # ranges read already go first, the least recently used first: one hinted but
                # not read yet is what the reads want next, however long ago it was hinted
                # (dropping those before the ranges just read made a stream larger than
                # `kept_bytes` fetch each range again, record by record)
                read = [key for key in self._pieces if key in self._read]
                for key in [*read, *self._pieces]:
                    if self._held <= self.kept_bytes or len(self._pieces) <= 1:
                        break
                    if key in self._pieces:
                        self._drop(key)

    def _drop(self, key: tuple[int, int, int]) -> None:
        """Forget the hinted range `key` and cancel its GET if it has not started (lock held)."""
        dropped = self._pieces.pop(key)
        self._held -= key[2] - key[1]
        self._read.discard(key)
        if key in self._queued:
            self._queued.remove(key)
            self._cut.discard(key)
        dropped.cancel()

    def _ramped(self, shard: int, begin: int, end: int) -> list[tuple[int, int, int]]:
        """``[begin, end)`` as the ranges to queue: cut while the GETs ramp up (lock held)."""
        parts = []
        # (the last part is up to twice the ramp: no small GET of what a cut leaves over)
        while self._ramp < PIECE_BYTES and end - begin > 2 * self._ramp:
            parts.append((shard, begin, begin + self._ramp))
            begin += self._ramp
            self._ramp *= 2
        parts.append((shard, begin, end))
        if len(parts) > 1:
            self._cut.update(parts)
        self._ramp = min(PIECE_BYTES, self._ramp * 2)
        return parts

    def _get_queued(self) -> None:
        """Fetch the oldest queued range and its queued neighbours in one GET (a pool task)."""
        with self._lock:
            # the first GET goes alone (its records are the first wanted; a store short of
            # CPU would share itself among all), then one more at a time up to THREADS
            while self._running >= self._slots and self._queued:
                self._done.wait()
            if not self._queued:
                return
            self._running += 1
            shard, lo, hi = self._queued[0]
            group = [self._queued[0]]
            # its neighbours after it, in offset order, while the gaps and the total allow
            # (parts of a range cut to ramp up stay apart)
            after = [k for k in self._queued[1:] if k[0] == shard and k[1] >= lo]
            for key in [] if group[0] in self._cut else sorted(after):
                if key in self._cut:
                    break
                if key[1] - hi > GAP_BYTES or max(hi, key[2]) - lo > PIECE_BYTES:
                    break
                group.append(key)
                hi = max(hi, key[2])
            for key in group:
                self._queued.remove(key)
                self._cut.discard(key)
            futures = [self._pieces.get(key) for key in group]
        try:
            piece = self._fetch(shard, lo, hi)
        except BaseException as exc:
            for future in futures:
                if future is not None and future.set_running_or_notify_cancel():
                    future.set_exception(exc)
            return
        finally:
            with self._lock:
                self._running -= 1
                self._slots = min(THREADS, self._slots + 1)
                self._done.notify_all()
        for future in futures:
            if future is not None and future.set_running_or_notify_cancel():
                future.set_result(piece)

    def read(self, shard: int, begin: int, end: int) -> bytes:
        """The bytes ``[begin, end)`` of `shard`: from hinted ranges, or one GET of their own.

        Raises:
            ReaderError: as `RemoteObjects.read` (a failed fetch ahead is retried here once).
        """
        data, at = self.locate(shard, begin, end)
        if at == 0 and len(data) == end - begin and isinstance(data, bytes):
            return data
        return bytes(memoryview(data)[at : at + end - begin])

    def locate(self, shard: int, begin: int, end: int) -> tuple[Any, int]:
        """A buffer holding bytes ``[begin, end)`` of `shard`, and where they start in it.

        A range inside a hinted range is served from the chunk received that holds it, without
        a copy (`readers.io.pieces.Piece`); any other is one GET of its own. The buffer is
        immutable ``bytes``: views of it stay valid after the range leaves the cache.

        Raises:
            ReaderError: as `RemoteObjects.read` (a failed fetch ahead is retried here once).
        """
        last = self._last  # the hinted range read last: most reads of a run fall in it
        if last is not None and last[0] == shard and last[1] <= begin and end <= last[2]:
            return last[3].locate(begin, end)
        self._forked()
        parts: list[tuple[tuple[int, int, int], Future[Piece]]] = []
        with self._lock:
            key = self._holder(shard, begin, end)
            future = None if key is None else self._pieces[key]
            if key is not None:
                self._pieces.move_to_end(key)
                self._read.add(key)
            else:
                parts = self._covering(shard, begin, end)
                self._read.update(part for part, _ in parts)
        if key is None and parts:
            joined = self._join(parts, begin, end)
            if joined is not None:
                return joined, 0
        if key is not None and future is not None:
            try:
                piece = future.result()
            except (ReaderError, CancelledError):
                with self._lock:  # read it alone below; the error repeats there if it lasts
                    if key in self._pieces:
                        self._drop(key)
            else:
                if piece.begin <= key[1] and key[2] <= piece.end:
                    self._last = (*key, piece)
                    return piece.locate(begin, end)
        return self._fetch(shard, begin, end).locate(begin, end)

    def _covering(
        self, shard: int, begin: int, end: int
    ) -> list[tuple[tuple[int, int, int], Future[Piece]]]:
        """Adjacent hinted ranges that together hold ``[begin, end)``, or none (lock held)."""
        keys = sorted(k for k in self._pieces if k[0] == shard and k[1] < end and k[2] > begin)
        at, chain = begin, []
        for key in keys:
            if key[1] <= at < key[2]:
                chain.append((key, self._pieces[key]))
                at = key[2]
                if at >= end:
                    return chain
        return []

    def _join(
        self, parts: list[tuple[tuple[int, int, int], Future[Piece]]], begin: int, end: int
    ) -> bytes | None:
        """Bytes ``[begin, end)`` joined from the hinted ranges `parts`; None if one failed."""
        pieces = []
        for (_, lo, hi), future in parts:
            try:
                piece = future.result()
            except (ReaderError, CancelledError):
                return None
            a, b = max(begin, lo), min(end, hi)
            if a < piece.begin or b > piece.end:
                return None
            pieces.append(piece.bytes(a, b))
        return b"".join(pieces)
