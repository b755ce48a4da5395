"""Read one source image, prove it decodable, and describe the bytes to store.

Policies for inputs that are images but unusual (each tested in tests/packer/test_bad_inputs.py):

- The stored bytes are the original bytes (``--encode keep``, the default); the index gives
  ``width``, ``height`` and ``channels`` as OpenCV decodes the stored bytes with
  ``IMREAD_UNCHANGED``, which is what readers return with ``decode="unchanged"``, and the
  same with and without ``--decode-check`` (the header probe maps to OpenCV's answer):
  16-bit PNG: the stored channels (readers' ``rgb``/``bgr``/``gray`` give uint8, ``unchanged``
  gives uint16); palette PNG: 3, or 4 with a ``tRNS`` transparency chunk (as RGB PNG with
  ``tRNS``); gray+alpha PNG: 4 (OpenCV expands it to BGRA); grayscale JPEG: 1; CMYK and YCCK
  JPEG: 3 (OpenCV converts them to BGR).
- EXIF orientation (JPEG, PNG ``eXIf``, WebP ``EXIF``): with ``keep`` the bytes, and so the tag,
  are stored unchanged and width/height are those of the stored pixel grid; readers decode with
  OpenCV's ``IMREAD_COLOR``/``IMREAD_GRAYSCALE``, which apply the orientation as ``cv2.imread``
  does, so ``ds[i]`` equals what a loader of the loose file returns, and for orientations 5-8
  its shape is the index's height and width swapped (``decode="unchanged"`` and ``"bytes"``
  give the stored grid). Each such image gets an ``exif_orientation`` note. When the image is
  resized or re-encoded (which drops the tag), the orientation is applied first, so the stored
  pixels are upright and the index gives their size.
- Content that is another image format than its extension says (a PNG named ``.jpg``): packed
  by its sniffed format (the index's ``format``), with an ``extension_mismatch`` note.
- Decompression bombs: width x height is read from the header (JPEG SOF, PNG IHDR, BMP, WebP,
  TIFF, PNM) before anything is decoded; above ``Transform.max_pixels`` (``--max-pixels``) the
  image is refused as ``too_many_pixels``. A header we cannot parse leaves the limit to
  OpenCV's own (``OPENCV_IO_MAX_IMAGE_PIXELS``, 2**30 by default): such an image is
  ``undecodable``.
- A file is packed as it is when it is read: one that changed between the scan and the read
  is packed in its new, whole state; one that changes *while* it is read (its size, mtime or
  ctime differ before and after, or fewer bytes came than it holds) is ``changed``; one that
  vanished is ``unreadable`` ("vanished after the scan"); one replaced by a FIFO or device is
  ``not_regular`` and never blocks the build (it is opened with ``O_NONBLOCK``).
"""

from __future__ import annotations

import os
import stat
import zlib
from typing import Any

import numpy as np

from packer import problems as P
from packer.probe import (
    exif_orientation,
    image_size,
    is_truncated,
    probe_header,
)
from packer.problems import Note, Problem
from packer.records import Record
from packer.transform import (
    DEFAULT_MAX_PIXELS,
    Transform,
    apply_orientation,
    apply_transform,
    parse_resize,
)
from readers.formats.images import SNIFF_BYTES, sniff_format

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "Record",
    "Transform",
    "apply_orientation",
    "exif_orientation",
    "image_size",
    "parse_resize",
    "prepare",
    "probe_header",
    "read_source",
]

# The format each image extension names; a file whose content is another format gets a note.
EXTENSION_FORMATS = {
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".jpe": "jpeg",
    ".png": "png",
    ".bmp": "bmp",
    ".dib": "bmp",
    ".webp": "webp",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".pbm": "pnm",
    ".pgm": "pnm",
    ".ppm": "pnm",
}

# Formats whose EXIF orientation OpenCV applies with IMREAD_COLOR but not IMREAD_UNCHANGED.
_ORIENTED_FORMATS = ("jpeg", "png", "webp")


def __getattr__(name: str) -> Any:
    """``packer.encode.cv2``: OpenCV, imported when first asked for (see `_decode_unchanged`)."""
    if name == "cv2":
        import cv2

        return cv2
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _read_all(fd: int, size: int) -> bytes:
    """The bytes of `fd`, whose fstat gave `size`: one read when that many come.

    A read that returns exactly `size` bytes (of ``size + 1`` asked for) is not followed by
    one that would return none: bytes added after it change the size, mtime and ctime that
    `read_source` compares after reading, so such a file is ``changed`` either way.
    """
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    chunks = [data]
    while chunks[-1]:
        chunks.append(os.read(fd, max(size + 1, 1 << 16)))
    return b"".join(chunks)


