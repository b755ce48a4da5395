"""Encoded image bytes -> numpy arrays (HWC uint8), in one place."""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np

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
