"""`RecordIODataset`: a packed RecordIO dataset, or a bare MXNet ``.rec``/``.idx`` pair."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from readers.datasets.base import ShardedDataset
from readers.errors import DatasetFormatError, RecordError
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
)
from readers.formats.recordio.bare import (
    indexed_images,
    int_labels,
    scan_images,
)
from readers.index import DatasetIndex
from readers.io import handles


def check_packed_shard(path: str, offsets: np.ndarray, lo: int, shard: int) -> None:
    """A packed shard exists, holds every offset of its samples ``lo..lo+len(offsets)-1``,
    and its first and last offsets point at the records of those samples (a cut ``.rec``
    fails here, not mid-epoch).

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
        """Every sample's int label, for samplers and filters: the index's class ids for a
        packed dataset; for a bare pair the header labels when all are single integral
        numbers (read from every header on first use), else None."""
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
            payload, _ = read_record_at(self._handle(shard), int(self.offsets[i]))
            header, header_label, image = unpack_image_record(payload)
        except RecordIOError as exc:
            raise RecordError(f"{self._where(i, shard)}: {exc}") from exc
        except OSError as exc:
            if handles.is_resource_error(exc):
                raise
            raise RecordError(f"{self._where(i, shard)}: read failed ({exc})") from exc
        if self.index is not None:
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
