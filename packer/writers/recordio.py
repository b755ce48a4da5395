"""RecordIO shards byte-compatible with MXNet: ``shard-NNNNN.rec`` (records) + ``.idx`` (offsets).

Each sample is one MXNet image record (``IRHeader`` + optional float32 labels + the stored
image bytes); its ``.idx`` key and ``IRHeader.id`` are the global sample id, so the key of a
sample is the same whichever shard holds it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from packer.errors import PackerError
from packer.problems import Problem
from packer.records import Record
from packer.writers.base import ShardWriter
from readers.formats.recordio import (
    IDX_SUFFIX,
    MAX_PAYLOAD,
    REC_SUFFIX,
    RecordFileWriter,
    RecordIOFormatError,
    RecordTooLargeError,
    format_idx_line,
    image_record_bound,
    image_record_size,
    pack_labelled_image,
    rewrite_ids,
)

TOO_LARGE = "too_large"
"""errors.jsonl reason of an image too large for one RecordIO record."""


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
    def renumber(
        cls, base: Path, old_first: int, new_first: int, offsets: list[int | None]
    ) -> int | None:
        """Rewrite the ids of the finished shard (`renumber_shard`); return its new size."""
        return renumber_shard(base, old_first, new_first, [int(o or 0) for o in offsets])

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Return the RecordIO layout that wrote the shard."""
        return recordio_layout()

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.rec_path, self.idx_path = self.paths(base)
        self._rec = open(self.rec_path, "xb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._idx = open(self.idx_path, "x", encoding="ascii", newline="\n")  # noqa: SIM115
        self._records = RecordFileWriter(self._rec)

    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Append the record with its header id and label; return its (key, offset)."""
        payload = pack_labelled_image(record.data, record.label, id=sample_id)
        if len(payload) > MAX_PAYLOAD:
            raise RecordTooLargeForShardError(record.rel, self.rec_path, len(payload))
        try:
            offset = self._records.write(payload)
        except RecordTooLargeError as exc:  # pragma: no cover - the check above comes first
            raise RecordTooLargeForShardError(record.rel, self.rec_path, exc.size) from exc
        self._idx.write(format_idx_line(sample_id, offset))
        return str(sample_id), offset

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


def renumber_shard(base: Path, old_first: int, new_first: int, offsets: list[int]) -> int:
    """Give the records of a finished shard the ids ``new_first, new_first + 1, ...``.

    Used when a shard was written before the final first id was known (the Ray engine):
    each record's ``IRHeader.id`` is rewritten in place and the ``.idx`` written anew
    (``readers.formats.recordio.rewrite_ids``).
    """
    rec_path = base.with_name(base.name + REC_SUFFIX)
    idx_path = base.with_name(base.name + IDX_SUFFIX)
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
