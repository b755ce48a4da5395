"""paddle.io Datasets over packed shards: ``ds[i] -> (HWC uint8 image, label)``."""

from __future__ import annotations

import mmap
import os
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import cv2
import lmdb
import numpy as np
import paddle

from readers import handles
from readers.decode import check_mode, decode_image, decode_raw
from readers.errors import DatasetFormatError, RecordError
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.formats.lmdb import DATA_FILE, NUM_SAMPLES_KEY, image_key, label_key, shared_lmdb
from readers.formats.recordio import (
    IR_HEADER,
    MAGIC,
    IRHeader,
    RecordIOError,
    decode_lrec,
    read_idx,
    read_record_at,
    scan_offsets,
    unpack_image_record,
)
from readers.index import DatasetIndex, load_index, load_meta

REC_SUFFIX = ".rec"
IDX_SUFFIX = ".idx"
_REC_HEAD = struct.Struct("<II")


ON_ERROR = ("raise", "skip")


class _ShardedDataset(paddle.io.Dataset[tuple[Any, Any]]):
    """What every packed format shares: options, the index, lazy per-process handles,
    bounds checks, pickling without handles, transform, the ``on_error`` policy.

    A subclass sets ``_shard_paths`` and ``shard_bounds`` (and ``index`` for a packed
    dataset), and implements ``_open(path)`` and ``_read(i, shard, as_bytes=...)``.
    """

    format: ClassVar[str]

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None,
        decode: str,
        *,
        verify_crc: bool,
        on_error: str = "raise",
    ) -> None:
        check_mode(decode)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
        self.root = Path(path)
        self.transform = transform
        self.decode = decode
        self.verify_crc = verify_crc
        self.on_error = on_error
        self.skipped = 0
        """Samples this process replaced by another (``on_error="skip"``); a DataLoader
        worker's count stays in that worker."""
        self._bad: set[int] = set()
        self._warned = False
        self.index: DatasetIndex | None = None
        self.shard_bounds: np.ndarray = np.zeros(1, dtype=np.int64)
        self._shard_paths: list[str] = []
        self._raw_dims: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._handles: list[Any] = []
        self._generation = -1

    def _load_packed(self) -> DatasetIndex:
        raw = self._stores_raw()
        index = load_index(self.root, extra=("width", "height", "channels") if raw else ())
        self._raw_dims = (
            (index.extra["height"], index.extra["width"], index.extra["channels"]) if raw else None
        )
        if index.format != self.format:
            raise DatasetFormatError(
                f"{self.root}: a {index.format} dataset, not {self.format_title}; use "
                f"{_CLASS_OF.get(index.format, 'the matching dataset class')} or open_dataset()"
            )
        self.index = index
        self.shard_bounds = index.shard_bounds
        return index

    def _stores_raw(self) -> bool:
        """Whether the packed dataset holds decoded pixels (``--encode raw``)."""
        try:
            options = load_meta(self.root).get("options")
        except DatasetFormatError:
            return False
        return isinstance(options, dict) and options.get("encode") == "raw"

    def _decode(self, buf: Any, i: int) -> Any:
        if self._raw_dims is not None:
            h, w, c = self._raw_dims
            return decode_raw(buf, int(h[i]), int(w[i]), int(c[i]), self.decode)
        try:
            return decode_image(buf, self.decode)
        except cv2.error as exc:  # some corrupt headers make OpenCV raise instead of fail
            raise ValueError(f"OpenCV: {exc}") from exc

    @property
    def format_title(self) -> str:
        return {"lmdb": "LMDB", "recordio": "RecordIO"}[self.format]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = []
        state["_generation"] = -1
        state["skipped"] = 0  # counts are per process
        state["_bad"] = set()
        state["_warned"] = False
        return state

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label (when labels are class ids), for samplers and filters."""
        return self.index.labels.as_ints() if self.index is not None else None

    def _open(self, path: str) -> Any:
        raise NotImplementedError

    def _handle(self, shard: int) -> Any:
        if self._generation != handles.generation:
            self._handles = [None] * len(self._shard_paths)
            self._generation = handles.generation
        handle = self._handles[shard]
        if handle is None:
            handle = self._open(self._shard_paths[shard])
            self._handles[shard] = handle
        return handle

    def _source(self, i: int) -> str:
        path = self.index.path_of(i) if self.index is not None else None
        return f" (source {path})" if path else ""

    def _locate(self, i: int) -> tuple[int, int]:
        """``(i, shard)`` for a possibly negative sample number; IndexError when out of range."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for a dataset of {n}")
        return i, int(np.searchsorted(self.shard_bounds, i, side="right")) - 1

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        raise NotImplementedError

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        """The file and byte range ``[start, stop)`` holding samples ``lo..hi-1`` of `shard`."""
        raise NotImplementedError

    def prefetch(self, start: int, stop: int) -> None:
        """Ask the OS to read the bytes of samples ``start..stop-1`` into the page cache now.

        Samplers call this when they enter a chunk, so that the chunk arrives in one large
        sequential read instead of one small read per record (``POSIX_FADV_WILLNEED``; the
        hint is for the whole machine, so calling it from the main process serves every
        DataLoader worker). A hint only: errors are ignored, and single random reads work
        without it.
        """
        start, stop = max(0, int(start)), min(len(self), int(stop))
        if start >= stop or not hasattr(os, "posix_fadvise"):
            return
        first = int(np.searchsorted(self.shard_bounds, start, side="right")) - 1
        last = int(np.searchsorted(self.shard_bounds, stop - 1, side="right")) - 1
        for shard in range(first, last + 1):
            lo = max(start, int(self.shard_bounds[shard]))
            hi = min(stop, int(self.shard_bounds[shard + 1]))
            try:
                found = self._byte_range(shard, lo, hi)
                if found is not None:
                    path, begin, end = found
                    fd = handles.shared_fd(path)
                    os.posix_fadvise(fd, begin, end - begin, os.POSIX_FADV_WILLNEED)
            except Exception:  # a hint must never fail a read
                continue

    def read_bytes(self, i: int) -> bytes:
        """The stored bytes of sample `i`."""
        i, shard = self._locate(i)
        return self._read(i, shard, as_bytes=True)[0]  # type: ignore[no-any-return]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        n, shard = self._locate(int(i))
        try:
            image, label = self._read(n, shard, as_bytes=False)
        except RecordError as exc:
            if self.on_error != "skip":
                raise
            image, label = self._substitute(n, exc)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def _substitute(self, i: int, error: RecordError) -> tuple[Any, Any]:
        """The next readable sample after `i` in id order (wrapping), for ``on_error="skip"``.

        Deterministic: the same bad sample is always replaced by the same good one, in every
        process and epoch, whatever was read before; samples found bad are remembered (per
        process) so that a run of them is not re-read at every call.
        """
        self._bad.add(i)
        self.skipped += 1
        n = len(self)
        for step in range(1, n):
            j = (i + step) % n
            if j in self._bad:
                continue
            try:
                found = self._read(j, self._locate(j)[1], as_bytes=False)
            except RecordError:
                self._bad.add(j)
                continue
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"{error}; returning sample {j} in its place (on_error='skip'). Further "
                    "bad samples are replaced without a warning and counted in .skipped",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return found
        raise RecordError(f"{self.root}: no sample of {n} could be read (the first: {error})")


