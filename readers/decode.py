"""Encoded image bytes -> numpy arrays (HWC uint8), in one place."""

from __future__ import annotations

from typing import Any, Literal

import cv2
import numpy as np

from readers.draft import Draft, choose_scale
from readers.formats import lz4frame

DecodeMode = Literal["rgb", "bgr", "gray", "unchanged", "bytes"]
DECODE_MODES: tuple[str, ...] = ("rgb", "bgr", "gray", "unchanged", "bytes")

_FLAGS = {
    "rgb": cv2.IMREAD_COLOR,
    "bgr": cv2.IMREAD_COLOR,
    "gray": cv2.IMREAD_GRAYSCALE,
    "unchanged": cv2.IMREAD_UNCHANGED,
}

_SCALE_BITS = {  # IMREAD_REDUCED_GRAYSCALE_s is the scale's bits alone
    2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
    4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
    8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
}
RGB_DIRECT: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)
"""OpenCV's flag (4.11 and later) to have libjpeg write RGB itself, or None where it lacks it.

Reduced decodes (``draft=``, planned crops) use it: the pixels are those of a BGR decode
converted, without the conversion's pass over the image. Full-size decodes keep the BGR
decode and ``cvtColor``, as before.
"""


def reduced_flags(rgb_direct: int | None) -> dict[tuple[str, int], tuple[int, bool]]:
    """Return ``(mode, scale) -> (OpenCV flags, convert BGR to RGB after)`` for a reduced decode.

    The flags decode a JPEG at 1/scale (libjpeg's DCT scaling); with them OpenCV applies the
    EXIF orientation as with IMREAD_COLOR / IMREAD_GRAYSCALE. IMREAD_UNCHANGED has no reduced
    form; on a JPEG it is ANYCOLOR | ANYDEPTH without the orientation (the stored grid,
    channels as stored), which the scale bits combine with. ``rgb`` decodes to RGB directly
    with `rgb_direct` (`RGB_DIRECT`), else to BGR then converted.
    """
    unchanged = cv2.IMREAD_ANYCOLOR | cv2.IMREAD_ANYDEPTH | cv2.IMREAD_IGNORE_ORIENTATION
    table = {}
    for scale, bits in _SCALE_BITS.items():
        table["bgr", scale] = (bits | cv2.IMREAD_COLOR, False)
        table["gray", scale] = (bits | cv2.IMREAD_GRAYSCALE, False)
        table["unchanged", scale] = (bits | unchanged, False)
        if rgb_direct is None:
            table["rgb", scale] = (bits | cv2.IMREAD_COLOR, True)
        else:
            table["rgb", scale] = (bits | rgb_direct, False)
    return table


_REDUCED_FLAGS = reduced_flags(RGB_DIRECT)


