"""Recognise encoded images by their first bytes, not by their file names."""

from __future__ import annotations

# Extensions that name images; used only to decide which files are worth opening.
IMAGE_EXTENSIONS = frozenset(
    {
        ".jpg",
        ".jpeg",
        ".jpe",
        ".png",
        ".bmp",
        ".dib",
        ".webp",
        ".tif",
        ".tiff",
        ".pbm",
        ".pgm",
        ".ppm",
    }
)

SNIFF_BYTES = 16


def sniff_format(head: bytes) -> str | None:
    """The image format that `head` (the first bytes of a file) starts with, or None.

    Returns one of ``jpeg``, ``png``, ``bmp``, ``webp``, ``tiff``, ``pnm``.
    """
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"BM") and len(head) >= 14:
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"123456" and head[2:3].isspace():
        return "pnm"
    return None
