"""`RecordIODataset`: a packed RecordIO dataset, or a bare MXNet ``.rec``/``.idx`` pair."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from readers.datasets.base import ShardedDataset
from readers.datasets.remote import RemoteShards, record_ends, run_pieces
from readers.errors import DatasetFormatError, RecordError
from readers.fastzlib import crc32
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.formats.recordio import (
    FORMAT,
    IDX_SUFFIX,
    REC_SUFFIX,
    RecordIOError,
    cut_short,
    header_at,
    read_record_at,
    unpack_image_record,
    view_record_at,
)
from readers.formats.recordio.bare import (
    indexed_images,
    int_labels,
    scan_images,
)
from readers.index import DatasetIndex
from readers.io import handles
from readers.io.hints import CHUNK_BYTES

RUNS_AHEAD = 8
"""Runs (chunks) a stream announces ahead of a ranged read: at most 8 x `REMOTE_CHUNK_BYTES`."""
REMOTE_CHUNK_BYTES = 8 << 20
"""Stored bytes per default chunk of a dataset read by ranged GETs (``chunk_bytes``): a chunk
is one GET, as large as `readers.io.ranges.PIECE_BYTES` (on disk 1 MiB, ``CHUNK_BYTES``)."""


def check_packed_shard(path: str, offsets: np.ndarray, lo: int, shard: int) -> None:
    """Check that a packed shard exists and its offsets point at the records of its samples.

    The shard must hold every offset of its samples ``lo..lo+len(offsets)-1``, and its first
    and last offsets must point at the records of those samples (a cut ``.rec`` fails here,
    not mid-epoch).

    Raises:
        DatasetFormatError: naming the file, the index line and what is wrong.
    """
    try:
        buf = handles.open_mmap_readonly(path)
    except OSError as exc:
        raise DatasetFormatError(
            f"{path}: cannot open ({exc.strerror or exc}); {META_NAME} lists it as shard {shard}"
        ) from exc
    try:
        size = len(buf)
        if len(offsets) == 0:
            return
        if int(offsets.max()) >= size:
            at = int(np.argmax(offsets >= size))
            raise DatasetFormatError(
                f"{path}: {INDEX_NAME} line {lo + at + 1} (sample {lo + at}) gives offset "
                f"{int(offsets[at])}, past the end of the file ({size} bytes); is the shard cut "
                "short?"
            )
        for local in sorted({0, len(offsets) - 1}):
            i, offset = lo + local, int(offsets[local])
            cut = cut_short(buf, offset)
            if cut is not None:
                raise DatasetFormatError(
                    f"{path}: the record at offset {offset} ({INDEX_NAME} line {i + 1}, "
                    f"sample {i}) {cut}; is the shard cut short?"
                )
            try:
                header, _, _ = header_at(buf, offset)
            except RecordIOError:
                continue  # a damaged record: a RecordError when read (on_error applies)
            if header.id != i:
                raise DatasetFormatError(
                    f"{path}: offset {offset} ({INDEX_NAME} line {i + 1}) holds the record of "
                    f"sample {header.id}, not of sample {i}; is the index from another build?"
                )
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


class RecordIODataset(ShardedDataset):
    """A packed RecordIO dataset, or a bare MXNet ``.rec``/``.idx`` pair, as a map-style Dataset.

    Records are read by offset from a read-only ``mmap`` of each ``.rec``, opened lazily in the
    process that reads it and shared with every dataset object of that process; the object
    pickles without it.

    A packed dataset takes its labels from ``index.jsonl`` (any JSON label). A bare pair takes
    them from the MXNet headers: a float, or a float32 array when the header's flag is > 0.
    Its samples are the ``.idx`` records in file order; when the record of key 0 is an
    InsightFace meta record (flag > 0, no image; label[0] = 1 + number of images), the samples
    are keys ``1 .. label[0] - 1`` and the meta and identity records are skipped. A ``.rec``
    without ``.idx`` is scanned for its record offsets (with a warning: that reads the whole
    file), skipping records that hold no image.

    Args:
        path: the dataset directory written by ``packer build --format recordio``, or a bare
            ``.rec`` (its ``.idx``, their prefix, or a directory holding one ``.rec``).
        transform, decode, verify_crc, on_error: as for `ShardedDataset` (``verify_crc``
            applies to packed datasets).

    Raises:
        DatasetFormatError: the path is not a dataset or its files disagree: a shard missing
            or cut short, or an offset of a shard's first or last sample that does not point
            at its record (every other offset is checked when read, and by ``packer verify``).
    """

    shard_format = FORMAT
    reads_ranges = True
    format = FORMAT.name

    keys: np.ndarray | None = None
    """The ``.idx`` key of every sample of a bare pair (header ids when scanned)."""
    meta_label: np.ndarray | None = None
    """The label vector of a bare pair's InsightFace meta record, when it has one."""
    rec_path: Path | None = None
    idx_path: Path | None = None
    """The files of a bare pair (``idx_path`` None when the ``.rec`` has no ``.idx``)."""
    _bare_labels: np.ndarray | None = None
    _bare_labels_known = False

    def _open_packed(self, index: DatasetIndex) -> None:
        if index.offset is None or (len(index.offset) and int(index.offset.min()) < 0):
            raise DatasetFormatError(
                f"{self.root}: index.jsonl lacks the 'offset' of some RecordIO records"
            )
        self.offsets: np.ndarray = index.offset
        self._shard_paths = [FORMAT.shard_path(self.root, n) for n in index.shard_names]
        for shard, path in enumerate(self._shard_paths):
            lo, hi = int(self.shard_bounds[shard]), int(self.shard_bounds[shard + 1])
            check_packed_shard(path, self.offsets[lo:hi], lo, shard)

    _remote: RemoteShards | None = None
    _ends: np.ndarray | None = None

    def _open_remote(self, url: str, storage_options: dict[str, Any] | None) -> None:
        """Open a packed dataset in object storage: the index fetched, records read by range."""
        self._remote = remote = RemoteShards(url, storage_options, FORMAT)
        self.index = index = remote.index
        self._raw_dims = index.raw_dims()
        self.shard_bounds = index.shard_bounds
        if index.offset is None or (len(index.offset) and int(index.offset.min()) < 0):
            raise DatasetFormatError(f"{url}: {INDEX_NAME} lacks the 'offset' of some records")
        self.offsets = index.offset
        self._shard_paths = remote.shard_urls
        try:
            self._ends = record_ends(self.offsets, self.shard_bounds, remote.sizes)
        except DatasetFormatError as exc:
            raise DatasetFormatError(f"{url}: {exc}") from None

    @property
    def chunk_bytes(self) -> int:
        """Stored bytes per default chunk (`readers.io.hints.resolve_chunk_size`).

        Larger for a dataset in object storage, so that a chunk of a shuffled order is one
        large ranged GET (fewer requests, each priced and each with its latency).
        """
        return REMOTE_CHUNK_BYTES if self._remote is not None else CHUNK_BYTES

    @property
    def prefetch_runs(self) -> int:
        """How many runs `ShardStream` announces ahead: more GETs in flight for object storage."""
        return RUNS_AHEAD if self._remote is not None else 1

    def prefetch(self, start: int, stop: int) -> None:
        """Read ahead samples ``start..stop-1``: page-cache hints, or ranged GETs in the back.

        For a dataset in object storage the records of each shard are fetched in a few large
        ranged GETs (`readers.datasets.remote.run_pieces`) on this process's thread pool and
        kept for the reads that follow (`readers.io.ranges.RangeCache`).
        """
        if self._remote is None or self._ends is None:
            super().prefetch(start, stop)
            return
        self._ahead.covered(start, stop)
        start, stop = max(0, int(start)), min(len(self), int(stop))
        if start >= stop:
            return
        bounds = self.shard_bounds
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, stop - 1, side="right")) - 1
        ranges: list[tuple[int, int, int]] = []
        for shard in range(first, last + 1):
            lo, hi = max(start, int(bounds[shard])), min(stop, int(bounds[shard + 1]))
            pieces = run_pieces(self.offsets[lo:hi], self._ends[lo:hi])
            ranges.extend((shard, b, e) for b, e in pieces)
        self._remote.cache.prefetch(ranges)

    def _record(self, i: int, shard: int) -> tuple[Any, int]:
        """A buffer holding sample `i`'s record and the record's offset in it."""
        if self._remote is None or self._ends is None:
            return self._handle(shard), int(self.offsets[i])
        begin, end = int(self.offsets[i]), int(self._ends[i])
        return self._remote.cache.locate(shard, begin, end)

    def _check_remote(self, i: int, shard: int, image: Any, problem: str | None) -> None:
        """Check a record read by range against the index; name the object on a mismatch."""
        if problem is None and self.index is not None:
            if len(image) != int(self.index.nbytes[i]):
                problem = f"{len(image)} image bytes, the index says {int(self.index.nbytes[i])}"
            elif (crc := crc32(image)) != int(self.index.crc32[i]):
                problem = f"CRC-32 {crc:08x}, the index says {int(self.index.crc32[i]):08x}"
        if problem is None or self._remote is None:
            return
        why = f"sample {i} at offset {int(self.offsets[i])}: {problem}"
        self._remote.objects.check_unchanged(shard, why)  # raises when the object changed
        raise RecordError(
            f"{self._where(i, shard)}: {problem}, though the object is the one opened (same "
            "size and ETag): it does not match its index; re-upload the dataset"
        )

    def _open_bare(self) -> None:
        pair = FORMAT.find_bare(self.root)
        if pair is None:
            raise DatasetFormatError(
                f"{self.root}: neither a packed dataset ({META_NAME}) nor a RecordIO file "
                f"({REC_SUFFIX} with its {IDX_SUFFIX}, or their common prefix)"
            )
        rec, idx = pair
        self.rec_path, self.idx_path = rec, idx
        self._shard_paths = [str(rec)]
        if idx is not None:
            self._open_with_idx(rec, idx)
        else:
            warnings.warn(
                f"{rec}: no {IDX_SUFFIX} beside it; scanning the whole file for record offsets "
                f"(write a {IDX_SUFFIX} to open it instantly)",
                stacklevel=3,
            )
            self.keys, self.offsets, self._bare_labels = scan_images(rec, self._handle(0))
            self._bare_labels_known = True
        self.shard_bounds = np.asarray([0, len(self.offsets)], dtype=np.int64)

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        begin = int(self.offsets[lo])
        shard_end = int(self.shard_bounds[shard + 1])
        end = int(self.offsets[hi]) if hi < shard_end else os.path.getsize(self._shard_paths[shard])
        if end <= begin:  # a bare pair's .idx need not be in file order
            chunk = self.offsets[lo:hi]
            begin, end = int(chunk.min()), int(chunk.max()) + (1 << 20)
        return self._shard_paths[shard], begin, end

    def _open_with_idx(self, rec: Path, idx: Path) -> None:
        self.keys, self.offsets, self.meta_label = indexed_images(rec, idx, self._handle(0))

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label, for samplers and filters.

        The index's class ids for a packed dataset; for a bare pair the header labels when all
        are single integral numbers (read from every header on first use), else None.
        """
        if self.index is not None:
            return self.index.labels.as_ints()
        if not self._bare_labels_known:
            buf = self._handle(0)
            values = [header_at(buf, int(o))[1] for o in self.offsets]
            self._bare_labels, self._bare_labels_known = int_labels(values), True
        return self._bare_labels

    def _where(self, i: int, shard: int) -> str:
        key = i if self.keys is None else int(self.keys[i])
        return (
            f"{self._shard_paths[shard]} key {key} sample {i} (offset {int(self.offsets[i])})"
            f"{self._source(i)}"
        )

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        try:
            buf, at = self._record(i, shard)
            # a remote record is a view of the immutable body received: no copy of its own
            payload, _ = (
                read_record_at(buf, at) if self._remote is None else view_record_at(buf, at)
            )
            header, header_label, image = unpack_image_record(payload)
        except RecordIOError as exc:
            self._check_remote(i, shard, b"", str(exc))
            raise RecordError(f"{self._where(i, shard)}: {exc}") from exc
        except OSError as exc:
            if handles.is_resource_error(exc):
                raise
            raise RecordError(f"{self._where(i, shard)}: read failed ({exc})") from exc
        if self.index is not None:
            if self._remote is not None:  # every remote record is checked: never wrong bytes
                problem = None if header.id == i else f"the header's id is {header.id}"
                self._check_remote(i, shard, image, problem)
            if header.id != i:
                raise RecordError(
                    f"{self._where(i, shard)}: the record's header id is {header.id}; the index "
                    "points at another record"
                )
            self._check_crc(i, image, lambda: self._where(i, shard))
            label: Any = self.index.labels[i]
        else:
            label = header_label
        if as_bytes or self.decode == "bytes":
            return bytes(image), label
        try:
            return self.decode_stored(image, i), label
        except ValueError as exc:
            raise RecordError(f"{self._where(i, shard)}: cannot decode ({exc})") from exc