def check_mode(mode: str) -> None:
    """Raise ValueError unless `mode` is a decode mode."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode={mode!r}: expected one of {', '.join(DECODE_MODES)}")


_FROM_RAW = {
    # (stored channels, mode) -> OpenCV conversion of the stored RGB/gray/RGBA pixels
    (1, "rgb"): cv2.COLOR_GRAY2RGB,
    (1, "bgr"): cv2.COLOR_GRAY2BGR,
    (3, "bgr"): cv2.COLOR_RGB2BGR,
    (3, "gray"): cv2.COLOR_RGB2GRAY,
    (4, "rgb"): cv2.COLOR_RGBA2RGB,
    (4, "bgr"): cv2.COLOR_RGBA2BGR,
    (4, "gray"): cv2.COLOR_RGBA2GRAY,
}


def decode_raw(
    data: bytes | memoryview | np.ndarray,
    height: int,
    width: int,
    channels: int,
    mode: str = "rgb",
) -> np.ndarray:
    """Pixels stored by ``packer build --encode raw`` (uint8, RGB / gray / RGBA) as HxWxC.

    No decode: one copy out of the shard (the shard's memory is not ours to hand out), and a
    colour conversion only when `mode` asks for another layout than the stored one.
    """
    flat = np.frombuffer(data, dtype=np.uint8)
    if flat.size != height * width * channels:
        raise ValueError(
            f"{flat.size} raw bytes, expected {height}x{width}x{channels} = "
            f"{height * width * channels}"
        )
    image: np.ndarray = flat.reshape(height, width, channels)
    conversion = _FROM_RAW.get((channels, mode))
    if conversion is None:
        return np.array(image)
    converted: np.ndarray = cv2.cvtColor(image, conversion)
    return converted if converted.ndim == 3 else converted[:, :, np.newaxis]


def decode_image(
    data: bytes | memoryview | np.ndarray, mode: str = "rgb", *, scale: int = 1
) -> np.ndarray:
    """Decode an encoded image.

    Args:
        data: the encoded bytes (JPEG, PNG, ... anything OpenCV reads).
        mode: ``rgb`` / ``bgr`` give HxWx3 uint8; ``gray`` gives HxWx1 uint8; ``unchanged``
            gives the stored channels and depth (HxWxC, C in 1..4, uint8 or uint16).
        scale: 2, 4 or 8 decode a JPEG at that reduction (``ceil(H / scale) x
            ceil(W / scale)``, libjpeg's DCT scaling); only for JPEG bytes (OpenCV would
            decode any other format fully and resize it). 1 (default): full size.

    Raises:
        ValueError: the bytes do not decode, or `scale` is not 1, 2, 4 or 8.
    """
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if buf.size == 0:
        raise ValueError("empty image bytes")
    if scale == 1:
        flags, convert = _FLAGS[mode], mode == "rgb"
    elif (mode, scale) in _REDUCED_FLAGS:
        flags, convert = _REDUCED_FLAGS[mode, scale]
    else:
        raise ValueError(f"scale={scale!r}: expected 1, 2, 4 or 8")
    image = cv2.imdecode(buf, flags)
    if image is None:
        raise ValueError("OpenCV could not decode the bytes")
    if image.ndim == 2:
        image = image[:, :, np.newaxis]
    elif convert:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return image


def decode_sample(
    data: bytes | memoryview | np.ndarray,
    mode: str = "rgb",
    *,
    stored: str = "",
    height: int = 0,
    width: int = 0,
    channels: int = 0,
    draft: Draft | None = None,
    scale: int = 1,
) -> Any:
    """The one decode path for a stored sample: datasets, streams, verify and bench use it.

    Args:
        data: the stored bytes of one sample.
        mode: ``rgb``, ``bgr``, ``gray``, ``unchanged``, or ``bytes`` (the stored bytes as
            ``bytes``, untouched).
        stored: the sample's index ``format``; ``raw`` means pixels written by
            ``packer build --encode raw``, which are reshaped with `height`, `width` and
            `channels` instead of decoded; anything else is decoded with OpenCV.
        height: the index's (stored) height of the sample; raw pixels need it, and so
            does `draft`.
        width: the index's (stored) width of the sample, needed as `height` is.
        channels: the index's channel count; raw pixels need it.
        draft: ``S`` (shorter side) or ``(H, W)``: a JPEG (``stored="jpeg"``) of known
            `height` and `width` is decoded at the largest DCT reduction (1/8, 1/4, 1/2)
            that keeps the returned image at least that large (`readers.draft`); anything
            else, and None (default), decodes at full size.
        scale: decode a JPEG at this reduction (2, 4, 8) chosen by the caller (a crop planned
            before decoding, `readers.transforms`); overrides `draft`. Ignored unless
            ``stored="jpeg"``.

    Raises:
        ValueError: the bytes do not decode (or raw bytes do not match the dimensions).

    Example: what ``draft=256`` does to one stored JPEG of the index's size ``h x w``::

        decode_sample(data, "rgb", stored="jpeg", height=h, width=w, draft=256)
    """
    if mode == "bytes":
        return bytes(data)
    if stored == "raw":
        return decode_raw(data, height, width, channels, mode)
    if stored == "jpeg" and scale == 1 and draft is not None and height > 0 and width > 0:
        scale = choose_scale(data, height, width, mode, draft)
    return decode_image(data, mode, scale=scale if stored == "jpeg" else 1)


_codecs: dict[str, Any] = {}
"""pyarrow's codec of each compression, made once per process (it holds no state)."""


def _codec(compression: str) -> Any:
    codec = _codecs.get(compression)
    if codec is None:
        import pyarrow as pa

        codec = _codecs[compression] = pa.Codec(compression)
    return codec


def _arrow_error() -> type[Exception]:
    import pyarrow as pa

    return pa.ArrowException  # type: ignore[no-any-return]


def decompress(data: bytes | memoryview | np.ndarray, compression: str, size: int) -> bytes:
    """Decompress the raw pixels of a record stored with ``compression``.

    The raw pixels of a record stored with ``compression`` (``lz4``, ``zstd``: the index's
    field; pyarrow's codecs), which must come to `size` bytes.

    A zstd frame gives its content size, which the codec checks; so does the LZ4 frame of a
    ``packer build`` (`readers.formats.lz4frame`), whose size is compared first; an LZ4 frame
    without one is read to its end to learn its size (slower).

    Raises:
        ValueError: the bytes do not decompress, or not to `size` bytes.
    """
    try:
        codec = _codec(compression)
        if compression == "lz4":
            declared = lz4frame.content_size(data)
            if declared is None:  # not written by packer: its size is known once it is read
                import pyarrow as pa

                out = pa.input_stream(pa.py_buffer(data), compression="lz4").read()
                declared = len(out)
                if declared == size:
                    return bytes(out)
            if declared != size:
                raise ValueError(f"the LZ4 frame holds {declared} bytes")
        out = codec.decompress(data, decompressed_size=size, asbytes=True)
    except (_arrow_error(), ValueError, OSError) as exc:  # (evaluated only on an error)
        raise ValueError(f"cannot decompress {compression} to {size} bytes ({exc})") from exc
    if len(out) != size:
        raise ValueError(f"{compression} gives {len(out)} bytes, expected {size}")
    return out  # type: ignore[no-any-return]
