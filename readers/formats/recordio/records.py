"""dmlc RecordIO record framing: magic, ``lrec`` word, multi-part records, padding.

A ``.rec`` file is a sequence of records; each record is one or more *parts*::

    uint32 LE  MAGIC (0xced7230a)
    uint32 LE  lrec = cflag << 29 | length      (length: low 29 bits)
    length     bytes of part data
    0..3       zero bytes that pad the part to a multiple of 4

dmlc's writer splits a payload wherever the magic occurs at a 4-byte-aligned offset of the
payload, drops those 4 bytes and flags the parts 1 (first), 2 (middle) and 3 (last); a payload
without such an occurrence is one part with cflag 0. Readers put the magic back between parts.
This keeps every aligned magic word in a file the start of a part, which is what lets dmlc split
a ``.rec`` at arbitrary byte ranges.

Parsing works on ``bytes``, ``mmap`` or ``memoryview`` without copying more than the payload
asked for.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from typing import IO

import numpy as np
import numpy.typing as npt

MAGIC = 0xCED7230A
"""dmlc ``RecordIOWriter::kMagic``; its top 3 bits are 6, so no valid ``lrec`` equals it."""
MAGIC_BYTES = struct.pack("<I", MAGIC)  # b"\x0a\x23\xd7\xce"
_HEAD = struct.Struct("<II")  # magic, lrec
RECORD_HEAD = _HEAD
"""The head of every part: the magic and the ``lrec`` word, little-endian uint32 each."""
HEAD_SIZE = _HEAD.size
_LENGTH_BITS = 29
MAX_PART = (1 << _LENGTH_BITS) - 1
"""Largest part length the 29-bit length field can hold."""
MAX_PAYLOAD = MAX_PART
"""Largest payload ``encode_record`` accepts: dmlc's writer checks ``size < 2**29`` on the
whole payload before splitting it, so we refuse exactly what dmlc refuses."""
_CFLAG_NAMES = {0: "whole record", 1: "first part", 2: "middle part", 3: "last part"}

Buffer = bytes | bytearray | memoryview | mmap.mmap
"""What the functions here read from."""


class RecordIOError(ValueError):
    """Base class of the errors this module raises."""


class RecordIOFormatError(RecordIOError):
    """Bytes that are not valid RecordIO.

    The message names the offset, what was found and what was expected.
    """


class RecordTooLargeError(RecordIOError):
    """A payload too large for one RecordIO record."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"payload of {size} bytes is too large for a RecordIO record: dmlc/MXNet RecordIO "
            f"stores at most {limit} bytes (2**29 - 1) per record; store a smaller or "
            "re-encoded image (e.g. --encode jpeg or --resize)"
        )
        self.size = size
        self.limit = limit


def encode_lrec(cflag: int, length: int) -> int:
    """Return the ``lrec`` word for a part: ``cflag << 29 | length``.

    Raises:
        ValueError: ``cflag`` is not 0..3 or ``length`` does not fit in 29 bits.
    """
    if not 0 <= cflag <= 3:
        raise ValueError(f"cflag must be 0..3, got {cflag}")
    if length < 0:
        raise ValueError(f"part length must be >= 0, got {length}")
    if length > MAX_PART:
        raise RecordTooLargeError(length, MAX_PART)
    return (cflag << _LENGTH_BITS) | length


def decode_lrec(lrec: int) -> tuple[int, int]:
    """Split an ``lrec`` word into ``(cflag, length)``."""
    return (lrec >> _LENGTH_BITS) & 7, lrec & MAX_PART


def check_payload_size(size: int) -> None:
    """Raise ``RecordTooLargeError`` when a payload of ``size`` bytes cannot be one record."""
    if size > MAX_PAYLOAD:
        raise RecordTooLargeError(size, MAX_PAYLOAD)


def _split_points(data: bytes | bytearray) -> list[int]:
    """Offsets of the magic at 4-byte-aligned positions of ``data``, in order."""
    points: list[int] = []
    pos = data.find(MAGIC_BYTES)
    while pos != -1:
        if pos % 4 == 0:
            points.append(pos)
            pos = data.find(MAGIC_BYTES, pos + 4)
        else:
            pos = data.find(MAGIC_BYTES, pos + 1)
    return points


