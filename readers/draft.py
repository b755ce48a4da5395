"""``draft=``: the DCT scale a JPEG is decoded at, chosen from the index's width and height.

libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 of its size for a fraction of the work of a full
decode (OpenCV's ``IMREAD_REDUCED_*``); the image it gives at scale ``s`` is
``ceil(H / s) x ceil(W / s)`` (checked on every size up to 39 x 33 in the tests). `draft_scale`
picks the largest ``s`` that keeps the image at least as large as asked, as PIL's
``Image.draft`` does:

- ``draft=S``: the shorter side stays >= S;
- ``draft=(H, W)``: the height stays >= H and the width >= W.

The size asked for is of the image as returned, after the EXIF orientation that ``rgb``,
``bgr`` and ``gray`` apply (orientations 5-8 swap height and width). The index holds the stored
size; the orientation is not in the index, so where it matters (a ``(H, W)`` request with
H != W, a crop planned before decoding) it is read from the JPEG's APP1 segment by
`jpeg_orientation`, a walk over the few segment headers before the frame (microseconds, no
decode). ``unchanged`` returns the stored grid and needs no orientation. Which records are
JPEGs comes from the index's ``format`` column (`DraftSizes`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DRAFT_SCALES = (8, 4, 2)
"""The reductions libjpeg offers below full size, largest first."""

Draft = int | tuple[int, int]
"""A draft request: the shorter side (int) or ``(height, width)``."""

ORIENTED_MODES = frozenset({"rgb", "bgr", "gray"})
"""Decode modes that apply the EXIF orientation (as ``cv2.imread`` does)."""

_ORIENTATION_TAG = 0x0112
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD})
_SOF_MARKERS |= {0xCE, 0xCF, 0xDA}  # ... and SOS: EXIF comes before the frame
_HEAD_LIMIT = 1 << 17  # APP segments are at most 64 KiB each; EXIF is APP1, near the start


def check_draft(draft: Any) -> Draft | None:
    """`draft` as a `Draft` (or None), checked.

    Raises:
        ValueError: not None, a positive int, or a pair of positive ints.
    """
    if draft is None:
        return None
    if isinstance(draft, int | np.integer) and not isinstance(draft, bool) and draft > 0:
        return int(draft)
    if isinstance(draft, Sequence) and not isinstance(draft, str) and len(draft) == 2:
        h, w = draft
        ints = all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in (h, w))
        if ints and h > 0 and w > 0:
            return int(h), int(w)
    raise ValueError(
        f"draft={draft!r}: expected None, the shorter side as a positive int (draft=256), "
        "or (height, width) as two positive ints"
    )


def scaled_size(height: int, width: int, scale: int) -> tuple[int, int]:
    """Return ``(height, width)`` of an image decoded at ``1/scale`` by libjpeg.

    ``(height, width)`` of an image of `height` x `width` decoded at ``1/scale`` by
    libjpeg: ``ceil(height / scale), ceil(width / scale)``.
    """
    return -(-height // scale), -(-width // scale)


def draft_scale(height: int, width: int, draft: Draft | None) -> int:
    """Return the largest JPEG reduction that keeps the image at least `draft`.

    The largest reduction (8, 4, 2) at which an image of `height` x `width` (as returned)
    stays at least `draft`; 1 (full size) when none does or `draft` is None.

    Example: a 1200 x 1900 image with ``draft=256`` gives 4 (300 x 475); with
    ``draft=(512, 512)`` 2 (600 x 950).
    """
    if draft is None:
        return 1
    for scale in DRAFT_SCALES:
        h, w = scaled_size(height, width, scale)
        if isinstance(draft, int):
            if min(h, w) >= draft:
                return scale
        elif h >= draft[0] and w >= draft[1]:
            return scale
    return 1


def crop_scale(box_height: int, box_width: int, out_height: int, out_width: int) -> int:
    """Return the largest JPEG reduction at which a crop keeps the output size.

    The largest reduction (8, 4, 2) at which a crop of `box_height` x `box_width` pixels
    of the full image still has at least `out_height` x `out_width` pixels; else 1.
    """
    for scale in DRAFT_SCALES:
        if box_height >= scale * out_height and box_width >= scale * out_width:
            return scale
    return 1


def _tiff_orientation(blob: bytes) -> int:
    """The Orientation tag of IFD0 of a TIFF-structured EXIF block; 1 when absent."""
    order = blob[:2]
    if order not in (b"II", b"MM"):
        return 1
    end = "<" if order == b"II" else ">"
    (ifd,) = struct.unpack_from(end + "I", blob, 4)
    (count,) = struct.unpack_from(end + "H", blob, ifd)
    for n in range(count):
        tag, kind, _, value = struct.unpack_from(end + "HHI4s", blob, ifd + 2 + 12 * n)
        if tag == _ORIENTATION_TAG:
            if kind == 3:  # SHORT: the first two bytes of the value field
                (found,) = struct.unpack_from(end + "H", value)
            elif kind == 4:  # LONG
                (found,) = struct.unpack_from(end + "I", value)
            else:
                return 1
            return int(found) if 1 <= found <= 8 else 1
    return 1


def jpeg_orientation(data: bytes | memoryview | np.ndarray) -> int:
    """Return the EXIF orientation (1-8) of JPEG bytes.

    The EXIF orientation (1-8) of JPEG bytes: 1 when the bytes have none or it cannot be
    read (then a decode would not apply one either).

    Only the segment headers before the frame are read, not the image data.
    """
    head = bytes(np.frombuffer(data, dtype=np.uint8)[:_HEAD_LIMIT])
    pos = 2
    try:
        while pos + 4 <= len(head) and head[pos] == 0xFF:
            marker = head[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in _SOF_MARKERS:
                return 1
            (length,) = struct.unpack_from(">H", head, pos + 2)
            if marker == 0xE1 and head[pos + 4 : pos + 10] == b"Exif\x00\x00":
                return _tiff_orientation(head[pos + 10 : pos + 2 + length])
            pos += 2 + length
    except struct.error:
        return 1
    return 1


def returned_size(
    data: bytes | memoryview | np.ndarray, height: int, width: int, mode: str
) -> tuple[int, int]:
    """Return ``(height, width)`` of a JPEG as `mode` returns it.

    ``(height, width)`` of a JPEG of stored size `height` x `width` as `mode` returns it:
    swapped for EXIF orientations 5-8 in the modes that apply the orientation.
    """
    if mode in ORIENTED_MODES and jpeg_orientation(data) >= 5:
        return width, height
    return height, width


def choose_scale(
    data: bytes | memoryview | np.ndarray, height: int, width: int, mode: str, draft: Draft
) -> int:
    """Return `draft_scale` for a JPEG of stored size `height` x `width`.

    `draft_scale` for a JPEG of stored size `height` x `width` decoded as `mode`; its
    orientation is read only where it can change the answer (a ``(H, W)`` request, H != W).
    """
    if isinstance(draft, tuple) and draft[0] != draft[1]:
        height, width = returned_size(data, height, width, mode)
    return draft_scale(height, width, draft)


@dataclass(frozen=True)
class DraftSizes:
    """Per sample, from the index: whether it is a JPEG, and its stored size.

    Per sample, from the index: whether its record is a JPEG, and its stored height and
    width (what `draft_scale` and planned crops need; 5 bytes per sample).
    """

    jpeg: np.ndarray  # bool
    height: np.ndarray  # uint16 (int32 for images over 65535 pixels a side)
    width: np.ndarray

    @classmethod
    def from_columns(cls, fmt: Any, height: np.ndarray, width: np.ndarray) -> DraftSizes:
        """Build the table from the index's ``format``, ``height`` and ``width``.

        From the index's ``format`` (an Arrow string array or a sequence of str) and
        ``height``/``width`` columns (-1 or 0 where unknown).
        """
        if hasattr(fmt, "to_numpy"):
            import pyarrow.compute as pc

            jpeg = np.asarray(pc.fill_null(pc.equal(fmt, "jpeg"), False), dtype=np.bool_)
        else:
            jpeg = np.asarray([f == "jpeg" for f in fmt], dtype=np.bool_)
        h = np.asarray(height, dtype=np.int64)
        w = np.asarray(width, dtype=np.int64)
        jpeg &= (h > 0) & (w > 0)
        h, w = np.maximum(h, 0), np.maximum(w, 0)
        small = max(int(h.max(initial=0)), int(w.max(initial=0))) < 1 << 16
        dtype = np.uint16 if small else np.int32
        return cls(jpeg=jpeg, height=h.astype(dtype), width=w.astype(dtype))

    def of(self, i: int) -> tuple[int, int] | None:
        """``(height, width)`` stored of sample `i` when it is a JPEG of known size, else None."""
        if not self.jpeg[i]:
            return None
        return int(self.height[i]), int(self.width[i])
