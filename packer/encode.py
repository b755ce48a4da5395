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
import re
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from packer import problems as P
from packer.problems import Note, Problem
from readers.formats.images import SNIFF_BYTES, sniff_format

_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
# PNG colour type -> channels OpenCV's IMREAD_UNCHANGED returns (gray+alpha is expanded to
# BGRA); with a tRNS chunk, RGB and palette images come back with alpha.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}
_PNG_TRNS_CHANNELS = {0: 1, 2: 4, 3: 4, 4: 4, 6: 4}
# JPEG components -> channels OpenCV returns (CMYK and YCCK are converted to BGR).
_JPEG_CHANNELS = {1: 1, 3: 3, 4: 3}

# PIL's decompression-bomb error threshold (2 x Image.MAX_IMAGE_PIXELS): ~13,400 x 13,400.
DEFAULT_MAX_PIXELS = 178_956_970

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
_EXIF_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class Record:
    """An image ready for a shard writer."""

    rel: str
    label: Any
    data: bytes
    format: str
    width: int
    height: int
    channels: int
    crc32: int
    notes: tuple[Note, ...] = ()  # packed with a caveat: one warnings.jsonl line each


def _jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    pos = 2
    n = len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if marker in _JPEG_SOF and pos + 10 <= n:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return width, height, data[pos + 9]
        pos += 2 + length
    return None


def _png_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """``(type, start, length)`` of every chunk header that lies inside `data`, in order."""
    chunks = []
    pos = 8
    n = len(data)
    while pos + 8 <= n:
        (length,) = struct.unpack_from(">I", data, pos)
        kind = data[pos + 4 : pos + 8]
        chunks.append((kind, pos + 8, length))
        if kind == b"IEND":
            break
        pos += 12 + length
    return chunks


def _png_header(data: bytes) -> tuple[int, int, int] | None:
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    color_type = data[25]
    if color_type not in _PNG_CHANNELS:
        return None
    kinds = {kind for kind, _, _ in _png_chunks(data)}
    table = _PNG_TRNS_CHANNELS if b"tRNS" in kinds else _PNG_CHANNELS
    return width, height, table[color_type]


def probe_header(data: bytes, fmt: str) -> tuple[int, int, int] | None:
    """Width, height and channels from the header alone (JPEG, PNG), or None.

    The channels are those OpenCV's ``IMREAD_UNCHANGED`` decode returns, so that a build
    with ``--no-decode-check`` writes the same index as one that decodes.
    """
    if fmt == "jpeg":
        found = _jpeg_header(data)
        if found is None or found[2] not in _JPEG_CHANNELS:
            return None
        return found[0], found[1], _JPEG_CHANNELS[found[2]]
    if fmt == "png":
        return _png_header(data)
    return None


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    (dib,) = struct.unpack_from("<I", data, 14)
    if dib == 12:  # BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack_from("<HH", data, 18)
        return width, height
    width, height = struct.unpack_from("<ii", data, 18)
    return abs(width), abs(height)  # a negative height means top-down rows


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    return None


def _tiff_ifd0(data: bytes) -> tuple[str, dict[int, int]] | None:
    """The byte order and the single-valued SHORT/LONG entries of a TIFF blob's first IFD."""
    if data[:4] == b"II*\x00":
        order = "<"
    elif data[:4] == b"MM\x00*":
        order = ">"
    else:
        return None
    if len(data) < 8:
        return None
    (ifd,) = struct.unpack_from(f"{order}I", data, 4)
    if ifd + 2 > len(data):
        return None
    (count,) = struct.unpack_from(f"{order}H", data, ifd)
    values: dict[int, int] = {}
    for n in range(count):
        at = ifd + 2 + 12 * n
        if at + 12 > len(data):
            break
        tag, kind, number = struct.unpack_from(f"{order}HHI", data, at)
        if number != 1:
            continue
        if kind == 3:  # SHORT
            values[tag] = struct.unpack_from(f"{order}H", data, at + 8)[0]
        elif kind == 4:  # LONG
            values[tag] = struct.unpack_from(f"{order}I", data, at + 8)[0]
    return order, values


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    found = _tiff_ifd0(data)
    if found is None or 256 not in found[1] or 257 not in found[1]:
        return None
    return found[1][256], found[1][257]