def _state(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def read_source(path: str, rel: str) -> bytes | Problem:
    """The bytes of one file, or the problem that prevents reading it.

    The file is opened without blocking (a FIFO swapped in after the scan cannot hang the
    build) and must still be a regular file; its size, mtime and ctime are compared before
    and after the read, so a file written to while we read it is reported (``changed``)
    instead of packed torn.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return Problem(rel, P.UNREADABLE, "vanished after the scan")
    except OSError as exc:
        return Problem(rel, P.UNREADABLE, f"cannot open ({exc.strerror or exc})")
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return Problem(rel, P.NOT_REGULAR, "no longer a regular file (replaced after the scan)")
        data = _read_all(fd, before.st_size)
        after = os.fstat(fd)
    except OSError as exc:
        return Problem(rel, P.UNREADABLE, f"cannot read ({exc.strerror or exc})")
    finally:
        os.close(fd)
    if _state(before) != _state(after) or len(data) != after.st_size:
        return Problem(
            rel,
            P.CHANGED,
            f"changed while being read ({before.st_size} bytes at open, {len(data)} read, "
            f"{after.st_size} after); not packed torn",
        )
    if not data:
        return Problem(rel, P.EMPTY, "a zero-byte file")
    return data


def _decode_unchanged(data: bytes) -> np.ndarray | None:
    import cv2  # imported where images are decoded: a build's main process may never need it

    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:  # OpenCV raises for some malformed headers instead of returning None
        return None


def _notes(rel: str, fmt: str, orientation: int | None, *, transformed: bool) -> tuple[Note, ...]:
    notes = []
    named = EXTENSION_FORMATS.get(os.path.splitext(rel)[1].lower())
    if named is not None and named != fmt:
        notes.append(
            Note(
                rel,
                P.EXTENSION_MISMATCH,
                f"the name says {named.upper()} but the content is {fmt.upper()}; packed as "
                f"{fmt.upper()} (the index's format)",
            )
        )
    if orientation is not None and orientation != 1:
        if transformed:
            message = (
                f"EXIF orientation {orientation} applied at pack time: the stored pixels are "
                "upright and the index gives their size"
            )
        else:
            swapped = " (height and width swapped)" if orientation >= 5 else ""
            message = (
                f"EXIF orientation {orientation} kept in the stored bytes: the index gives the "
                f"stored width and height; readers decoding rgb/bgr/gray apply the orientation "
                f"as cv2.imread does{swapped}"
            )
        notes.append(Note(rel, P.EXIF_ORIENTATION, message))
    return tuple(notes)


_KEEP = Transform()


def prepare(
    rel: str,
    path: str,
    label: Any,
    *,
    decode_check: bool = True,
    transform: Transform | None = None,
) -> Record | Problem:
    """Read `path`, check it is an image we can store, and describe it.

    Without a transform the stored bytes are the original bytes.  With `decode_check` the
    image is decoded once (as stored, without applying EXIF orientation) to prove it
    decodable and to measure it; without, JPEG and PNG are measured from their headers only.
    A transform always decodes, then resizes and re-encodes as asked.  Either way an image
    whose header gives more than ``transform.max_pixels`` pixels is refused undecoded; the
    policies for unusual images are in this module's docstring.
    """
    data = read_source(path, rel)
    if isinstance(data, Problem):
        return data
    fmt = sniff_format(data[:SNIFF_BYTES])
    if fmt is None:
        return Problem(rel, P.NOT_IMAGE, "not an image (content matches no known image format)")
    if is_truncated(data, fmt):
        return Problem(rel, P.TRUNCATED, f"a {fmt.upper()} file cut short (no end marker)")
    t = transform or _KEEP
    size = image_size(data, fmt)
    if size is not None:
        width, height = size
        if width == 0 or height == 0:
            return Problem(rel, P.UNDECODABLE, f"the {fmt.upper()} header gives {width}x{height}")
        if t.max_pixels is not None and width * height > t.max_pixels:
            return Problem(
                rel,
                P.TOO_MANY_PIXELS,
                f"the {fmt.upper()} header gives {width}x{height} = {width * height} pixels, "
                f"above --max-pixels {t.max_pixels}; refused without decoding",
            )
    # OpenCV's IMREAD_UNCHANGED ignores the orientation of these formats (and applies TIFF's)
    orientation = exif_orientation(data, fmt) if fmt in _ORIENTED_FORMATS else None
    notes = _notes(rel, fmt, orientation, transformed=not t.identity)
    if not t.identity:
        image = _decode_unchanged(data)
        if image is None:
            return Problem(rel, P.UNDECODABLE, f"looks like {fmt.upper()} but does not decode")
        if orientation is not None:  # re-encoding drops the tag: store the pixels upright
            image = apply_orientation(image, orientation)
        stored, stored_fmt, pixels = apply_transform(image, fmt, t)
        channels = 1 if pixels.ndim == 2 else int(pixels.shape[2])
        return Record(
            rel,
            label,
            stored,
            stored_fmt,
            int(pixels.shape[1]),
            int(pixels.shape[0]),
            channels,
            zlib.crc32(stored),
            notes,
        )
    dims = None if decode_check else probe_header(data, fmt)
    if dims is None:
        image = _decode_unchanged(data)
        if image is None:
            return Problem(rel, P.UNDECODABLE, f"looks like {fmt.upper()} but does not decode")
        channels = 1 if image.ndim == 2 else int(image.shape[2])
        dims = (int(image.shape[1]), int(image.shape[0]), channels)
    width, height, channels = dims
    return Record(rel, label, data, fmt, width, height, channels, zlib.crc32(data), notes)
