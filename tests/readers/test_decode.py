"""decode_sample: the one decode path, encoded and raw pixels alike."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from readers.decode import decode_sample


@pytest.fixture
def rgb() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def test_raw_pixels_are_reshaped_not_decoded(rgb: np.ndarray) -> None:
    out = decode_sample(rgb.tobytes(), "rgb", stored="raw", height=5, width=7, channels=3)
    np.testing.assert_array_equal(out, rgb)
    bgr = decode_sample(rgb.tobytes(), "bgr", stored="raw", height=5, width=7, channels=3)
    np.testing.assert_array_equal(bgr, rgb[:, :, ::-1])


def test_raw_pixels_of_the_wrong_size_are_an_error(rgb: np.ndarray) -> None:
    with pytest.raises(ValueError, match="raw bytes"):
        decode_sample(rgb.tobytes()[:-1], stored="raw", height=5, width=7, channels=3)


@pytest.mark.parametrize("ext", [".png", ".bmp"])
def test_encoded_bytes_are_decoded_with_opencv(rgb: np.ndarray, ext: str) -> None:
    ok, buf = cv2.imencode(ext, rgb[:, :, ::-1])
    assert ok
    np.testing.assert_array_equal(decode_sample(buf.tobytes(), stored=ext[1:]), rgb)
    gray = decode_sample(buf.tobytes(), "gray", stored=ext[1:])
    assert gray.shape == (5, 7, 1)


def test_bytes_mode_returns_the_stored_bytes_untouched(rgb: np.ndarray) -> None:
    data = rgb.tobytes()
    assert decode_sample(memoryview(data), "bytes", stored="raw", height=5) == data
    with pytest.raises(ValueError, match="decode"):
        decode_sample(b"not an image", stored="png")