def _pnm_size(data: bytes) -> tuple[int, int] | None:
    tokens: list[bytes] = []
    for line in data[2:1024].splitlines():
        tokens += line.split(b"#", 1)[0].split()
        if len(tokens) >= 2:
            break
    if len(tokens) < 2 or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    return int(tokens[0]), int(tokens[1])


def image_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """Width and height from the header of any sniffed format, without decoding; None when
    the header does not give them (the decoder then applies its own limits)."""
    try:
        if fmt in ("jpeg", "png"):
            found = _jpeg_header(data) if fmt == "jpeg" else _png_header(data)
            return None if found is None else (found[0], found[1])
        if fmt == "bmp":
            return _bmp_size(data)
        if fmt == "webp":
            return _webp_size(data)
        if fmt == "tiff":
            return _tiff_size(data)
        if fmt == "pnm":
            return _pnm_size(data)
    except struct.error:
        return None
    return None


def _exif_blob(data: bytes, fmt: str) -> bytes | None:
    """The TIFF-structured EXIF block of a JPEG (APP1), PNG (eXIf) or WebP (EXIF chunk)."""
    if fmt == "jpeg":
        pos = 2
        while pos + 4 <= len(data) and data[pos] == 0xFF:
            marker = data[pos + 1]
            if marker == 0xFF:
                pos += 1
                continue
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                pos += 2
                continue
            if marker == 0xDA or marker in _JPEG_SOF:
                return None  # the EXIF segment comes before the frame
            (length,) = struct.unpack_from(">H", data, pos + 2)
            body = data[pos + 4 : pos + 2 + length]
            if marker == 0xE1 and body.startswith(b"Exif\x00\x00"):
                return body[6:]
            pos += 2 + length
        return None
    if fmt == "png":
        for kind, start, length in _png_chunks(data):
            if kind == b"eXIf":
                return data[start : start + length]
        return None
    if fmt == "webp":
        pos = 12
        while pos + 8 <= len(data):
            kind = data[pos : pos + 4]
            (length,) = struct.unpack_from("<I", data, pos + 4)
            if kind == b"EXIF":
                body = data[pos + 8 : pos + 8 + length]
                return body[6:] if body.startswith(b"Exif\x00\x00") else body
            pos += 8 + length + (length & 1)
        return None
    return None


