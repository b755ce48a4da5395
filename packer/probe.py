"""Image headers without decoding: size, channels, orientation, truncation.

Image headers without decoding: width, height and channels (JPEG SOF, PNG IHDR, BMP, WebP,
TIFF, PNM), EXIF orientation, and whether a JPEG or PNG is cut short.
"""

from __future__ import annotations

import struct

_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
# PNG colour type -> channels OpenCV's IMREAD_UNCHANGED returns (gray+alpha is expanded to
# BGRA); with a tRNS chunk, RGB and palette images come back with alpha.
PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}
PNG_TRNS_CHANNELS = {0: 1, 2: 4, 3: 4, 4: 4, 6: 4}
# JPEG components -> channels OpenCV returns (CMYK and YCCK are converted to BGR).
JPEG_CHANNELS = {1: 1, 3: 3, 4: 3}

_EXIF_ORIENTATION_TAG = 0x0112
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


def jpeg_frame(data: bytes) -> tuple[int, int, int, int] | None:
    """Return the size, components and precision from a JPEG's SOF, or None.

    Width, height, component count and sample precision (bits) from a JPEG's first frame
    header (SOF), or None when no SOF is found before the data runs out.
    """
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
        (length,) = _U16.unpack_from(data, pos + 2)
        if marker in _JPEG_SOF and pos + 10 <= n:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return width, height, data[pos + 9], data[pos + 4]
        pos += 2 + length
    return None


def _jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    found = jpeg_frame(data)
    return None if found is None else found[:3]


def _png_size(data: bytes) -> tuple[int, int, int] | None:
    """Width, height and colour type from IHDR, or None."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    color_type = data[25]
    if color_type not in PNG_CHANNELS:
        return None
    return width, height, color_type


def _png_find(data: bytes, want: bytes) -> tuple[int, int] | None:
    """Return ``(start, length)`` of the first PNG chunk of type `want`, or None.

    ``(start, length)`` of the first chunk of type `want` whose header lies in `data`,
    up to IEND; None when there is none.
    """
    pos = 8
    n = len(data)
    unpack = _U32.unpack_from
    while pos + 8 <= n:
        kind = data[pos + 4 : pos + 8]
        (length,) = unpack(data, pos)
        if kind == want:
            return pos + 8, length
        if kind == b"IEND":
            return None
        pos += 12 + length
    return None


def _png_header(data: bytes) -> tuple[int, int, int] | None:
    found = _png_size(data)
    if found is None:
        return None
    width, height, color_type = found
    table = PNG_TRNS_CHANNELS if _png_find(data, b"tRNS") is not None else PNG_CHANNELS
    return width, height, table[color_type]


def probe_header(data: bytes, fmt: str) -> tuple[int, int, int] | None:
    """Width, height and channels from the header alone (JPEG, PNG), or None.

    The channels are those OpenCV's ``IMREAD_UNCHANGED`` decode returns, so that a build
    with ``--no-decode-check`` writes the same index as one that decodes.
    """
    if fmt == "jpeg":
        found = _jpeg_header(data)
        if found is None or found[2] not in JPEG_CHANNELS:
            return None
        return found[0], found[1], JPEG_CHANNELS[found[2]]
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
    """Return the width and height from any sniffed format's header, or None.

    Width and height from the header of any sniffed format, without decoding; None when
    the header does not give them (the decoder then applies its own limits).
    """
    try:
        if fmt in ("jpeg", "png"):  # the size only: a PNG's chunks need not be walked
            found = _jpeg_header(data) if fmt == "jpeg" else _png_size(data)
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
            (length,) = _U16.unpack_from(data, pos + 2)
            body = data[pos + 4 : pos + 2 + length]
            if marker == 0xE1 and body.startswith(b"Exif\x00\x00"):
                return body[6:]
            pos += 2 + length
        return None
    if fmt == "png":
        found = _png_find(data, b"eXIf")
        return None if found is None else data[found[0] : found[0] + found[1]]
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