def encode_record(payload: Buffer) -> bytes:
    """Return the on-disk bytes of one logical record, exactly as dmlc's writer lays them out.

    The payload is split at every 4-byte-aligned occurrence of the magic (those 4 bytes are
    dropped); a magic at offset 0 gives an empty first part, one in the last aligned word an
    empty last part, two adjacent ones an empty middle part. The record ends with zero padding
    to a multiple of 4 bytes.

    Raises:
        RecordTooLargeError: the payload has ``MAX_PAYLOAD + 1`` bytes or more.
    """
    data = payload if isinstance(payload, bytes | bytearray) else bytes(payload)
    size = len(data)
    check_payload_size(size)
    view = memoryview(data)
    chunks: list[bytes | memoryview] = []
    start = 0
    for point in _split_points(data):
        chunks.append(_HEAD.pack(MAGIC, encode_lrec(1 if start == 0 else 2, point - start)))
        chunks.append(view[start:point])
        start = point + 4
    chunks.append(_HEAD.pack(MAGIC, encode_lrec(3 if start else 0, size - start)))
    chunks.append(view[start:])
    chunks.append(b"\0" * (-size % 4))
    return b"".join(chunks)


def _parse_record(buf: Buffer, offset: int, *, strict: bool) -> tuple[list[tuple[int, int]], int]:
    """Return the ``(start, end)`` spans of a record's part data and the next record's offset."""
    total = len(buf)
    if offset < 0:
        raise RecordIOFormatError(f"RecordIO record offset must be >= 0, got {offset}")
    if strict and offset % 4:
        raise RecordIOFormatError(
            f"record offset {offset} is not a multiple of 4; dmlc writes records 4-byte aligned"
        )
    spans: list[tuple[int, int]] = []
    pos = offset
    while True:
        if pos + HEAD_SIZE > total:
            where = "record" if pos == offset else f"part {len(spans)} of the record at {offset}"
            raise RecordIOFormatError(
                f"truncated RecordIO {where}: needs an 8-byte header at offset {pos}, "
                f"but the data is {total} bytes long"
            )
        magic, lrec = _HEAD.unpack_from(buf, pos)
        if magic != MAGIC:
            raise RecordIOFormatError(
                f"bad RecordIO magic at offset {pos}: found 0x{magic:08x}, expected "
                f"0x{MAGIC:08x}"
                + ("" if pos == offset else f" (record starts at {offset})")
                + "; the offset does not point at a record or the file is corrupt"
            )
        cflag, length = decode_lrec(lrec)
        if not spans and cflag not in (0, 1):
            raise RecordIOFormatError(
                f"RecordIO record at offset {offset} starts with cflag {cflag} "
                f"({_CFLAG_NAMES.get(cflag, 'invalid')}), expected 0 (whole record) or "
                "1 (first part); the offset points into the middle of a record"
            )
        if spans and cflag not in (2, 3):
            raise RecordIOFormatError(
                f"RecordIO part at offset {pos} of the record at {offset} has cflag {cflag} "
                f"({_CFLAG_NAMES.get(cflag, 'invalid')}), expected 2 (middle part) or "
                "3 (last part)"
            )
        start = pos + HEAD_SIZE
        end = start + length
        padded = start + ((length + 3) & ~3)
        if padded > total:
            raise RecordIOFormatError(
                f"truncated RecordIO record at offset {offset}: the part at {pos} declares "
                f"{length} bytes (+{padded - end} padding) but only {total - start} bytes follow"
            )
        if strict:
            _check_part_strict(buf, offset, pos, start, end, padded)
        spans.append((start, end))
        pos = padded
        if cflag in (0, 3):
            return spans, pos


def _check_part_strict(
    buf: Buffer, offset: int, pos: int, start: int, end: int, padded: int
) -> None:
    if any(bytes(buf[end:padded])):
        raise RecordIOFormatError(
            f"RecordIO record at offset {offset}: nonzero padding after the part at {pos} "
            f"(bytes {end}..{padded} = {bytes(buf[end:padded]).hex()}), expected zeros"
        )
    points = _split_points(bytes(buf[start:end]))
    if points:
        raise RecordIOFormatError(
            f"RecordIO record at offset {offset}: the part at {pos} contains the magic at "
            f"aligned offset {start + points[0]}; a conforming writer would have split it "
            "there, and readers that split files on magic words will misread it"
        )


