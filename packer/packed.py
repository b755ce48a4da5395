"""The records of a packer dataset as stored, read a batch at a time, described by its index.

`PackedRecords` is what ``packer convert`` (from a packer dataset), merge and split read: each
record's stored bytes (``ShardFormat.read_stored``: nothing is decoded) with its description
from the index (path, label, dimensions, format, CRC-32, compression), as `RecordBatch`
values of bounded size. Every record's bytes are checked against the index's CRC-32 as they
are read: one that does not match is a ``crc_mismatch`` problem, never a record.
"""

from __future__ import annotations

import contextlib
import json
import warnings
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packer.problems import Problem
from packer.records import Record
from packer.writers.batch import RecordBatch
from readers.columnar import COMPRESSIONS
from readers.errors import DatasetFormatError, DatasetRebuiltError
from readers.formats import REGISTRY
from readers.index import DatasetIndex, load_index
from readers.io.identity import DatasetIdentity, identify_dataset
from readers.io.readahead import coalesce, willneed

CRC_MISMATCH = "crc_mismatch"
"""errors.jsonl reason of a record whose stored bytes differ from its index's CRC-32."""

BATCH_RECORDS = 8192
BATCH_BYTES = 64 << 20
"""A batch holds at most this many records and stored bytes."""
HINT_AHEAD = 64 << 20
"""Bytes of the batches after the current one hinted to the OS (`PackedRecords.read_ids`)."""
HINT_PAD = 1 << 10
"""Bytes hinted past each record's stored bytes (a RecordIO record's header and label)."""
PIN_ATTEMPTS = 3
"""Loads of an index that `load_pinned` tries while the dataset keeps changing under it."""


def _pick(values: list[Any], lo: int, ids: np.ndarray | None) -> list[Any]:
    """``values`` (the column from id `lo` on) at `ids`, or all of it when `ids` is None."""
    return values if ids is None else [values[i] for i in (ids - lo).tolist()]


def _unchanged(identity: DatasetIdentity) -> bool:
    try:
        identity.check_meta()
    except DatasetRebuiltError:
        return False
    return True


def load_pinned(root: Path, extra: tuple[str, ...]) -> DatasetIndex:
    """The index of the dataset at `root` and the meta.json of the same build (``index.meta``).

    An append or ``--overwrite`` build may replace `root` between reading its meta.json and
    its index; the load counts only when meta.json is, after it, the file it was before
    (`readers.io.identity`), so the class names, shard table and counts of ``index.meta``
    belong to the index loaded. Otherwise it is loaded again.

    Raises:
        DatasetFormatError: the dataset is not usable (as `readers.index.load_index`).
        DatasetRebuiltError: it changed during each of `PIN_ATTEMPTS` loads.
    """
    for attempt in range(PIN_ATTEMPTS):
        try:
            identity = identify_dataset(root)
        except OSError:  # no meta.json: load_index says so
            return load_index(root, extra=extra)
        last = attempt == PIN_ATTEMPTS - 1
        with warnings.catch_warnings(record=True) as said:  # only the kept load's count
            warnings.simplefilter("always")
            try:
                index = load_index(root, extra=extra)
            except DatasetFormatError:
                if last or _unchanged(identity):
                    raise
                continue  # meta.json and the index were read from different builds
        if _unchanged(identity):
            for warning in said:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
            return index
        if last:
            identity.check_meta()  # raises DatasetRebuiltError
    raise AssertionError("unreachable")  # pragma: no cover


