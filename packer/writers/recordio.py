"""RecordIO shards byte-compatible with MXNet: ``shard-NNNNN.rec`` (records) + ``.idx`` (offsets).

Each sample is one MXNet image record (``IRHeader`` + optional float32 labels + the stored
image bytes); its ``.idx`` key and ``IRHeader.id`` are the global sample id, so the key of a
sample is the same whichever shard holds it.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import PackerError
from packer.problems import Problem
from packer.records import Record
from packer.writers.base import ShardWriter
from readers.formats.recordio import (
    IR_HEADER,
    MAGIC,
    MAX_PAYLOAD,
    RecordFileWriter,
    RecordTooLargeError,
    format_idx_line,
    pack_image_record,
)

TOO_LARGE = "too_large"
"""errors.jsonl reason of an image too large for one RecordIO record."""

REC_SUFFIX = ".rec"
IDX_SUFFIX = ".idx"

_F32_MAX = float(np.finfo(np.float32).max)


def recordio_layout() -> dict[str, str]:
    """What meta.json records under ``writer`` for a RecordIO build."""
    return {
        "layout": "dmlc RecordIO, MXNet image records (IRHeader <IfQQ)",
        "idx_key": "global sample id",
        "header_id": "global sample id",
    }


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and abs(float(value)) <= _F32_MAX
    )


def header_label(label: Any) -> float | list[float] | None:
    """The label as it goes into the ``IRHeader``: one number, several numbers, or None.

    A number (a class id or a float) is the header's single float label (flag 0); a non-empty
    list of numbers becomes ``flag = len`` float32 labels after the header; anything else
    (text, an object, None, a bool, a number beyond float32) is stored as flag 0, label 0.0 and
    lives in ``index.jsonl`` only. Class ids above 2**24 lose precision in float32, as they do
    in MXNet; the index keeps the exact value.
    """
    if _is_number(label):
        return float(label)
    if isinstance(label, list) and label and all(_is_number(v) for v in label):
        return [float(v) for v in label]
    return None


def payload_size(record: Record) -> int:
    """Bytes of the MXNet image-record payload that `record` becomes."""
    label = header_label(record.label)
    extra = 4 * len(label) if isinstance(label, list) else 0
    return IR_HEADER.size + extra + len(record.data)


def oversize_problem(record: Record) -> Problem | None:
    """A ``too_large`` problem when `record` cannot be one RecordIO record, else None."""
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
        return [base.with_name(base.name + REC_SUFFIX), base.with_name(base.name + IDX_SUFFIX)]

    @classmethod
    def check(cls, record: Record) -> Problem | None:
        return oversize_problem(record)

    @classmethod
    def renumber(
        cls, base: Path, old_first: int, new_first: int, offsets: list[int | None]
    ) -> int | None:
        return renumber_shard(base, old_first, new_first, [int(o or 0) for o in offsets])

    @classmethod
    def describe(cls) -> dict[str, str]:
        return recordio_layout()

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.rec_path, self.idx_path = self.paths(base)
        self._rec = open(self.rec_path, "xb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._idx = open(self.idx_path, "x", encoding="ascii", newline="\n")  # noqa: SIM115
        self._records = RecordFileWriter(self._rec)

    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        size = payload_size(record)
        if size > MAX_PAYLOAD:
            raise RecordTooLargeForShardError(record.rel, self.rec_path, size)
        payload = pack_image_record(record.data, label=header_label(record.label), id=sample_id)
        try:
            offset = self._records.write(payload)
        except RecordTooLargeError as exc:  # pragma: no cover - the check above comes first
            raise RecordTooLargeForShardError(record.rel, self.rec_path, exc.size) from exc
        self._idx.write(format_idx_line(sample_id, offset))
        return str(sample_id), offset

    def close(self) -> int:
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return os.path.getsize(self.rec_path) + os.path.getsize(self.idx_path)

    def abort(self) -> None:
        for f in (self._rec, self._idx):
            with contextlib.suppress(OSError):  # best effort on the way out of a failed build
                f.close()

    def files(self) -> list[Path]:
        return [self.rec_path, self.idx_path]


def renumber_shard(base: Path, old_first: int, new_first: int, offsets: list[int]) -> int:
    """Give the records of a finished shard the ids ``new_first, new_first + 1, ...``.

    Used when a shard was written before the final first id was known (the Ray engine):
    each record's ``IRHeader.id`` is rewritten in place and the ``.idx`` written anew.  The
    record framing does not change, since an id below 0xced7230a cannot contain the magic.
    """
    rec_path = base.with_name(base.name + REC_SUFFIX)
    idx_path = base.with_name(base.name + IDX_SUFFIX)
    head = struct.Struct("<II")
    with open(rec_path, "r+b") as f:
        for j, offset in enumerate(offsets):
            f.seek(offset)
            magic, lrec = head.unpack(f.read(head.size))
            if magic != MAGIC or lrec >> 29 != 0 or new_first + j >= MAGIC:
                raise PackerError(
                    f"{rec_path}: record at {offset} cannot be renumbered in place "
                    "(a multi-part record); rebuild without --engine ray"
                )
            f.seek(offset + head.size + 8)  # IRHeader: flag (4), label (4), id (8), id2 (8)
            f.write(struct.pack("<Q", new_first + j))
        f.flush()
        os.fsync(f.fileno())
    with open(idx_path, "w", encoding="ascii", newline="\n") as f:
        for j, offset in enumerate(offsets):
            f.write(format_idx_line(new_first + j, offset))
        f.flush()
        os.fsync(f.fileno())
    del old_first
    # the .idx keys may have gained or lost digits: the shard's size is measured anew
    return os.path.getsize(rec_path) + os.path.getsize(idx_path)


__all__ = [
    "TOO_LARGE",
    "RecordIOShardWriter",
    "RecordTooLargeForShardError",
    "header_label",
    "oversize_problem",
    "payload_size",
    "recordio_layout",
    "renumber_shard",
]