class LmdbDataset(_ShardedDataset):
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
        on_error: ``raise`` (default): a sample that cannot be read, decoded or checked
            raises `RecordError`; ``skip``: it is replaced by the next readable sample in id
            order (wrapping), counted in ``skipped``, with one warning per process. Damage to
            the dataset's structure (a missing or cut shard) always raises.

    Raises:
        DatasetFormatError: the path is not a dataset, its files disagree, or a shard listed
            in meta.json is missing (a shard cut short is found when it is first opened).
    """

    format = "lmdb"

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: str = "rgb",
        *,
        verify_crc: bool = False,
        on_error: str = "raise",
    ) -> None:
        super().__init__(path, transform, decode, verify_crc=verify_crc, on_error=on_error)
        if (self.root / META_NAME).exists():
            index = self._load_packed()
            self._shard_paths = [str(self.root / n) for n in index.shard_names]
            for number, shard_dir in enumerate(self._shard_paths):
                if not os.path.isfile(os.path.join(shard_dir, DATA_FILE)):
                    raise DatasetFormatError(
                        f"{os.path.join(shard_dir, DATA_FILE)}: missing ({META_NAME} lists "
                        f"{len(self._shard_paths)} shards; this is shard {number})"
                    )
        elif (self.root / DATA_FILE).exists():
            self._shard_paths = [str(self.root)]
            env = shared_lmdb(str(self.root))
            with env.begin() as txn:
                raw = txn.get(NUM_SAMPLES_KEY)
            if raw is None:
                raise DatasetFormatError(
                    f"{self.root}: an LMDB without a 'num-samples' key; expected the PaddleOCR "
                    "layout (num-samples, image-%09d, label-%09d)"
                )
            self.shard_bounds = np.asarray([0, int(raw)], dtype=np.int64)
        else:
            raise DatasetFormatError(
                f"{self.root}: neither a packed dataset ({META_NAME}) nor an LMDB ({DATA_FILE})"
            )

    @property
    def _envs(self) -> list[Any]:
        return self._handles

    def _open(self, path: str) -> Any:
        return shared_lmdb(path)

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

    def _where(self, i: int, shard: int, key: bytes) -> str:
        return f"{self._shard_paths[shard]} key {key.decode()} sample {i}{self._source(i)}"

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        local = i - int(self.shard_bounds[shard]) + 1
        key = image_key(local)
        try:
            with self._env(shard).begin(buffers=True) as txn:
                buf = txn.get(key)
                if buf is None:
                    raise RecordError(f"{self._where(i, shard, key)}: the key is missing")
                if self.verify_crc and self.index is not None:
                    crc = zlib.crc32(buf)
                    if crc != int(self.index.crc32[i]):
                        raise RecordError(
                            f"{self._where(i, shard, key)}: CRC-32 {crc:08x} does not match "
                            f"the index ({int(self.index.crc32[i]):08x})"
                        )
                if as_bytes or self.decode == "bytes":
                    image: Any = bytes(buf)
                else:
                    image = self._decode(buf, i)
                if self.index is not None:
                    label: Any = self.index.labels[i]
                else:
                    raw = txn.get(label_key(local))
                    label = None if raw is None else bytes(raw).decode("utf-8")
        except RecordError:
            raise
        except ValueError as exc:
            raise RecordError(f"{self._where(i, shard, key)}: cannot decode ({exc})") from exc
        except (lmdb.Error, OSError) as exc:
            raise RecordError(f"{self._where(i, shard, key)}: read failed ({exc})") from exc
        return image, label


def find_recordio_pair(path: str | os.PathLike[str]) -> tuple[Path, Path | None] | None:
    """The ``.rec`` file (and its ``.idx``, if any) that `path` names, or None.

    `path` may be the ``.rec`` file, its ``.idx``, their common prefix (``data/train`` for
    ``data/train.rec``), or a directory holding exactly one ``.rec`` (an InsightFace dataset
    folder). A packed dataset directory (with ``meta.json``) is not a bare pair.
    """
    p = Path(path)

    def with_idx(rec: Path) -> tuple[Path, Path | None]:
        idx = rec.with_suffix(IDX_SUFFIX)
        return rec, idx if idx.is_file() else None

    if p.is_file():
        if p.suffix == REC_SUFFIX:
            return with_idx(p)
        if p.suffix == IDX_SUFFIX and p.with_suffix(REC_SUFFIX).is_file():
            return p.with_suffix(REC_SUFFIX), p
        return None
    if p.is_dir():
        if (p / META_NAME).exists() or (p / DATA_FILE).exists():
            return None
        recs = sorted(q for q in p.glob(f"*{REC_SUFFIX}") if q.is_file())
        return with_idx(recs[0]) if len(recs) == 1 else None
    prefixed = Path(f"{p}{REC_SUFFIX}")
    if prefixed.is_file():
        return with_idx(prefixed)
    return None


def _header_at(buf: Any, offset: int) -> tuple[IRHeader, Any, int]:
    """``(header, label, image length)`` of the image record at `offset`, reading only the
    header of a one-part record (the common case) and the whole record otherwise."""
    if offset + _REC_HEAD.size + IR_HEADER.size <= len(buf):
        magic, lrec = _REC_HEAD.unpack_from(buf, offset)
        cflag, length = decode_lrec(lrec)
        start = offset + _REC_HEAD.size
        if magic == MAGIC and cflag == 0 and start + length <= len(buf):
            header = IRHeader(*IR_HEADER.unpack_from(buf, start))
            body = IR_HEADER.size + 4 * header.flag
            if header.flag == 0:
                return header, header.label, length - IR_HEADER.size
            if body <= length:
                labels = np.frombuffer(
                    buf, dtype="<f4", count=header.flag, offset=start + IR_HEADER.size
                ).astype(np.float32)
                return header, labels, length - body
    payload, _ = read_record_at(buf, offset)
    header, label, image = unpack_image_record(payload)
    return header, label, len(image)


def _cut_short(buf: Any, offset: int) -> str | None:
    """How the one-part record at `offset` runs past the end of `buf`, or None when it does
    not (a record that is damaged in another way is left to the read that meets it)."""
    size = len(buf)
    if offset + _REC_HEAD.size > size:
        return f"needs {_REC_HEAD.size} header bytes but the file ends at byte {size}"
    magic, lrec = _REC_HEAD.unpack_from(buf, offset)
    cflag, length = decode_lrec(lrec)
    end = offset + _REC_HEAD.size + length
    if magic == MAGIC and cflag == 0 and end > size:
        return f"is {length} bytes long and would end at byte {end}, past the end ({size} bytes)"
    return None


def _int_labels(values: list[Any]) -> np.ndarray | None:
    """The labels as int64 when every one is a single integral number, else None."""
    if not values or not all(isinstance(v, float) and v.is_integer() for v in values):
        return None
    return np.asarray(values, dtype=np.int64)


class RecordIODataset(_ShardedDataset):
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
        transform: applied to the decoded image.
        decode: ``rgb`` (default), ``bgr``, ``gray``, ``unchanged`` or ``bytes`` (the stored
            bytes untouched).
        verify_crc: check each record's CRC-32 against the index on read (packed datasets).
        on_error: ``raise`` (default) or ``skip``, as for `LmdbDataset`.

    Raises:
        DatasetFormatError: the path is not a dataset or its files disagree: a shard missing
            or cut short, or an offset of a shard's first or last sample that does not point
            at its record (every other offset is checked when read, and by ``packer verify``).
    """

    format = "recordio"

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: str = "rgb",
        *,
        verify_crc: bool = False,
        on_error: str = "raise",
    ) -> None:
        super().__init__(path, transform, decode, verify_crc=verify_crc, on_error=on_error)
        self.keys: np.ndarray | None = None
        """The ``.idx`` key of every sample of a bare pair (header ids when scanned)."""
        self.meta_label: np.ndarray | None = None
        """The label vector of a bare pair's InsightFace meta record, when it has one."""
        self.rec_path: Path | None = None
        self.idx_path: Path | None = None
        """The files of a bare pair (``idx_path`` None when the ``.rec`` has no ``.idx``)."""
        self._bare_labels: np.ndarray | None = None
        self._bare_labels_known = False
        if (self.root / META_NAME).exists():
            index = self._load_packed()
            if index.offset is None or (len(index.offset) and int(index.offset.min()) < 0):
                raise DatasetFormatError(
                    f"{self.root}: index.jsonl lacks the 'offset' of some RecordIO records"
                )
            self.offsets: np.ndarray = index.offset
            self._shard_paths = [str(self.root / f"{n}{REC_SUFFIX}") for n in index.shard_names]
            for shard in range(len(self._shard_paths)):
                self._check_shard(shard)
            return
        pair = find_recordio_pair(self.root)
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
            self._open_by_scan(rec)
        self.shard_bounds = np.asarray([0, len(self.offsets)], dtype=np.int64)

    def _open(self, path: str) -> Any:
        return handles.shared_mmap(path)

    def _check_shard(self, shard: int) -> None:
        """A packed shard exists, holds every offset, and its first and last offsets point at
        the records of those samples (a cut ``.rec`` fails here, not mid-epoch)."""
        path = self._shard_paths[shard]
        lo, hi = int(self.shard_bounds[shard]), int(self.shard_bounds[shard + 1])
        try:
            buf = handles.open_mmap_readonly(path)
        except OSError as exc:
            raise DatasetFormatError(
                f"{path}: cannot open ({exc.strerror or exc}); {META_NAME} lists it as shard "
                f"{shard}"
            ) from exc
        try:
            size = len(buf)
            if hi == lo:
                return
            offsets = self.offsets[lo:hi]
            if int(offsets.max()) >= size:
                at = lo + int(np.argmax(offsets >= size))
                raise DatasetFormatError(
                    f"{path}: {INDEX_NAME} line {at + 1} (sample {at}) gives offset "
                    f"{int(self.offsets[at])}, past the end of the file ({size} bytes); is the "
                    "shard cut short?"
                )
            for i in sorted({lo, hi - 1}):
                offset = int(self.offsets[i])
                cut = _cut_short(buf, offset)
                if cut is not None:
                    raise DatasetFormatError(
                        f"{path}: the record at offset {offset} ({INDEX_NAME} line {i + 1}, "
                        f"sample {i}) {cut}; is the shard cut short?"
                    )
                try:
                    header, _, _ = _header_at(buf, offset)
                except RecordIOError:
                    continue  # a damaged record: a RecordError when read (on_error applies)
                if header.id != i:
                    raise DatasetFormatError(
                        f"{path}: offset {offset} ({INDEX_NAME} line {i + 1}) holds the record "
                        f"of sample {header.id}, not of sample {i}; is the index from another "
                        "build?"
                    )
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        begin = int(self.offsets[lo])
        shard_end = int(self.shard_bounds[shard + 1])
        end = int(self.offsets[hi]) if hi < shard_end else os.path.getsize(self._shard_paths[shard])
        if end <= begin:  # a bare pair's .idx need not be in file order
            chunk = self.offsets[lo:hi]
            begin, end = int(chunk.min()), int(chunk.max()) + (1 << 20)
        return self._shard_paths[shard], begin, end

    def _open_with_idx(self, rec: Path, idx: Path) -> None:
        try:
            keys, offsets = read_idx(idx)
        except (RecordIOError, OSError) as exc:
            raise DatasetFormatError(f"{idx}: cannot read the index ({exc})") from exc
        if len(keys) == 0:
            raise DatasetFormatError(f"{idx}: no records listed")
        buf = handles.shared_mmap(str(rec))
        size = len(buf)
        if int(offsets.max()) >= size:
            at = int(np.argmax(offsets >= size))
            raise DatasetFormatError(
                f"{idx}: key {int(keys[at])} has offset {int(offsets[at])}, past the end of "
                f"{rec} ({size} bytes); is the .rec cut short or the .idx from another file?"
            )
        last = int(offsets.max())
        cut = _cut_short(buf, last)
        if cut is not None:
            raise DatasetFormatError(
                f"{rec}: the last record (offset {last}, from {idx}) {cut}; is the .rec cut short?"
            )
        zero = np.flatnonzero(keys == 0)
        if zero.size:
            try:
                header, label, image_len = _header_at(buf, int(offsets[zero[0]]))
            except RecordIOError as exc:
                raise DatasetFormatError(
                    f"{rec}: the record of key 0 at offset {int(offsets[zero[0]])} does not "
                    f"parse ({exc})"
                ) from exc
            if header.flag > 0 and image_len == 0:
                self.meta_label = np.asarray(label, dtype=np.float32)
                keys, offsets = self._insightface_images(idx, keys, offsets, zero[0])
        self.keys, self.offsets = keys, offsets

    def _insightface_images(
        self, idx: Path, keys: np.ndarray, offsets: np.ndarray, meta_at: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keys and offsets of the images an InsightFace meta record announces: keys
        ``1 .. label[0] - 1``; without a usable range, every key but the meta record's."""
        assert self.meta_label is not None
        end = float(self.meta_label[0]) if self.meta_label.size else 0.0
        if not (end.is_integer() and 1 <= end <= len(keys)):
            return np.delete(keys, meta_at), np.delete(offsets, meta_at)
        wanted = np.arange(1, int(end), dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        pos = np.searchsorted(keys[order], wanted)
        found = (pos < len(keys)) & (keys[order][np.minimum(pos, len(keys) - 1)] == wanted)
        if not found.all():
            missing = int(wanted[np.argmin(found)])
            raise DatasetFormatError(
                f"{idx}: the meta record (key 0) announces images with keys 1..{int(end) - 1}, "
                f"but key {missing} is not in the index"
            )
        return wanted, offsets[order][pos]

    def _open_by_scan(self, rec: Path) -> None:
        warnings.warn(
            f"{rec}: no {IDX_SUFFIX} beside it; scanning the whole file for record offsets "
            f"(write a {IDX_SUFFIX} to open it instantly)",
            stacklevel=3,
        )
        buf = handles.shared_mmap(str(rec))
        try:
            offsets = scan_offsets(buf)
            keys: list[int] = []
            kept: list[int] = []
            labels: list[Any] = []
            for offset in offsets.tolist():
                header, label, image_len = _header_at(buf, offset)
                if image_len == 0:  # a meta or identity record (InsightFace), not an image
                    continue
                kept.append(offset)
                keys.append(header.id)
                labels.append(label)
        except RecordIOError as exc:
            raise DatasetFormatError(f"{rec}: not a readable RecordIO file ({exc})") from exc
        if not kept:
            raise DatasetFormatError(f"{rec}: holds no image records")
        self.keys = np.asarray(keys, dtype=np.uint64).astype(np.int64)
        self.offsets = np.asarray(kept, dtype=np.int64)
        self._bare_labels, self._bare_labels_known = _int_labels(labels), True

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label, for samplers and filters: the index's class ids for a
        packed dataset; for a bare pair the header labels when all are single integral
        numbers (read from every header on first use), else None."""
        if self.index is not None:
            return self.index.labels.as_ints()
        if not self._bare_labels_known:
            buf = self._handle(0)
            values = [_header_at(buf, int(o))[1] for o in self.offsets]
            self._bare_labels, self._bare_labels_known = _int_labels(values), True
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
            raise RecordError(f"{self._where(i, shard)}: read failed ({exc})") from exc
        if self.index is not None:
            if header.id != i:
                raise RecordError(
                    f"{self._where(i, shard)}: the record's header id is {header.id}; the index "
                    "points at another record"
                )
            if self.verify_crc:
                crc = zlib.crc32(image)
                if crc != int(self.index.crc32[i]):
                    raise RecordError(
                        f"{self._where(i, shard)}: CRC-32 {crc:08x} does not match the index "
                        f"({int(self.index.crc32[i]):08x})"
                    )
            label: Any = self.index.labels[i]
        else:
            label = header_label
        if as_bytes or self.decode == "bytes":
            return bytes(image), label
        try:
            return self._decode(image, i), label
        except ValueError as exc:
            raise RecordError(f"{self._where(i, shard)}: cannot decode ({exc})") from exc


_CLASS_OF = {"lmdb": "LmdbDataset", "recordio": "RecordIODataset"}


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> LmdbDataset | RecordIODataset:
    """Open whatever dataset is at `path`.

    Accepts a directory written by ``packer build`` (LMDB or RecordIO), a bare LMDB in the
    PaddleOCR layout, or a bare MXNet ``.rec`` (with its ``.idx``; the path of the ``.rec``,
    of the ``.idx``, their prefix, or a folder holding one ``.rec``). Keyword arguments go to
    the dataset class.

    Raises:
        DatasetFormatError: `path` is none of these; the message says what was found.
    """
    root = Path(path)
    if (root / META_NAME).exists():
        fmt = json_format(root)
        if fmt == "lmdb":
            return LmdbDataset(root, **kwargs)
        if fmt == "recordio":
            return RecordIODataset(root, **kwargs)
        raise DatasetFormatError(f"{root}: format {fmt!r} is not readable by this version")
    if (root / DATA_FILE).exists():
        return LmdbDataset(root, **kwargs)
    if find_recordio_pair(root) is not None:
        return RecordIODataset(root, **kwargs)
    expected = (
        f"expected {META_NAME} (packer build output), {DATA_FILE} (a bare LMDB) or a "
        f"{REC_SUFFIX} file (with its {IDX_SUFFIX})"
    )
    if root.is_dir():
        names = sorted(p.name for p in root.iterdir())
        recs = [n for n in names if n.endswith(REC_SUFFIX)]
        if len(recs) > 1:
            found = f"{len(recs)} {REC_SUFFIX} files {recs[:10]}; name the one to open"
        else:
            found = f"{names[:10]}" + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    elif root.is_file():
        found = (
            f"a {IDX_SUFFIX} without its {REC_SUFFIX}"
            if root.suffix == IDX_SUFFIX
            else "a file that is neither a directory nor a .rec"
        )
    else:
        found = "nothing at that path"
    raise DatasetFormatError(f"{root}: not a dataset packer can open: {expected}; found {found}")


def json_format(root: Path) -> str:
    """The ``format`` field of the meta.json at `root`."""
    from readers.index import load_meta

    return str(load_meta(root)["format"])
