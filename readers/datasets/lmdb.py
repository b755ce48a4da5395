"""`LmdbDataset`: a packed LMDB dataset, or a bare LMDB in the PaddleOCR layout."""

from __future__ import annotations

import os
from typing import Any

import lmdb
import numpy as np

from readers.datasets.base import ShardedDataset
from readers.errors import DatasetFormatError, RecordError
from readers.formats.layout import META_NAME
from readers.formats.lmdb import (
    DATA_FILE,
    FORMAT,
    NUM_SAMPLES_KEY,
    LookupGuard,
    image_key,
    label_key,
    leaf_value,
    overflow_value,
)
from readers.formats.lmdb.stored import bare_count
from readers.io import handles
from readers.io.readahead import coalesce

OFFSET_CHECKS = 8
"""Samples per shard compared, through LMDB and at their index offsets, before a process
reads that shard's values at their offsets."""


def _still_open(mapped: Any) -> bool:
    """Whether a shared mapping is still open (not closed to bound the open files)."""
    entry = handles.entry_of(mapped)
    return entry is not None and entry.open


class LmdbDataset(ShardedDataset):
    """A packed LMDB dataset, or a bare LMDB in the PaddleOCR layout, as a map-style Dataset.

    Shards are opened lazily in the process that reads them, read-only and without locks, and
    shared with every other dataset object of that process; the object pickles without them.

    Args:
        path: the dataset directory written by ``packer build`` (or a bare LMDB directory
            holding ``data.mdb`` with ``num-samples``/``image-%09d``/``label-%09d`` keys).
        transform: applied to the decoded image.
        decode: ``rgb`` (default), ``bgr``, ``gray``, ``unchanged`` or ``bytes`` (the stored
            bytes untouched). ``rgb``/``bgr``/``gray`` apply an image's EXIF orientation as
            ``cv2.imread`` does; ``unchanged`` gives the stored pixel grid.
        verify_crc: check each record's CRC-32 against the index on read.
        on_error: ``raise`` (default) or ``skip``, as for `ShardedDataset`.

    Raises:
        DatasetFormatError: the path is not a dataset, its files disagree, or a shard listed
            in meta.json is missing (a shard cut short is found when it is first opened).
    """

    shard_format = FORMAT
    format = FORMAT.name
    _direct_maps: dict[int, tuple[Any, int] | None]  # set on first read, per process
    _direct_generation = -1
    _guards: dict[int, LookupGuard]  # per shard, per process
    _guard_generation = -1

    def _open_bare(self) -> None:
        if FORMAT.find_bare(self.root) is None:
            raise DatasetFormatError(
                f"{self.root}: neither a packed dataset ({META_NAME}) nor an LMDB ({DATA_FILE})"
            )
        self._shard_paths = [str(self.root)]
        with self._env(0).begin(buffers=True) as txn:
            try:
                problem = self._guard(0).problem(NUM_SAMPLES_KEY)
            except RecordError as exc:
                raise DatasetFormatError(str(exc)) from exc
            if problem is not None:
                raise DatasetFormatError(f"{self.root}: damaged LMDB pages: {problem}")
            if txn.get(NUM_SAMPLES_KEY) is None:
                raise DatasetFormatError(
                    f"{self.root}: an LMDB without a 'num-samples' key; expected the PaddleOCR "
                    "layout (num-samples, image-%09d, label-%09d)"
                )
            # a count the environment cannot hold is refused here, not found 10^9 reads later
            count = bare_count(self.root, txn, int(self._env(0).stat()["entries"]))
        self.shard_bounds = np.asarray([0, count], dtype=np.int64)

    def _env(self, shard: int) -> Any:
        return self._handle(shard)

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        # Where LMDB keeps a value is known only from the offsets recorded at build time
        # (index.parquet): looking a value up through LMDB reads all of its pages.
        if self.index is None or self.index.offset is None:
            return None
        begin = self.index.offset[lo:hi]
        end = begin.astype(np.int64) + self.index.nbytes[lo:hi]
        return os.path.join(self._shard_paths[shard], DATA_FILE), int(begin.min()), int(end.max())

    def _byte_ranges(self, shard: int, lo: int, hi: int) -> list[tuple[str, int, int]]:
        # LMDB puts some values into pages freed earlier, far from their neighbours: one range
        # over 64 records spanned 15 MB, of which Linux read only the first
        # max(read_ahead_kb, max_sectors_kb) and the rest came as 4 KiB faults. So: the
        # values' extents, merged where they lie close (B-tree leaf pages between come along).
        if self.index is None or self.index.offset is None:
            return []
        begin = self.index.offset[lo:hi].astype(np.int64)
        path = os.path.join(self._shard_paths[shard], DATA_FILE)
        return [(path, b, e) for b, e in coalesce(begin, begin + self.index.nbytes[lo:hi])]

    def _where(self, i: int, shard: int, key: bytes) -> str:
        return f"{self._shard_paths[shard]} key {key.decode()} sample {i}{self._source(i)}"

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        local = i - int(self.shard_bounds[shard]) + 1
        key = image_key(local)
        try:
            view = self._direct_view(i, shard, key)
            if view is not None and self.index is not None:
                return self._image(i, view, shard, key, as_bytes), self.index.labels[i]
            with self._env(shard).begin(buffers=True) as txn:
                buf = self._checked(txn, key, i, shard)
                if buf is None:
                    raise RecordError(f"{self._where(i, shard, key)}: the key is missing")
                image = self._image(i, buf, shard, key, as_bytes)
                if self.index is not None:
                    label: Any = self.index.labels[i]
                else:
                    raw = self._checked(txn, label_key(local), i, shard)
                    label = None if raw is None else bytes(raw).decode("utf-8")
        except RecordError:
            raise
        except OSError as exc:
            if handles.is_resource_error(exc):
                raise
            raise RecordError(f"{self._where(i, shard, key)}: read failed ({exc})") from exc
        except ValueError as exc:
            raise RecordError(f"{self._where(i, shard, key)}: cannot decode ({exc})") from exc
        except lmdb.Error as exc:
            raise RecordError(f"{self._where(i, shard, key)}: read failed ({exc})") from exc
        return image, label

    def _guard(self, shard: int) -> LookupGuard:
        """The check of the pages a lookup in `shard` touches, made once per process.

        Raises:
            RecordError: the shard's meta pages are damaged.
        """
        if self._guard_generation != handles.generation:
            self._guards = {}
            self._guard_generation = handles.generation
        guard = self._guards.get(shard)
        if guard is None or not _still_open(guard.buf):  # its mapping closed to bound files
            data = os.path.join(self._shard_paths[shard], DATA_FILE)
            try:
                guard = self._guards[shard] = LookupGuard(handles.shared_mmap(data))
            except ValueError as exc:
                raise RecordError(f"{data}: {exc}") from exc
        return guard

    def _checked(self, txn: Any, key: bytes, i: int, shard: int) -> Any:
        """The value of `key` (None when missing), looked up once its pages are known to be sound.

        The pages the lookup touches and the value's extent must lie inside the file and its page
        layout: py-lmdb touches the value inside ``get``, and a damaged length or page number
        would make that kill the process (SIGBUS).
        """
        problem = self._guard(shard).problem(key)
        if problem is not None:
            raise RecordError(f"{self._where(i, shard, key)}: damaged LMDB pages: {problem}")
        return txn.get(key)

    def _image(self, i: int, buf: Any, shard: int, key: bytes, as_bytes: bool) -> Any:
        self._check_crc(i, buf, lambda: self._where(i, shard, key))
        if as_bytes or self.decode == "bytes":
            return bytes(buf)
        return self.decode_stored(buf, i)

    # --- values read at their index offsets --------------------------------------------------
    #
    # A lookup through LMDB walks the B-tree: its branch and leaf pages are scattered through
    # data.mdb, no hint covers them (the index knows where values are, not where keys are),
    # and on a cold disk each one is a small read, queued behind whatever the hints asked for
    # (bench: both DataLoader workers stalled 60-90 ms at every shuffle block of the chunked
    # sampler). The index has every value's offset, so a packed shard's values are read
    # straight from a mapping of data.mdb, once this process has checked that the offsets
    # fit the file; any value whose page header does not agree is looked up through LMDB.

    def _direct_view(self, i: int, shard: int, key: bytes) -> memoryview | None:
        if self._direct_generation != handles.generation:
            self._direct_maps = {}
            self._direct_generation = handles.generation
        found = self._direct_maps.get(shard)
        if shard not in self._direct_maps or (found is not None and not _still_open(found[0])):
            found = self._direct_maps[shard] = self._check_offsets(shard)
        return None if found is None else self._at_offset(found[0], i, found[1], key)

    def _at_offset(self, mapped: Any, i: int, page_size: int, key: bytes) -> memoryview | None:
        index = self.index
        assert index is not None
        assert index.offset is not None
        offset, nbytes = int(index.offset[i]), int(index.nbytes[i])
        found = overflow_value(mapped, offset, nbytes, page_size)
        return found if found is not None else leaf_value(mapped, offset, nbytes, page_size, key)

    def _check_offsets(self, shard: int) -> tuple[Any, int] | None:
        """``(data.mdb mapped, page size)`` when the index's offsets of `shard` fit its file.

        They fit when `OFFSET_CHECKS` samples spread over the shard read the same through LMDB
        as at their offsets (a file rewritten or compacted since the build fails); else None.
        Values too small for overflow pages are always looked up through LMDB.
        """
        if self.index is None or self.index.offset is None:
            return None
        lo, hi = int(self.shard_bounds[shard]), int(self.shard_bounds[shard + 1])
        picks = np.unique(np.linspace(lo, hi - 1, num=min(OFFSET_CHECKS, hi - lo)).astype(int))
        try:
            env = self._env(shard)
            page_size = int(env.stat()["psize"])
            mapped = handles.shared_mmap(os.path.join(self._shard_paths[shard], DATA_FILE))
            with env.begin(buffers=True) as txn:
                for i in picks.tolist():
                    key = image_key(i - lo + 1)
                    stored = self._checked(txn, key, i, shard)
                    found = self._at_offset(mapped, i, page_size, key)
                    if stored is None:
                        return None
                    if found is None:  # a small value lives in its leaf page: fine if small
                        if len(stored) > page_size:
                            return None
                    elif bytes(found) != bytes(stored):
                        return None
        except (lmdb.Error, OSError, ValueError, DatasetFormatError, RecordError):
            return None
        return mapped, page_size

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_direct_maps"] = {}
        state["_direct_generation"] = -1
        state["_guards"] = {}
        state["_guard_generation"] = -1
        return state
