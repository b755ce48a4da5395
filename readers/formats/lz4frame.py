"""The LZ4 frames that hold ``compression: "lz4"`` raw pixels.

The LZ4 frames that hold ``compression: "lz4"`` raw pixels: standard LZ4 frames (what the
``lz4`` tool and pyarrow's ``lz4`` codec read) whose header gives the content size.

pyarrow writes frames without the content size, and its decompressor, asked for more bytes than
a frame holds, pads the rest with whatever memory held: the size cannot be checked after the
fact. So ``packer build`` adds the size to each frame's header (`with_content_size`), readers
compare it with the size the index's dimensions give (`content_size`) before decompressing,
and the LZ4 decoder then refuses a frame whose data does not come to that size.

Frame header (https://github.com/lz4/lz4/blob/dev/doc/lz4_Frame_format.md): magic
``04 22 4D 18``, FLG, BD, [content size: 8 bytes little-endian, when FLG bit 3 is set],
[dictionary id: 4 bytes, FLG bit 0], HC (the second byte of the xxHash32 of FLG..dict id).
"""

from __future__ import annotations

import struct
from typing import Any

MAGIC = b"\x04\x22\x4d\x18"
_CONTENT_SIZE = 0x08  # FLG bit 3
_DICT_ID = 0x01  # FLG bit 0
_HEAD = struct.Struct("<4sBBQ")  # magic, FLG, BD, content size (when FLG bit 3 is set)
_M = 0xFFFFFFFF
_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _xxh32_short(data: bytes) -> int:
    """xxHash32 (seed 0) of fewer than 16 bytes (a frame descriptor)."""
    if len(data) >= 16:
        raise ValueError("xxh32 of 16 bytes or more is not needed here")
    acc = (_P5 + len(data)) & _M
    i = 0
    while i + 4 <= len(data):
        lane = int.from_bytes(data[i : i + 4], "little")
        acc = _rotl((acc + lane * _P3) & _M, 17) * _P4 & _M
        i += 4
    for byte in data[i:]:
        acc = _rotl((acc + byte * _P5) & _M, 11) * _P1 & _M
    acc ^= acc >> 15
    acc = acc * _P2 & _M
    acc ^= acc >> 13
    acc = acc * _P3 & _M
    return acc ^ (acc >> 16)


def with_content_size(frame: bytes, size: int) -> bytes:
    """Return `frame` with its header giving the content size `size`.

    `frame` (one LZ4 frame without content size or dictionary id, as pyarrow writes it) with
    its header giving `size`, the length of its content.

    Raises:
        ValueError: `frame` is not such a frame.
    """
    if not frame.startswith(MAGIC) or len(frame) < 7 or frame[4] & (_CONTENT_SIZE | _DICT_ID):
        raise ValueError("not an LZ4 frame without content size and dictionary id")
    descriptor = bytes([frame[4] | _CONTENT_SIZE, frame[5]]) + size.to_bytes(8, "little")
    checksum = (_xxh32_short(descriptor) >> 8) & 0xFF
    return MAGIC + descriptor + bytes([checksum]) + frame[7:]


def content_size(data: Any) -> int | None:
    """Return the content size an LZ4 frame's header gives, or None.

    The content size an LZ4 frame's header gives, or None when it gives none (or `data`,
    any bytes-like object, does not start with an LZ4 frame header).
    """
    try:
        magic, flags, _, size = _HEAD.unpack_from(data)
    except (struct.error, TypeError):  # shorter than a header with the size
        return None
    if magic != MAGIC or not flags & _CONTENT_SIZE:
        return None
    return int(size)
