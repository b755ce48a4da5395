"""The pack-time decode of a source image, and the build's cheaper decode check.

The pack-time decode of a source image: OpenCV's pixels, or why they cannot be packed (a
decoder that reports corrupt data, a depth the default reader cannot read), and the caveats
the decoder printed about an image that is usable; and the build's decode check, which proves
the same of a stored image at less cost (`check_source`).

- The check of a JPEG decodes it at 1/8 scale: libjpeg entropy-decodes every coefficient of
  every scan at any DCT scale (only the inverse DCT shrinks), so corrupt or cut-short data
  gives the same warnings and errors as a full decode, at a third to half of its cost. The
  width, height and channels come from the frame header (SOF), which is what the full decode
  gives; the reduced image must have the size libjpeg scales that header to, which proves it
  was the frame decoded. A JPEG the reduced decode finds fault with is decoded in full, whose
  verdict (and message) stands, as do JPEGs of other than 8-bit samples.
- The check of a PNG inflates its IDAT stream and checks every chunk's CRC, the stream's
  exact length and every row's filter byte (`packer.png_stream`); any PNG that is not
  plainly whole is decoded in full, whose verdict stands.
- Other formats are decoded in full.

- Decoder warnings: libjpeg reports data it decoded around (``Corrupt JPEG data: premature
  end of data segment``, ``... extraneous bytes before marker 0xd9``, ``... found marker 0xd3
  instead of RST2``, ``Premature end of JPEG file``) only as a line on the process's stderr,
  and OpenCV returns an image anyway, its damaged part filled in. So each decode runs with
  file descriptor 2 pointed at a scratch file of this process, and the libjpeg messages that
  land there are read back: a corrupt-data message makes the image ``undecodable``; any other
  libjpeg warning (the pixels are whole) is a ``decode_warning`` note. Whatever else was
  written to stderr meanwhile (another thread) is passed on to the real stderr afterwards.
  A corruption that the decoder does not notice (zeroed bytes that happen to decode as
  valid data to the end of the scan) cannot be told from image content, and is packed.
- Depth: images of 8 or 16 bits per sample are used as they are. Others (float, 32-bit or
  signed TIFF samples) are what OpenCV's ``imread`` makes of them: decodable by the default
  reader (8- and 16-bit signed TIFF, converted to 8 bits as ``imread`` does, which is what a
  transform then works from), or refused as ``undecodable`` with the reason (float and 32-bit
  samples, which ``imread`` cannot read).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.png_stream import prove_png
from packer.probe import JPEG_CHANNELS, jpeg_frame

# libjpeg's warnings (jerror.h, JWRN_*) that mean the decoded pixels are not the image.
_CORRUPT = re.compile(
    r"^(Corrupt JPEG data: (?!bad ICC marker).*|Premature end of JPEG file"
    r"|Inconsistent progression sequence .*|Huffman table 0x[0-9a-f]+ was not defined)$"
)
# libjpeg's other warnings: the image decodes whole, with a caveat.
_CAVEAT = re.compile(
    r"^(Corrupt JPEG data: bad ICC marker|Invalid SOS parameters for sequential JPEG"
    r"|Warning: unknown JFIF revision number .*|Application transferred too (few|many) .*"
    r"|Warning: thumbnail image size does not match data length .*)$"
)

_NATIVE_DEPTHS = (np.uint8, np.uint16)


@dataclass(frozen=True)
class Decoded:
    """What decoding source bytes gave: the pixels (None: they do not decode) and why not."""

    image: np.ndarray | None
    problem: str = ""  # why the image cannot be packed (empty: it can)
    warnings: tuple[str, ...] = field(default=())  # libjpeg caveats of a usable image


@dataclass(frozen=True)
class Checked:
    """What the build's decode check found about one source image.

    What the build's decode check found: ``(width, height, channels)`` as OpenCV's
    ``IMREAD_UNCHANGED`` decodes the image (None: it cannot be packed, and why not), and the
    decoder's caveats.
    """

    dims: tuple[int, int, int] | None
    problem: str = ""
    warnings: tuple[str, ...] = field(default=())


class _Scratch:
    """A file per process that fd 2 points at while a decoder runs (see `_decoder_messages`)."""

    lock = threading.Lock()
    pid = -1
    fd = -1
    keep: Any = None  # the TemporaryFile, where there is no memfd

    @classmethod
    def get(cls) -> int:
        if cls.pid != os.getpid():  # a forked child must not write into its parent's file
            if hasattr(os, "memfd_create"):
                cls.fd = os.memfd_create("packer-decoder-messages", os.MFD_CLOEXEC)
            else:  # pragma: no cover - not Linux
                cls.keep = tempfile.TemporaryFile()  # noqa: SIM115 - open for the process's life
                cls.fd = cls.keep.fileno()
            cls.pid = os.getpid()
        return cls.fd


if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork is never freed
    os.register_at_fork(after_in_child=lambda: setattr(_Scratch, "lock", threading.Lock()))


@contextlib.contextmanager
def _decoder_messages() -> Iterator[list[str]]:
    """Collect the libjpeg lines written to fd 2 inside the block (other text is passed on)."""
    found: list[str] = []
    with _Scratch.lock:
        try:
            scratch = _Scratch.get()
            saved = os.dup(2)
        except OSError:  # no stderr to redirect (closed): decode without listening
            yield found
            return
        with contextlib.suppress(Exception):
            sys.stderr.flush()  # Python's own pending text goes where it was meant to
        os.dup2(scratch, 2)
        try:
            yield found
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            size = os.lseek(scratch, 0, os.SEEK_CUR)
            text = ""
            if size:  # nearly always 0: nothing more to do
                text = os.pread(scratch, size, 0).decode("utf-8", "replace")
                os.ftruncate(scratch, 0)
                os.lseek(scratch, 0, os.SEEK_SET)
            other = []
            for line in text.splitlines(keepends=True):
                message = line.strip()
                if _CORRUPT.match(message) or _CAVEAT.match(message):
                    found.append(message)
                else:
                    other.append(line)
            if other:
                with contextlib.suppress(OSError):
                    os.write(2, "".join(other).encode("utf-8", "replace"))


def decode_source(data: bytes, fmt: str) -> Decoded:
    """Decode `data` (sniffed as `fmt`) as stored, with ``IMREAD_UNCHANGED``, checked.

    Returns:
        The pixels in OpenCV's channel order (converted to 8 bits as ``imread`` does when the
        depth is neither 8 nor 16 bits), or None with the reason; and the decoder's caveats.
    """
    import cv2  # imported where images are decoded: a build's main process may never need it

    buf = np.frombuffer(data, np.uint8)
    with _decoder_messages() as messages:
        try:
            image = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
        except cv2.error:  # OpenCV raises for some malformed headers instead of returning None
            image = None
    name = fmt.upper()
    if image is None:
        return Decoded(None, f"looks like {name} but does not decode")
    corrupt = [m for m in messages if _CORRUPT.match(m)]
    if corrupt:
        return Decoded(
            None,
            f"the {name} decoder reports corrupt data ({corrupt[0]}); the pixels it returns "
            "are partly made up, so the image is not packed",
        )
    if image.dtype not in _NATIVE_DEPTHS:
        # what imread (and readers' decode="rgb"/"bgr"/"gray") make of it: 8 bits or nothing
        try:
            converted = cv2.imdecode(buf, cv2.IMREAD_ANYCOLOR)
        except cv2.error:
            converted = None
        if converted is None:
            return Decoded(
                None,
                f"a {name} of {image.dtype} samples, which OpenCV's imread (and so readers' "
                'default decode="rgb") cannot read; convert it to 8 or 16 bits per sample',
            )
        image = converted
    return Decoded(image, warnings=tuple(messages))


def _reduced_jpeg(data: bytes) -> Checked | None:
    """Check a JPEG by its 1/8-scale decode, or return None.

    The check of a JPEG by its 1/8-scale decode (this module's docstring), or None when
    only a full decode can tell.
    """
    import cv2

    frame = jpeg_frame(data)
    if frame is None:
        return None
    width, height, components, precision = frame
    if precision != 8 or components not in JPEG_CHANNELS or not width or not height:
        return None
    gray = components == 1
    flags = cv2.IMREAD_REDUCED_GRAYSCALE_8 if gray else cv2.IMREAD_REDUCED_COLOR_8
    with _decoder_messages() as messages:
        try:
            image = cv2.imdecode(
                np.frombuffer(data, np.uint8), flags | cv2.IMREAD_IGNORE_ORIENTATION
            )
        except cv2.error:
            image = None
    if image is None or any(_CORRUPT.match(m) for m in messages):
        return None
    if image.shape[:2] != (-(-height // 8), -(-width // 8)):  # not the frame we measured
        return None
    return Checked((width, height, JPEG_CHANNELS[components]), warnings=tuple(messages))


def check_source(data: bytes, fmt: str) -> Checked:
    """Prove `data` decodable as `decode_source` would, at the least cost.

    Prove `data` (sniffed as `fmt`) decodable as `decode_source` would, and measure it, at
    the least cost that proves the same (this module's docstring).

    Returns:
        The width, height and channels that ``IMREAD_UNCHANGED`` decodes, or None and the
        reason the image cannot be packed; and the decoder's caveats.
    """
    if fmt == "png":
        dims = prove_png(data)
        if dims is not None:
            return Checked(dims)
    elif fmt == "jpeg":
        checked = _reduced_jpeg(data)
        if checked is not None:
            return checked
    decoded = decode_source(data, fmt)
    image = decoded.image
    if image is None:
        return Checked(None, decoded.problem)
    channels = 1 if image.ndim == 2 else int(image.shape[2])
    return Checked((int(image.shape[1]), int(image.shape[0]), channels), "", decoded.warnings)
