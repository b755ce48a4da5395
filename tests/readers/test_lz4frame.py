"""LZ4 frames with their content size (readers.formats.lz4frame): standard frames that pyarrow
and the LZ4 decoder read, whose size readers check before decompressing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from readers.decode import decompress
from readers.formats import lz4frame

PIXELS = np.random.default_rng(2).integers(0, 4, 3000, dtype=np.uint8).tobytes()


def test_xxh32_matches_the_published_values() -> None:
    # xxHash32 of the empty input and of "a" with seed 0 (xxHash's reference values)
    assert lz4frame._xxh32_short(b"") == 0x02CC5D05
    assert lz4frame._xxh32_short(b"a") == 0x550D7456


def test_a_frame_with_its_size_is_read_by_pyarrow_and_declares_it() -> None:
    plain = pa.Codec("lz4").compress(PIXELS, asbytes=True)
    assert lz4frame.content_size(plain) is None
    sized = lz4frame.with_content_size(plain, len(PIXELS))
    assert lz4frame.content_size(sized) == len(PIXELS)
    assert lz4frame.content_size(memoryview(sized)) == len(PIXELS)
    assert pa.Codec("lz4").decompress(sized, len(PIXELS), asbytes=True) == PIXELS
    assert pa.input_stream(pa.py_buffer(sized), compression="lz4").read() == PIXELS
    with pytest.raises(ValueError, match="without content size"):
        lz4frame.with_content_size(sized, len(PIXELS))


@pytest.mark.parametrize("sized", [True, False], ids=["packer", "pyarrow"])
@pytest.mark.parametrize("delta", [-1, 1, 100])
def test_decompress_refuses_a_frame_of_another_size(sized: bool, delta: int) -> None:
    """pyarrow, asked for more bytes than a frame holds, pads them with stale memory: the
    size must be checked, with or without a content size in the frame."""
    frame = pa.Codec("lz4").compress(PIXELS, asbytes=True)
    if sized:
        frame = lz4frame.with_content_size(frame, len(PIXELS))
    assert decompress(frame, "lz4", len(PIXELS)) == PIXELS
    with pytest.raises(ValueError, match=f"cannot decompress lz4 to {len(PIXELS) + delta} bytes"):
        decompress(frame, "lz4", len(PIXELS) + delta)


def test_a_frame_whose_header_lies_about_its_size_is_refused() -> None:
    frame = pa.Codec("lz4").compress(PIXELS, asbytes=True)
    lying = lz4frame.with_content_size(frame, len(PIXELS) + 1)
    with pytest.raises(ValueError, match="cannot decompress lz4"):
        decompress(lying, "lz4", len(PIXELS) + 1)


@pytest.mark.parametrize("delta", [-1, 1, 100])
def test_zstd_of_another_size_is_refused(delta: int) -> None:
    frame = pa.Codec("zstd").compress(PIXELS, asbytes=True)
    assert decompress(frame, "zstd", len(PIXELS)) == PIXELS
    with pytest.raises(ValueError, match="cannot decompress zstd"):
        decompress(frame, "zstd", len(PIXELS) + delta)
