"""The MXNet/dmlc RecordIO byte layout (records, image payloads, ``.idx`` lines), defined once.

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

The image payload is MXNet's ``IRHeader`` (``<IfQQ``: flag, label, id, id2), then ``flag``
float32 labels when ``flag > 0``, then the encoded image. A ``.idx`` file has one
``key<TAB>offset`` line per record, offset being where the record's first magic starts.

This module imports no paddle and no packer; parsing works on ``bytes``, ``mmap`` or
``memoryview`` without copying more than the payload asked for.
"""

from __future__ import annotations

import mmap
import numbers
import os
import re
import struct
import warnings
from collections.abc import Iterator, Sequence
from typing import IO, Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "IR_HEADER",
    "MAGIC",
    "MAGIC_BYTES",
    "MAX_PART",
    "MAX_PAYLOAD",
    "IRHeader",
    "RecordFileWriter",
    "RecordIOError",
    "RecordIOFormatError",
    "RecordTooLargeError",
    "check_payload_size",
    "decode_lrec",
    "encode_lrec",
    "encode_record",
    "format_idx_line",
    "iter_records",
    "pack_image_record",
    "read_idx",
    "read_record_at",
    "scan_offsets",
    "unpack_image_record",
]

MAGIC = 0xCED7230A
"""dmlc ``RecordIOWriter::kMagic``; its top 3 bits are 6, so no valid ``lrec`` equals it."""
MAGIC_BYTES = struct.pack("<I", MAGIC)  # b"\x0a\x23\xd7\xce"
_HEAD = struct.Struct("<II")  # magic, lrec
HEAD_SIZE = _HEAD.size
IR_HEADER = struct.Struct("<IfQQ")
"""MXNet ``IRHeader``: flag (uint32), label (float32), id (uint64), id2 (uint64); 24 bytes."""
_LENGTH_BITS = 29
MAX_PART = (1 << _LENGTH_BITS) - 1
"""Largest part length the 29-bit length field can hold."""
MAX_PAYLOAD = MAX_PART
"""Largest payload ``encode_record`` accepts: dmlc's writer checks ``size < 2**29`` on the
whole payload before splitting it, so we refuse exactly what dmlc refuses."""
_MAX_U32 = (1 << 32) - 1
_MAX_U64 = (1 << 64) - 1
_CFLAG_NAMES = {0: "whole record", 1: "first part", 2: "middle part", 3: "last part"}

Buffer = bytes | bytearray | memoryview | mmap.mmap
"""What the functions here read from."""


class RecordIOError(ValueError):
    """Base class of the errors this module raises."""


class RecordIOFormatError(RecordIOError):
    """Bytes that are not valid RecordIO: the message names the offset, what was found and
    what was expected."""


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


class IRHeader(NamedTuple):
    """MXNet's image-record header, as stored (``label`` is 0.0 when ``flag > 0``)."""

    flag: int
    label: float
    id: int
    id2: int


