"""Rewriting the sample ids of a finished RecordIO shard in place.

Each record's ``IRHeader.id`` is rewritten, and its ``.idx`` written anew.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from readers.formats.recordio.idx import format_idx_line
from readers.formats.recordio.images import ir_field
from readers.formats.recordio.records import MAGIC, RECORD_HEAD, RecordIOFormatError, decode_lrec

IR_ID_OFFSET, _IR_ID = ir_field("id")
"""Where ``IRHeader.id`` lies in an image record's payload, and its struct."""


def rewrite_ids(rec_path: Path, idx_path: Path, first: int, offsets: Sequence[int]) -> None:
    """Give the records at `offsets` of the ``.rec`` at `rec_path` new ids from `first` on.

    The ids are ``first, first + 1, ...``; the ``.idx`` at `idx_path` is written with those
    keys.

    The record framing does not change, since an id below the magic cannot contain the magic
    at an aligned offset of the payload; both files are fsynced.

    Raises:
        RecordIOFormatError: a record is not a one-part record at its offset (a multi-part
            record cannot take another id in place), or an id would reach the magic.
    """
    with open(rec_path, "r+b") as f:
        for j, offset in enumerate(offsets):
            f.seek(offset)
            magic, lrec = RECORD_HEAD.unpack(f.read(RECORD_HEAD.size))
            if magic != MAGIC or decode_lrec(lrec)[0] != 0 or first + j >= MAGIC:
                raise RecordIOFormatError(
                    f"{rec_path}: record at {offset} cannot be renumbered in place "
                    "(a multi-part record)"
                )
            f.seek(offset + RECORD_HEAD.size + IR_ID_OFFSET)
            f.write(_IR_ID.pack(first + j))
        f.flush()
        os.fsync(f.fileno())
    with open(idx_path, "w", encoding="ascii", newline="\n") as f:
        for j, offset in enumerate(offsets):
            f.write(format_idx_line(first + j, offset))
        f.flush()
        os.fsync(f.fileno())
