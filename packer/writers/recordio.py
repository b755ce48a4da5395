"""RecordIO shards byte-compatible with MXNet: ``shard-NNNNN.rec`` (records) + ``.idx`` (offsets).

Each sample is one MXNet image record (``IRHeader`` + optional float32 labels + the stored
image bytes); its ``.idx`` key and ``IRHeader.id`` are the global sample id, so the key of a
sample is the same whichever shard holds it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from packer.errors import PackerError
from packer.problems import Problem
from packer.records import Record
from packer.writers.base import ShardWriter, clone_entry
from packer.writers.batch import RecordBatch
from readers.formats.recordio import (
    IDX_SUFFIX,
    IR_HEADER,
    MAGIC,
    MAX_PAYLOAD,
    REC_SUFFIX,
    RECORD_HEAD,
    RecordIOFormatError,
    RecordTooLargeError,
    encode_record,
    format_idx_line,
    image_record_bound,
    image_record_size,
    pack_labelled_image,
    read_idx,
    rewrite_ids,
)

TOO_LARGE = "too_large"
"""errors.jsonl reason of an image too large for one RecordIO record."""

# A one-part record of an image with one number as label, up to its image bytes: the record
# head (magic, lrec) and the IRHeader (flag, label, id, id2), as numpy lays them out in bulk.
_HEAD_DTYPE = np.dtype(
    [
        ("magic", "<u4"),
        ("lrec", "<u4"),
        ("flag", "<u4"),
        ("label", "<f4"),
        ("id", "<u8"),
        ("id2", "<u8"),
    ]
)
assert _HEAD_DTYPE.itemsize == RECORD_HEAD.size + IR_HEADER.size
_PADDING = tuple(b"\0" * k for k in range(4))


def recordio_layout() -> dict[str, str]:
    """What meta.json records under ``writer`` for a RecordIO build."""
    return {
        "layout": "dmlc RecordIO, MXNet image records (IRHeader <IfQQ)",
        "idx_key": "global sample id",
        "header_id": "global sample id",
    }


def payload_size(record: Record) -> int:
    """Bytes of the MXNet image-record payload that `record` becomes."""
    return image_record_size(len(record.data), record.label)


def oversize_problem(record: Record) -> Problem | None:
    """A ``too_large`` problem when `record` cannot be one RecordIO record, else None."""
    if image_record_bound(len(record.data), record.label) <= MAX_PAYLOAD:
        return None  # the common case, found without converting the label
    size = payload_size(record)
    if size <= MAX_PAYLOAD:
        return None
    return Problem(
        record.rel,
        TOO_LARGE,
        f"{size} bytes as an MXNet image record; RecordIO stores at most {MAX_PAYLOAD} bytes "
        "(2**29 - 1) per record",
    )


class RecordTooLargeForShardError(PackerError):
    """An image too large for one RecordIO record reached the shard writer."""

    def __init__(self, rel: str, shard: Path, size: int) -> None:
        super().__init__(
            f"{rel}: {size} bytes as an MXNet image record, too large for a RecordIO record in "
            f"{shard} (at most {MAX_PAYLOAD} bytes, 2**29 - 1); store a smaller or "
            "re-encoded image"
        )
        self.path = rel
        self.reason = TOO_LARGE


class RecordIOShardWriter(ShardWriter):
    """One RecordIO shard: ``shard-NNNNN.rec`` and its ``shard-NNNNN.idx``."""

    format = "recordio"
    global_keys = True  # the .idx key and IRHeader.id are the global sample id

    @classmethod
    def paths(cls, base: Path) -> list[Path]:
        """Return the shard's ``.rec`` and ``.idx`` paths."""
        return [base.with_name(base.name + REC_SUFFIX), base.with_name(base.name + IDX_SUFFIX)]

    @classmethod
    def check(cls, record: Record) -> Problem | None:
        """Return a problem when `record` is too large for a RecordIO record."""
        return oversize_problem(record)

    @classmethod
    def check_batch(cls, batch: RecordBatch) -> list[tuple[int, Problem]]:
        """Return the records of `batch` too large for a RecordIO record."""
        if not len(batch):
            return []
        if (
            batch.int_labels is not None
            and int(batch.nbytes().max()) + IR_HEADER.size <= MAX_PAYLOAD
        ):
            return []  # the common case, found for the whole batch at once
        return super().check_batch(batch)

    @classmethod
    def renumber(
        cls, base: Path, old_first: int, new_first: int, offsets: list[int | None]
    ) -> int | None:
        """Rewrite the ids of the finished shard (`renumber_shard`); return its new size."""
        return renumber_shard(base, old_first, new_first, [int(o or 0) for o in offsets])

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Return the RecordIO layout that wrote the shard."""
        return recordio_layout()

    reusable = True

    @classmethod
    def shard_keys(cls, local: int, sample_id: int, count: int) -> list[str]:
        """Return the records' global ids (the ``.idx`` keys)."""
        return [str(i) for i in range(sample_id, sample_id + count)]

    @classmethod
    def shard_offsets(
        cls, base: Path, first_id: int, offsets: np.ndarray
    ) -> tuple[list[int | None], np.ndarray | None]:
        """Return the records' offsets; the shard's ``.idx`` must hold them under the ids."""
        idx_path = cls.paths(base)[1]
        keys, found = read_idx(idx_path)
        if not np.array_equal(keys, np.arange(first_id, first_id + len(offsets))) or not (
            np.array_equal(found, offsets)
        ):
            raise ValueError(
                f"{idx_path}: not the keys {first_id}.. and offsets of the index's records"
            )
        return found.tolist(), None

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.rec_path, self.idx_path = self.paths(base)
        self._rec = open(self.rec_path, "xb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._idx = open(self.idx_path, "x", encoding="ascii", newline="\n")  # noqa: SIM115
        self._offset = 0  # where the next record starts

    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Append the record with its header id and label; return its (key, offset)."""
        payload = pack_labelled_image(record.data, record.label, id=sample_id)
        if len(payload) > MAX_PAYLOAD:
            raise RecordTooLargeForShardError(record.rel, self.rec_path, len(payload))
        try:
            encoded = encode_record(payload)
        except RecordTooLargeError as exc:  # pragma: no cover - the check above comes first
            raise RecordTooLargeForShardError(record.rel, self.rec_path, exc.size) from exc
        offset = self._offset
        self._rec.write(encoded)
        self._offset += len(encoded)
        self._idx.write(format_idx_line(sample_id, offset))
        return str(sample_id), offset

    def write_batch(
        self, local: int, sample_id: int, batch: RecordBatch
    ) -> tuple[list[str], list[int | None]]:
        """Append the records of `batch`, laid out in bulk; the bytes `write` would give.

        Each record is first laid out as one part (record head and IRHeader from one numpy
        array when the labels are class ids); the result is then searched once for the magic
        word at 4-byte-aligned offsets, and a record where it occurs anywhere but at its own
        start is encoded again by `encode_record` (split into parts, as dmlc's writer does).
        """
        n = len(batch)
        ids = range(sample_id, sample_id + n)
        nbytes = batch.nbytes()
        if batch.int_labels is not None:
            lengths = nbytes + IR_HEADER.size
            self._check_lengths(batch, lengths)
            heads = np.zeros(n, _HEAD_DTYPE)
            heads["magic"] = MAGIC
            heads["lrec"] = lengths  # cflag 0 and the payload's length
            # as IR_HEADER.pack(float(label)) rounds: int -> float64 -> float32
            heads["label"] = batch.int_labels.astype(np.float64).astype(np.float32)
            heads["id"] = np.arange(sample_id, sample_id + n, dtype=np.uint64)
            flat = heads.tobytes()
            size = _HEAD_DTYPE.itemsize
            prefixes = [flat[k : k + size] for k in range(0, n * size, size)]
        else:
            headers = [
                pack_labelled_image(b"", label, id=i)
                for label, i in zip(batch.label, ids, strict=True)
            ]
            lengths = nbytes + np.fromiter(map(len, headers), np.int64, count=n)
            self._check_lengths(batch, lengths)
            prefixes = [
                RECORD_HEAD.pack(MAGIC, m) + h
                for m, h in zip(lengths.tolist(), headers, strict=True)
            ]
        padding = -lengths % 4
        parts: list[bytes] = [b""] * (3 * n)
        parts[0::3] = prefixes
        parts[1::3] = batch.data
        parts[2::3] = [_PADDING[p] for p in padding.tolist()]
        sizes = RECORD_HEAD.size + lengths + padding
        starts = np.zeros(n, np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        blob = b"".join(parts)
        words = np.frombuffer(blob, dtype="<u4") == MAGIC
        # each record starts with the magic; any other aligned one is inside a payload
        if np.count_nonzero(words) != n or not words[starts // 4].all():
            # a payload holds the magic at an aligned offset: that record takes several parts
            inside = np.setdiff1d(np.flatnonzero(words) * 4, starts)
            for j in np.unique(np.searchsorted(starts, inside, side="right") - 1).tolist():
                payload = parts[3 * j][RECORD_HEAD.size :] + parts[3 * j + 1]
                parts[3 * j : 3 * j + 3] = [encode_record(payload), b"", b""]
                sizes[j] = len(parts[3 * j])
            starts[1:] = np.cumsum(sizes[:-1])
            blob = b"".join(parts)
        offsets = (starts + self._offset).tolist()
        self._rec.write(blob)
        self._offset += len(blob)
        self._idx.write("".join(map(format_idx_line, ids, offsets)))
        return list(map(str, ids)), offsets

    def _check_lengths(self, batch: RecordBatch, lengths: np.ndarray) -> None:
        if len(lengths) and int(lengths.max()) > MAX_PAYLOAD:
            at = int(np.argmax(lengths > MAX_PAYLOAD))
            raise RecordTooLargeForShardError(batch.rel[at], self.rec_path, int(lengths[at]))

    def close(self) -> int:
        """Flush, fsync and close ``.rec`` and ``.idx``; return their total size."""
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return os.path.getsize(self.rec_path) + os.path.getsize(self.idx_path)

    def abort(self) -> None:
        """Close both files without finishing them."""
        for f in (self._rec, self._idx):
            with contextlib.suppress(OSError):  # best effort on the way out of a failed build
                f.close()

    def files(self) -> list[Path]:
        """Return the shard's ``.rec`` and ``.idx`` files."""
        return [self.rec_path, self.idx_path]


def _unshare(path: Path) -> None:
    """Make `path` a file of its own when it is a hard link of another (a reused shard's).

    A clone (`clone_entry`: a reflink where the filesystem shares blocks, else a copy).
    """
    if os.stat(path).st_nlink > 1:
        own = path.with_name(path.name + ".own")
        own.unlink(missing_ok=True)  # left by an interrupted earlier run
        clone_entry(path, own)
        os.replace(own, path)


def renumber_shard(base: Path, old_first: int, new_first: int, offsets: list[int]) -> int:
    """Give the records of a finished shard the ids ``new_first, new_first + 1, ...``.

    Used when a shard was written before the final first id was known (the Ray engine):
    each record's ``IRHeader.id`` is rewritten in place and the ``.idx`` written anew
    (``readers.formats.recordio.rewrite_ids``).
    """
    rec_path = base.with_name(base.name + REC_SUFFIX)
    idx_path = base.with_name(base.name + IDX_SUFFIX)
    for path in (rec_path, idx_path):  # both are written in place below
        _unshare(path)
    try:
        rewrite_ids(rec_path, idx_path, new_first, offsets)
    except RecordIOFormatError as exc:
        raise PackerError(f"{exc}; rebuild without --engine ray") from exc
    del old_first
    # the .idx keys may have gained or lost digits: the shard's size is measured anew
    return os.path.getsize(rec_path) + os.path.getsize(idx_path)


__all__ = [
    "TOO_LARGE",
    "RecordIOShardWriter",
    "RecordTooLargeForShardError",
    "oversize_problem",
    "payload_size",
    "recordio_layout",
    "renumber_shard",
]