# ---------------------------------------------------------------------------------------------
# Records


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
    """Return the start offset of every record in a whole ``.rec`` buffer (int64), for files
    without a ``.idx``; payloads are not copied.

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


# ---------------------------------------------------------------------------------------------
# Image payloads


def pack_image_record(
    image: Buffer,
    *,
    label: float | Sequence[float] | npt.NDArray[Any] | None,
    id: int,  # MXNet's field name, shadowing the builtin on purpose
    id2: int = 0,
) -> bytes:
    """Return an MXNet image-record payload, as ``mxnet.recordio.pack`` builds it.

    Args:
        image: the encoded image bytes.
        label: one number (stored in ``IRHeader.label``, flag 0); a sequence of numbers (flag =
            their count, header label 0.0, the float32 values after the header; an empty sequence
            gives flag 0); or ``None`` (flag 0, label 0.0).
        id: ``IRHeader.id``, uint64.
        id2: ``IRHeader.id2``, uint64 (MXNet keeps it 0).

    Raises:
        ValueError: a label that is not numeric or not 1-D, or an id outside uint64.
    """
    for name, value in (("id", id), ("id2", id2)):
        if not 0 <= value <= _MAX_U64:
            raise ValueError(f"IRHeader {name} must fit in uint64, got {value}")
    extra = b""
    if label is None:
        flag, scalar = 0, 0.0
    elif isinstance(label, numbers.Real):
        flag, scalar = 0, float(label)
    else:
        if isinstance(label, str | bytes):
            raise ValueError(f"an image-record label must be numeric, got {label!r}")
        try:
            values = np.asarray(label, dtype="<f4")
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"an image-record label must be a number or a sequence of numbers, got {label!r}"
            ) from exc
        if values.ndim != 1:
            raise ValueError(f"image-record labels must be 1-D, got shape {values.shape}")
        if values.size > _MAX_U32:
            raise ValueError(f"too many labels for IRHeader.flag: {values.size}")
        flag, scalar, extra = int(values.size), 0.0, values.tobytes()
    try:
        header = IR_HEADER.pack(flag, scalar, id, id2)
    except OverflowError as exc:
        raise ValueError(f"label {scalar!r} does not fit in a float32") from exc
    return b"".join((header, extra, image))


def unpack_image_record(
    payload: Buffer,
) -> tuple[IRHeader, float | npt.NDArray[np.float32], memoryview]:
    """Split an MXNet image-record payload, as ``mxnet.recordio.unpack`` does.

    Returns:
        ``(header, label, image)``: the header as stored; the label (``header.label`` as a float
        when ``flag == 0``, else a float32 array of the ``flag`` labels after the header); and a
        zero-copy view of the image bytes (it keeps ``payload`` exported: an ``mmap`` cannot
        close while the view is alive; take ``bytes(image)`` to keep a copy instead).

    Raises:
        RecordIOFormatError: the payload is shorter than its header and labels.
    """
    view = memoryview(payload).cast("B")
    if len(view) < IR_HEADER.size:
        raise RecordIOFormatError(
            f"image record of {len(view)} bytes is shorter than the {IR_HEADER.size}-byte IRHeader"
        )
    header = IRHeader(*IR_HEADER.unpack_from(view))
    body = IR_HEADER.size
    if header.flag == 0:
        return header, header.label, view[body:]
    need = 4 * header.flag
    if len(view) - body < need:
        raise RecordIOFormatError(
            f"image record IRHeader has flag={header.flag}, i.e. {header.flag} float32 labels "
            f"({need} bytes), but only {len(view) - body} bytes follow the header"
        )
    labels = np.frombuffer(view, dtype="<f4", count=header.flag, offset=body).astype(np.float32)
    return header, labels, view[body + need :]


# ---------------------------------------------------------------------------------------------
# .idx files

_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def format_idx_line(key: int, offset: int) -> str:
    """Return the ``.idx`` line for a record: ``"{key}\\t{offset}\\n"`` (as MXNet writes it)."""
    return f"{int(key)}\t{int(offset)}\n"


def read_idx(path: str | os.PathLike[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Load a ``.idx`` file into ``(keys, offsets)`` int64 arrays, in file order.

    Lines are ``key<TAB>offset`` with integer key and offset; blank lines (such as a trailing
    newline) are ignored. Duplicate keys are kept as they are; the caller decides.

    Raises:
        RecordIOFormatError: naming ``path:line`` of the first malformed line.
    """
    try:
        # numpy's C parser handles the common, well-formed case fast.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = np.loadtxt(
                path, dtype=np.int64, delimiter="\t", comments=None, ndmin=2, encoding="ascii"
            )
    except (ValueError, UnicodeError, UserWarning):
        table = None
    if table is not None and table.shape[1] == 2 and (table[:, 1] >= 0).all():
        return np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])
    # Anything unusual: parse line by line, to name the first bad line exactly.
    return _read_idx_slow(path)


def _read_idx_slow(
    path: str | os.PathLike[str],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    keys: list[int] = []
    offsets: list[int] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line:
                continue
            fields = [field.strip() for field in line.split(b"\t")]
            problem = ""
            if len(fields) != 2:
                problem = f"found {len(fields)} tab-separated fields"
            elif not all(_INT.fullmatch(field.decode("latin-1")) for field in fields):
                problem = "key and offset must be integers"
            else:
                key, offset = int(fields[0]), int(fields[1])
                if not _INT64_MIN <= key <= _INT64_MAX:
                    problem = "key does not fit in int64"
                elif not 0 <= offset <= _INT64_MAX:
                    problem = "offset must be a non-negative int64"
            if problem:
                raise RecordIOFormatError(
                    f"{os.fspath(path)}:{lineno}: malformed .idx line {raw!r}: {problem}; "
                    "expected 'key<TAB>offset'"
                )
            keys.append(key)
            offsets.append(offset)
    return np.asarray(keys, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