class PackedRecords:
    """The records of the packer dataset at `root`, as stored.

    ``meta`` is the meta.json of the build whose index was loaded (`load_pinned`).
    """

    def __init__(self, root: Path) -> None:
        index = load_pinned(root, ("width", "height", "channels", "format", "path"))
        self.root = root
        self.index = index
        self.meta = index.meta
        self.fmt = REGISTRY[index.format]
        self.n = len(index)
        self.paths = [self.fmt.shard_path(root, name) for name in index.shard_names]
        self.offsets = (
            index.offset.astype(np.int64)
            if index.offset is not None
            else np.full(self.n, -1, np.int64)
        )
        codes = index.compression
        self.compression: list[str | None] | None = (
            None if codes is None else [None if c == 0 else COMPRESSIONS[c] for c in codes.tolist()]
        )

    def labels(self, lo: int, hi: int, ids: np.ndarray | None = None) -> tuple[list[Any], Any]:
        """The labels of `ids` (all of ``lo..hi-1`` when None), and them as int64 when ints."""
        labels = self.index.labels
        if labels.kind == "int":
            assert labels.ints is not None
            ints = (labels.ints[lo:hi] if ids is None else labels.ints[ids]).astype(np.int64)
            return ints.tolist(), ints
        count = hi - lo if ids is None else len(ids)
        if labels.kind == "json":
            texts = labels.texts.slice(lo, hi - lo).to_pylist()
            return [json.loads(t) for t in _pick(texts, lo, ids)], None
        return [None] * count, None

    def describe(self, lo: int, hi: int, ids: np.ndarray | None = None) -> RecordBatch:
        """The records `ids` (all of ``lo..hi-1`` when None) without their bytes.

        The result's ``stored_sizes`` and ``crc32`` come from the index.
        """
        index, extra = self.index, self.index.extra
        sel = slice(lo, hi) if ids is None else ids
        rel = _pick(extra["path"].slice(lo, hi - lo).to_pylist(), lo, ids)
        if not all(rel):
            rel = [
                p or f"{j}" for j, p in zip(range(lo, hi) if ids is None else ids, rel, strict=True)
            ]
        label, ints = self.labels(lo, hi, ids)
        return RecordBatch(
            rel,
            [],
            label,
            _pick(extra["format"].slice(lo, hi - lo).to_pylist(), lo, ids),
            extra["width"][sel].tolist(),
            extra["height"][sel].tolist(),
            extra["channels"][sel].tolist(),
            index.crc32[sel].tolist(),
            [None] * len(rel)
            if self.compression is None
            else _pick(self.compression[lo:hi], lo, ids),
            ints,
            index.nbytes[sel].tolist(),
        )

    def _read(self, shard: int, lo: int, hi: int, ids: np.ndarray | None) -> Iterator[Any]:
        """The checked records `ids` (or ``lo..hi-1``) of shard `shard`: batches, problems."""
        first = int(self.index.shard_bounds[shard])
        chosen = np.arange(lo, hi) if ids is None else ids
        offsets = self.offsets[chosen].tolist()
        batch = self.describe(lo, hi, ids)
        positions = (chosen - first).tolist()
        batch.data = list(self.fmt.read_stored(self.paths[shard], positions, offsets))
        batch.stored_sizes = None
        crcs = np.fromiter(map(zlib.crc32, batch.data), np.uint32, count=len(batch.data))
        expected = self.index.crc32[chosen]
        bad = np.flatnonzero(crcs != expected).tolist()
        if not bad:
            yield batch
            return
        at = 0
        for j in bad:
            if j > at:
                yield batch.take(range(at, j))
            yield Problem(
                batch.rel[j],
                CRC_MISMATCH,
                f"sample {int(chosen[j])}: the stored bytes have CRC-32 {int(crcs[j]):08x}, "
                f"the index says {int(expected[j]):08x} (run packer verify on IN)",
            )
            at = j + 1
        if at < len(batch):
            yield batch.take(range(at, len(batch)))

    def _plan(self, ids: np.ndarray) -> Iterator[tuple[int, int, int, np.ndarray | None]]:
        """The batches of `ids` (ascending): ``(shard, lo, hi, ids or None when all)``."""
        bounds = self.index.shard_bounds
        contiguous = len(ids) > 0 and int(ids[-1]) - int(ids[0]) == len(ids) - 1
        start = 0
        while start < len(ids):
            shard = int(np.searchsorted(bounds, ids[start], side="right")) - 1
            end = int(np.searchsorted(ids, bounds[shard + 1]))
            stop = min(end, start + BATCH_RECORDS)
            within = np.cumsum(self.index.nbytes[ids[start:stop]], dtype=np.int64)
            stop = start + max(1, int(np.searchsorted(within, BATCH_BYTES, side="right")))
            lo, hi = int(ids[start]), int(ids[stop - 1]) + 1
            yield shard, lo, hi, None if contiguous else ids[start:stop]
            start = stop

    def _hint(self, shard: int, lo: int, hi: int, ids: np.ndarray | None) -> int:
        """Ask the OS to read a batch's bytes into the page cache now (``WILLNEED``).

        Records are looked up one by one (LMDB's map is ``MADV_RANDOM``), so on cold storage
        each would cost its own small reads: 35,000 records took 119 s on a 300 IOPS disk
        where ``cp`` took 1.5 s. Hinted ahead, they arrive in large sequential reads
        while the batches before are written. A hint only: where offsets are unknown, or the
        file cannot be opened, records are read as before. Returns the batch's stored bytes.
        """
        chosen = np.arange(lo, hi) if ids is None else ids
        nbytes = self.index.nbytes[chosen].astype(np.int64)
        begin = self.offsets[chosen]
        if len(begin) == 0 or int(begin.min()) < 0:
            return int(nbytes.sum())
        path = self.fmt.data_file(self.paths[shard])
        with contextlib.suppress(OSError):
            for b, e in coalesce(begin, begin + nbytes + HINT_PAD):
                willneed(path, b, e)
        return int(nbytes.sum())

    def read_ids(self, ids: np.ndarray) -> Iterator[RecordBatch | Problem]:
        """Records `ids` (ascending), a shard's run at a time, in batches of bounded size.

        The bytes of the batches after the one being handled, up to `HINT_AHEAD` of them, are
        hinted to the OS meanwhile.
        """
        plan = self._plan(ids)
        ahead: deque[tuple[tuple[int, int, int, np.ndarray | None], int]] = deque()
        hinted = 0
        while True:
            while hinted < HINT_AHEAD or not ahead:
                following = next(plan, None)
                if following is None:
                    break
                size = self._hint(*following)
                ahead.append((following, size))
                hinted += size
            if not ahead:
                return
            current, size = ahead.popleft()
            yield from self._read(*current)
            hinted -= size

    def read_batches(self, start: int, stop: int) -> Iterator[RecordBatch | Problem]:
        """Records ``start..stop-1`` in batches (and problems)."""
        return self.read_ids(np.arange(start, stop, dtype=np.int64))

    def read(self, start: int, stop: int) -> Iterator[Record | Problem]:
        """Records ``start..stop-1`` one by one (`Record` or `Problem`)."""
        return one_by_one(self.read_batches(start, stop))


def one_by_one(items: Iterable[RecordBatch | Problem]) -> Iterator[Record | Problem]:
    """`items` with each batch taken apart into its records, in order (problems as they are)."""
    for item in items:
        if isinstance(item, Problem):
            yield item
        else:
            yield from (item.record(i) for i in range(len(item)))
