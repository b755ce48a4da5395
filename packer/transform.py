"""Pack-time transforms: resize, encode, compress, max-pixels and EXIF orientation.

Pack-time transforms: ``--resize``, ``--encode`` (keep, jpeg, png, raw), ``--compress`` (of raw
pixels: none, lz4, zstd) and ``--max-pixels``, and turning a stored grid upright by its EXIF
orientation.

OpenCV is imported by the functions that use it, not with the module: the main process of a
parallel build only plans and merges, and its pool processes import OpenCV themselves while
it scans (`packer.engines.local.start_pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.formats import lz4frame

# PIL's decompression-bomb error threshold (2 x Image.MAX_IMAGE_PIXELS): ~13,400 x 13,400.
DEFAULT_MAX_PIXELS = 178_956_970

ENCODINGS = ("keep", "jpeg", "png", "raw")
COMPRESSIONS = ("none", "lz4", "zstd")
"""``--compress`` of raw pixels; the names are the index's ``compression`` (and pyarrow's
codecs: ``lz4`` is the LZ4 frame format, which the ``lz4`` tool reads)."""
_ZSTD_LEVEL = 3  # zstd's own default: 7 % smaller than level 1 on icons, as fast to decompress
# LZ4's high-compression level 3: on the 64x64 icons 17 % smaller than the fast level 1 and
# 20 % faster to decompress (4.8 vs 6.0 us an icon: fewer, longer matches), for 47 us more per
# image at pack time; levels above 3 decompressed no faster. The frames are the same format.
_LZ4_LEVEL = 3
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
    ``compress``: ``none``, or the codec (``lz4``, ``zstd``) that squeezes raw pixels; only
    with ``encode="raw"``.
    """

    short: int | None = None
    fit: tuple[int, int] | None = None
    encode: str = "keep"
    quality: int = 95
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    compress: str = "none"

    def __post_init__(self) -> None:
        if self.encode not in ENCODINGS:
            raise ValueError(f"--encode {self.encode!r}: expected one of {', '.join(ENCODINGS)}")
        if self.compress not in COMPRESSIONS:
            raise ValueError(
                f"--compress {self.compress!r}: expected one of {', '.join(COMPRESSIONS)}"
            )
        if self.compress != "none" and self.encode != "raw":
            raise ValueError(
                f"--compress {self.compress} compresses raw pixels, but --encode is "
                f"{self.encode}: add --encode raw, or drop --compress"
            )
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality}: expected 1..100")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"--max-pixels {self.max_pixels}: expected a positive count")

    @property
    def identity(self) -> bool:
        """Whether the stored bytes are the original bytes (``max_pixels`` only refuses)."""
        return self.short is None and self.fit is None and self.encode == "keep"

    @property
    def compression(self) -> str | None:
        """The index's ``compression`` of the records this transform stores (None: absent)."""
        return None if self.compress == "none" else self.compress

    def options(self) -> dict[str, Any]:
        """The transform's build options, as meta.json records them.

        ``compress`` is recorded only when it compresses, so that a build without it stays
        byte for byte the build of a packer that had no such option.
        """
        resize = None
        if self.short is not None:
            resize = str(self.short)
        elif self.fit is not None:
            resize = f"{self.fit[0]}x{self.fit[1]}"
        options: dict[str, Any] = {
            "resize": resize,
            "encode": self.encode,
            "quality": self.quality,
            "max_pixels": self.max_pixels,
        }
        if self.compression is not None:
            options["compress"] = self.compression
        return options


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


_CODECS: dict[str, Any] = {}  # pyarrow codec of each compression, at its level


def compress_pixels(raw: bytes, compression: str) -> bytes:
    """Compress raw pixels with `compression` (``zstd`` or ``lz4``).

    Raw pixels squeezed by `compression` with pyarrow's codecs, which
    ``readers.decode.decompress`` undoes: ``zstd``, or ``lz4`` (an LZ4 frame whose header gives
    the size of the pixels: `readers.formats.lz4frame`).
    """
    codec = _CODECS.get(compression)
    if codec is None:  # made once per process: a zstd codec took ~27 us to make
        import pyarrow as pa

        level = _ZSTD_LEVEL if compression == "zstd" else _LZ4_LEVEL
        codec = _CODECS[compression] = pa.Codec(compression, level)
    data = bytes(codec.compress(raw, asbytes=True))
    return data if compression == "zstd" else lz4frame.with_content_size(data, len(raw))


def apply_transform(image: np.ndarray, fmt: str, t: Transform) -> tuple[bytes, str, np.ndarray]:
    """Resize and re-encode a decoded image (OpenCV's BGR order, any depth).

    Returns the bytes to store (raw pixels compressed as ``t.compress`` says), their format,
    and the stored image (for its dimensions).
    """
    import cv2  # imported where images are decoded (see packer.prepare)

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
        raw = np.ascontiguousarray(pixels).tobytes()
        if t.compression is not None:
            raw = compress_pixels(raw, t.compression)
        return raw, "raw", pixels
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


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored pixel grid upright as its EXIF orientation says (as OpenCV does)."""
    import cv2  # imported where images are decoded (see packer.prepare)

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