def read_record_at(buf: Buffer, offset: int, *, strict: bool = False) -> tuple[bytes, int]:
    """Parse the (possibly multi-part) record that starts at ``offset``.

    Args:
        buf: the whole ``.rec`` contents (``bytes``, ``mmap`` or ``memoryview``).
        offset: byte offset of the record's first magic, as stored in ``.idx``.
        strict: also report what dmlc readers tolerate but a conforming writer never produces:
            nonzero padding, an unaligned record offset, an aligned magic inside a part.

    Returns:
        ``(payload, next_offset)``: the payload with the magic restored between parts, and the
        offset just past the record's padding.

    Raises:
        RecordIOFormatError: bad magic, truncated header or data, a bad cflag sequence, or (when
            ``strict``) one of the anomalies above.
    """
    with memoryview(buf).cast("B") as view:
        spans, next_offset = _parse_record(view, offset, strict=strict)
        if len(spans) == 1:
            ((start, end),) = spans
            return bytes(view[start:end]), next_offset
        return MAGIC_BYTES.join(view[start:end] for start, end in spans), next_offset


def view_record_at(buf: bytes, offset: int) -> tuple[memoryview | bytes, int]:
    """`read_record_at` without the copy: a record in one part is a ``memoryview`` of `buf`.

    For a `buf` that is immutable (``bytes``) and that views may outlive, such as a ranged
    read's body; a record in several parts is joined (a copy) as by `read_record_at`.

    Raises:
        RecordIOFormatError: as `read_record_at`.
    """
    view = memoryview(buf).cast("B")
    spans, next_offset = _parse_record(view, offset, strict=False)
    if len(spans) == 1:
        ((start, end),) = spans
        return view[start:end], next_offset
    return MAGIC_BYTES.join(view[start:end] for start, end in spans), next_offset


def iter_records(buf: Buffer, *, strict: bool = False) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, payload)`` for every record of a whole ``.rec`` buffer, in file order.

    Raises:
        RecordIOFormatError: as ``read_record_at``, at the first bad record.
    """
    total = memoryview(buf).nbytes
    offset = 0
    while offset < total:
        payload, next_offset = read_record_at(buf, offset, strict=strict)
        yield offset, payload
        offset = next_offset


def scan_offsets(buf: Buffer, *, strict: bool = False) -> npt.NDArray[np.int64]:
    """Return the start offset of every record in a whole ``.rec`` buffer (int64).

    This is for files without a ``.idx``; payloads are not copied.

    Raises:
        RecordIOFormatError: as ``read_record_at``, at the first bad record.
    """
    offsets: list[int] = []
    with memoryview(buf).cast("B") as view:
        total = len(view)
        offset = 0
        while offset < total:
            offsets.append(offset)
            _, offset = _parse_record(view, offset, strict=strict)
    return np.asarray(offsets, dtype=np.int64)


class RecordFileWriter:
    """Append encoded records to a binary file object and remember where each one starts.

    The offset returned by ``write`` is the value for the record's ``.idx`` line; it counts from
    the file position at construction (``fileobj.tell()``), so appending to an existing file
    yields absolute offsets.
    """

    def __init__(self, fileobj: IO[bytes]) -> None:
        self._file = fileobj
        self._offset = fileobj.tell()

    @property
    def offset(self) -> int:
        """Where the next record will start."""
        return self._offset

    def write(self, payload: Buffer) -> int:
        """Write one record and return its start offset.

        Raises:
            RecordTooLargeError: the payload is larger than ``MAX_PAYLOAD``.
        """
        record = encode_record(payload)
        start = self._offset
        self._file.write(record)
        self._offset += len(record)
        return start

    def close(self) -> None:
        """Flush and close the underlying file."""
        self._file.close()

    def __enter__(self) -> RecordFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
