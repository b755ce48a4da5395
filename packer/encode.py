"""Read one source image, prove it decodable, and describe the bytes to store."""

from __future__ import annotations

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


def prepare(rel: str, path: str, label: Any, *, decode_check: bool = True) -> Record | Problem:
    """Read `path`, check it is an image we can store, and describe it.

    The stored bytes are the original bytes.  With `decode_check` the image is decoded once
    (as stored, without applying EXIF orientation) to prove it decodable and to measure it;
    without, JPEG and PNG are measured from their headers only.
    """
    data = read_source(path, rel)
    if isinstance(data, Problem):
        return data
    fmt = sniff_format(data[:SNIFF_BYTES])
    if fmt is None:
        return Problem(rel, P.NOT_IMAGE, "not an image (content matches no known image format)")
    if is_truncated(data, fmt):
        return Problem(rel, P.TRUNCATED, f"a {fmt.upper()} file cut short (no end marker)")
    dims = None if decode_check else probe_header(data, fmt)
    if dims is None:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            return Problem(rel, P.UNDECODABLE, f"looks like {fmt.upper()} but does not decode")
        channels = 1 if image.ndim == 2 else int(image.shape[2])
        dims = (int(image.shape[1]), int(image.shape[0]), channels)
    width, height, channels = dims
    return Record(rel, label, data, fmt, width, height, channels, zlib.crc32(data))
