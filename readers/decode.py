"""Encoded image bytes -> numpy arrays (HWC uint8), in one place."""

from __future__ import annotations

from typing import Any, Literal

import cv2
import numpy as np

from readers.formats import lz4frame

DecodeMode = Literal["rgb", "bgr", "gray", "unchanged", "bytes"]
DECODE_MODES: tuple[str, ...] = ("rgb", "bgr", "gray", "unchanged", "bytes")

_FLAGS = {
    "rgb": cv2.IMREAD_COLOR,
    "bgr": cv2.IMREAD_COLOR,
    "gray": cv2.IMREAD_GRAYSCALE,
    "unchanged": cv2.IMREAD_UNCHANGED,
}


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


def decode_image(data: bytes | memoryview | np.ndarray, mode: str = "rgb") -> np.ndarray:
    """Decode an encoded image.

    Args:
        data: the encoded bytes (JPEG, PNG, ... anything OpenCV reads).
        mode: ``rgb`` / ``bgr`` give HxWx3 uint8; ``gray`` gives HxWx1 uint8; ``unchanged``
            gives the stored channels and depth (HxWxC, C in 1..4, uint8 or uint16).

    Raises:
        ValueError: the bytes do not decode.
    """
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if buf.size == 0:
        raise ValueError("empty image bytes")
    image = cv2.imdecode(buf, _FLAGS[mode])
    if image is None:
        raise ValueError("OpenCV could not decode the bytes")
    if image.ndim == 2:
        image = image[:, :, np.newaxis]
    elif mode == "rgb":
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
) -> Any:
    """The one decode path for a stored sample: datasets, streams, verify and bench use it.

    Args:
        data: the stored bytes of one sample.
        mode: ``rgb``, ``bgr``, ``gray``, ``unchanged``, or ``bytes`` (the stored bytes as
            ``bytes``, untouched).
        stored: the sample's index ``format``; ``raw`` means pixels written by
            ``packer build --encode raw``, which are reshaped with `height`, `width` and
            `channels` instead of decoded; anything else is decoded with OpenCV.

    Raises:
        ValueError: the bytes do not decode (or raw bytes do not match the dimensions).
    """
    if mode == "bytes":
        return bytes(data)
    if stored == "raw":
        return decode_raw(data, height, width, channels, mode)
    return decode_image(data, mode)


def decompress(data: bytes | memoryview | np.ndarray, compression: str, size: int) -> bytes:
    """The raw pixels of a record stored with ``compression`` (``lz4``, ``zstd``: the index's
    field; pyarrow's codecs), which must come to `size` bytes.

    A zstd frame gives its content size, which the codec checks; so does the LZ4 frame of a
    ``packer build`` (`readers.formats.lz4frame`), whose size is compared first; an LZ4 frame
    without one is read to its end to learn its size (slower).

    Raises:
        ValueError: the bytes do not decompress, or not to `size` bytes.
    """
    import pyarrow as pa

    try:
        if compression == "lz4":
            declared = lz4frame.content_size(data)
            if declared is None:  # not written by packer: its size is known once it is read
                out = pa.input_stream(pa.py_buffer(data), compression="lz4").read()
                declared = len(out)
                if declared == size:
                    return bytes(out)
            if declared != size:
                raise ValueError(f"the LZ4 frame holds {declared} bytes")
        out = pa.Codec(compression).decompress(data, decompressed_size=size, asbytes=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ValueError(f"cannot decompress {compression} to {size} bytes ({exc})") from exc
    if len(out) != size:
        raise ValueError(f"{compression} gives {len(out)} bytes, expected {size}")
    return bytes(out)