def exif_orientation(data: bytes, fmt: str) -> int | None:
    """The EXIF orientation (1-8) of a JPEG, PNG or WebP, or None when it has none."""
    try:
        blob = _exif_blob(data, fmt)
        found = None if blob is None else _tiff_ifd0(blob)
    except struct.error:
        return None
    if found is None:
        return None
    value = found[1].get(_EXIF_ORIENTATION_TAG)
    return value if value is not None and 1 <= value <= 8 else None


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored pixel grid upright as its EXIF orientation says (as OpenCV does)."""
    if orientation == 2:
        return cv2.flip(image, 1)
    if orientation == 3:
        return cv2.rotate(image, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(image, 0)
    if orientation == 5:
        return cv2.transpose(image)
    if orientation == 6:
        return cv2.rotate(image, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.transpose(image), -1)
    if orientation == 8:
        return cv2.rotate(image, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return image


def is_truncated(data: bytes, fmt: str) -> bool:
    """Whether a JPEG lacks its end-of-image marker or a PNG its IEND chunk at the end.

    OpenCV decodes a cut JPEG into a grey-padded image without an error, so a decode alone
    does not prove the file whole.
    """
    if fmt == "jpeg":
        return not data.rstrip(b"\x00\r\n\t ").endswith(b"\xff\xd9")
    if fmt == "png":
        return b"IEND" not in data[-64:]
    return False


def _read_all(fd: int, size_hint: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, max(size_hint + 1, 1 << 16))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


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


ENCODINGS = ("keep", "jpeg", "png", "raw")
_SIZE_SPEC = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*$")


@dataclass(frozen=True)
class Transform:
    """What to do to each image at pack time.

    ``short``: scale so the shorter side is this many pixels; ``fit``: scale to fit within
    (width, height).  Neither ever upscales, and both keep the aspect ratio.  ``encode``:
    ``keep`` stores the original bytes (re-encoded in the same format only when resized),
    ``jpeg``/``png`` re-encode, ``raw`` stores decoded pixels (uint8, RGB/gray/RGBA order).
    ``max_pixels``: images whose header gives more pixels (width x height) are refused before
    they are decoded (``too_many_pixels``); None for no limit but OpenCV's own.
    """

    short: int | None = None
    fit: tuple[int, int] | None = None
    encode: str = "keep"
    quality: int = 95
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.encode not in ENCODINGS:
            raise ValueError(f"--encode {self.encode!r}: expected one of {', '.join(ENCODINGS)}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality}: expected 1..100")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"--max-pixels {self.max_pixels}: expected a positive count")

    @property
    def identity(self) -> bool:
        """Whether the stored bytes are the original bytes (``max_pixels`` only refuses)."""
        return self.short is None and self.fit is None and self.encode == "keep"

    def options(self) -> dict[str, Any]:
        resize = None
        if self.short is not None:
            resize = str(self.short)
        elif self.fit is not None:
            resize = f"{self.fit[0]}x{self.fit[1]}"
        return {
            "resize": resize,
            "encode": self.encode,
            "quality": self.quality,
            "max_pixels": self.max_pixels,
        }


def parse_resize(text: str | None) -> tuple[int | None, tuple[int, int] | None]:
    """``"256"`` -> shorter side 256; ``"640x480"`` -> fit within 640x480; None -> no resize."""
    if text is None or text == "":
        return None, None
    match = _SIZE_SPEC.match(text)
    if not match or int(match.group(1)) < 1 or (match.group(2) and int(match.group(2)) < 1):
        raise ValueError(
            f"--resize {text!r}: expected S (shorter side to S pixels) or WxH (fit within)"
        )
    if match.group(2):
        return None, (int(match.group(1)), int(match.group(2)))
    return int(match.group(1)), None


def _scaled_size(width: int, height: int, t: Transform) -> tuple[int, int] | None:
    """The new (width, height), or None when the image is already small enough."""
    if t.short is not None:
        scale = t.short / min(width, height)
    elif t.fit is not None:
        scale = min(t.fit[0] / width, t.fit[1] / height)
    else:
        return None
    if scale >= 1:
        return None
    return max(1, round(width * scale)), max(1, round(height * scale))


def _to_uint8(image: np.ndarray) -> np.ndarray:
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.uint16:
        return (image >> 8).astype(np.uint8)
    low, high = float(image.min()), float(image.max())  # float images: stretch to 0..255
    scaled = (image.astype(np.float64) - low) * (255.0 / (high - low or 1.0))
    return np.clip(scaled, 0, 255).astype(np.uint8)


def apply_transform(image: np.ndarray, fmt: str, t: Transform) -> tuple[bytes, str, np.ndarray]:
    """Resize and re-encode a decoded image (OpenCV's BGR order, any depth).

    Returns the bytes to store, their format, and the stored image (for its dimensions).
    """
    height, width = image.shape[:2]
    size = _scaled_size(width, height, t)
    if size is not None:
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    target = t.encode
    if target == "keep":
        target = fmt if fmt in ("jpeg", "png") else "png"
    if target == "raw":
        pixels = _to_uint8(image)
        if pixels.ndim == 3 and pixels.shape[2] == 3:
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
        elif pixels.ndim == 3 and pixels.shape[2] == 4:
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGRA2RGBA)
        return np.ascontiguousarray(pixels).tobytes(), "raw", pixels
    if target == "jpeg":
        pixels = _to_uint8(image)
        if pixels.ndim == 3 and pixels.shape[2] == 4:  # JPEG has no alpha: dropped
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGRA2BGR)
        ok, buf = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, t.quality])
    else:
        pixels = image
        ok, buf = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise ValueError(f"OpenCV could not encode the image as {target}")
    return buf.tobytes(), target, pixels


def _decode_unchanged(data: bytes) -> np.ndarray | None:
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
