"""Read one source image, prove it decodable, and describe the bytes to store."""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from packer import problems as P
from packer.problems import Problem
from readers.formats.images import SNIFF_BYTES, sniff_format

_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


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


def _png_header(data: bytes) -> tuple[int, int, int] | None:
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    color_type = data[25]
    if color_type not in _PNG_CHANNELS:
        return None
    return width, height, _PNG_CHANNELS[color_type]


def probe_header(data: bytes, fmt: str) -> tuple[int, int, int] | None:
    """Width, height and channels from the header alone (JPEG, PNG), or None."""
    if fmt == "jpeg":
        return _jpeg_header(data)
    if fmt == "png":
        return _png_header(data)
    return None


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


def read_source(path: str, rel: str) -> bytes | Problem:
    """The bytes of one file, or the problem that prevents reading it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Problem(rel, P.UNREADABLE, "vanished after the scan")
    except OSError as exc:
        return Problem(rel, P.UNREADABLE, f"cannot read ({exc.strerror or exc})")
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
    """

    short: int | None = None
    fit: tuple[int, int] | None = None
    encode: str = "keep"
    quality: int = 95

    def __post_init__(self) -> None:
        if self.encode not in ENCODINGS:
            raise ValueError(f"--encode {self.encode!r}: expected one of {', '.join(ENCODINGS)}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality}: expected 1..100")

    @property
    def identity(self) -> bool:
        return self.short is None and self.fit is None and self.encode == "keep"

    def options(self) -> dict[str, Any]:
        resize = None
        if self.short is not None:
            resize = str(self.short)
        elif self.fit is not None:
            resize = f"{self.fit[0]}x{self.fit[1]}"
        return {"resize": resize, "encode": self.encode, "quality": self.quality}


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
    A transform always decodes, then resizes and re-encodes as asked.
    """
    data = read_source(path, rel)
    if isinstance(data, Problem):
        return data
    fmt = sniff_format(data[:SNIFF_BYTES])
    if fmt is None:
        return Problem(rel, P.NOT_IMAGE, "not an image (content matches no known image format)")
    if is_truncated(data, fmt):
        return Problem(rel, P.TRUNCATED, f"a {fmt.upper()} file cut short (no end marker)")
    if transform is not None and not transform.identity:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            return Problem(rel, P.UNDECODABLE, f"looks like {fmt.upper()} but does not decode")
        stored, stored_fmt, pixels = apply_transform(image, fmt, transform)
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
        )
    dims = None if decode_check else probe_header(data, fmt)
    if dims is None:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            return Problem(rel, P.UNDECODABLE, f"looks like {fmt.upper()} but does not decode")
        channels = 1 if image.ndim == 2 else int(image.shape[2])
        dims = (int(image.shape[1]), int(image.shape[0]), channels)
    width, height, channels = dims
    return Record(rel, label, data, fmt, width, height, channels, zlib.crc32(data))
