"""MXNet image-record payloads, and peeking at a record's header without copying its image.

A payload is the ``IRHeader`` (``<IfQQ``: flag, label, id, id2), then ``flag`` float32 labels
when ``flag > 0``, then the encoded image.
"""

from __future__ import annotations

import numbers
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from readers.formats.recordio.records import (
    MAGIC,
    Buffer,
    RecordIOFormatError,
    decode_lrec,
    read_record_at,
)

IR_FIELDS = (("flag", "I"), ("label", "f"), ("id", "Q"), ("id2", "Q"))
"""MXNet ``IRHeader``'s fields in order, with their struct codes (little-endian, packed)."""
IR_HEADER = struct.Struct("<" + "".join(code for _, code in IR_FIELDS))
"""MXNet ``IRHeader``: flag (uint32), label (float32), id (uint64), id2 (uint64); 24 bytes."""


def ir_field(name: str) -> tuple[int, struct.Struct]:
    """Return where field `name` of the ``IRHeader`` lies in it, and its struct.

    For example ``id``: 8, ``<Q``.
    """
    codes = [code for field, code in IR_FIELDS]
    at = [field for field, _ in IR_FIELDS].index(name)
    return struct.calcsize("<" + "".join(codes[:at])), struct.Struct("<" + codes[at])


_F32_MAX = float(np.finfo(np.float32).max)
_MAX_U32 = (1 << 32) - 1
_MAX_U64 = (1 << 64) - 1
_REC_HEAD = struct.Struct("<II")


class IRHeader(NamedTuple):
    """MXNet's image-record header, as stored (``label`` is 0.0 when ``flag > 0``)."""

    flag: int
    label: float
    id: int
    id2: int


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


def image_record_size(image_bytes: int, label: Any) -> int:
    """Return the size of the MXNet image-record payload of an image of `image_bytes` bytes.

    The image's index label is `label` (see `header_label`).
    """
    stored = header_label(label)
    extra = 4 * len(stored) if isinstance(stored, list) else 0
    return IR_HEADER.size + extra + image_bytes


def image_record_bound(image_bytes: int, label: Any) -> int:
    """Return an upper bound of `image_record_size`, found without converting the label.

    A list label may add 4 bytes per item.
    """
    extra = 4 * len(label) if isinstance(label, list) else 0
    return IR_HEADER.size + extra + image_bytes


def pack_labelled_image(image: Buffer, label: Any, *, id: int) -> bytes:
    """Return the MXNet image-record payload of `image` whose index label is `label`.

    The header label is computed once, here (see `header_label`).
    """
    return pack_image_record(image, label=header_label(label), id=id)


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


def header_at(buf: Buffer, offset: int) -> tuple[IRHeader, Any, int]:
    """Return ``(header, label, image length)`` of the image record at `offset`.

    Only the header of a one-part record (the common case) is read, and the whole record
    otherwise.

    Raises:
        RecordIOFormatError: the bytes at `offset` are not an image record.
    """
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


def cut_short(buf: Buffer, offset: int) -> str | None:
    """Say how the one-part record at `offset` runs past the end of `buf`, or None.

    None when it does not (a record that is damaged in another way is left to the read that
    meets it).
    """
    size = len(buf)
    if offset + _REC_HEAD.size > size:
        return f"needs {_REC_HEAD.size} header bytes but the file ends at byte {size}"
    magic, lrec = _REC_HEAD.unpack_from(buf, offset)
    cflag, length = decode_lrec(lrec)
    end = offset + _REC_HEAD.size + length
    if magic == MAGIC and cflag == 0 and end > size:
        return f"is {length} bytes long and would end at byte {end}, past the end ({size} bytes)"
    return None
