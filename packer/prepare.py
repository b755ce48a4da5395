"""Prepare one source image for a shard: a `Record` to store, or a `Problem`.

Read it, prove it decodable, transform it as asked, and describe the bytes to store (a
`Record`), or say why it cannot be packed (a `Problem`).

Policies for inputs that are images but unusual (each tested in tests/packer/test_bad_inputs.py):

- The stored bytes are the original bytes (``--encode keep``, the default); the index gives
  ``width``, ``height`` and ``channels`` as OpenCV decodes the stored bytes with
  ``IMREAD_UNCHANGED``, which is what readers return with ``decode="unchanged"``, and the
  same with and without ``--decode-check`` (the header probe maps to OpenCV's answer):
  16-bit PNG: the stored channels (readers' ``rgb``/``bgr``/``gray`` give uint8, ``unchanged``
  gives uint16); palette PNG: 3, or 4 with a ``tRNS`` transparency chunk (as RGB PNG with
  ``tRNS``); gray+alpha PNG: 4 (OpenCV expands it to BGRA); grayscale JPEG: 1; CMYK and YCCK
  JPEG: 3 (OpenCV converts them to BGR).
- EXIF orientation (JPEG, PNG ``eXIf``, WebP ``EXIF``): with ``keep`` the bytes, and so the tag,
  are stored unchanged and width/height are those of the stored pixel grid; readers decode with
  OpenCV's ``IMREAD_COLOR``/``IMREAD_GRAYSCALE``, which apply the orientation as ``cv2.imread``
  does, so ``ds[i]`` equals what a loader of the loose file returns, and for orientations 5-8
  its shape is the index's height and width swapped (``decode="unchanged"`` and ``"bytes"``
  give the stored grid). Each such image gets an ``exif_orientation`` note. When the image is
  resized or re-encoded (which drops the tag), the orientation is applied first, so the stored
  pixels are upright and the index gives their size.
- Content that is another image format than its extension says (a PNG named ``.jpg``): packed
  by its sniffed format (the index's ``format``), with an ``extension_mismatch`` note.
- Decompression bombs: width x height is read from the header (JPEG SOF, PNG IHDR, BMP, WebP,
  TIFF, PNM) before anything is decoded; above ``Transform.max_pixels`` (``--max-pixels``) the
  image is refused as ``too_many_pixels``. A header we cannot parse leaves the limit to
  OpenCV's own (``OPENCV_IO_MAX_IMAGE_PIXELS``, 2**30 by default): such an image is
  ``undecodable``.
- How a source file is read (changed, vanished or replaced after the scan): `packer.source`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from typing import Any

from packer import problems as P
from packer.decode_check import Checked, Decoded, check_source, decode_source
from packer.job import ShardSettings
from packer.probe import exif_orientation, image_size, is_truncated, probe_header
from packer.problems import Note, Problem
from packer.records import Entry, Record
from packer.ring import ByteRing, worker_ring
from packer.source import open_source, read_all, read_source
from packer.transform import Transform, apply_orientation, apply_transform
from packer.writers.part import IndexRow, make_index_row
from readers.fastzlib import crc32
from readers.formats.images import SNIFF_BYTES, sniff_format

# The format each image extension names; a file whose content is another format gets a note.
EXTENSION_FORMATS = {
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".jpe": "jpeg",
    ".png": "png",
    ".bmp": "bmp",
    ".dib": "bmp",
    ".webp": "webp",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".pbm": "pnm",
    ".pgm": "pnm",
    ".ppm": "pnm",
}

# Formats whose EXIF orientation OpenCV applies with IMREAD_COLOR but not IMREAD_UNCHANGED.
_ORIENTED_FORMATS = ("jpeg", "png", "webp")


def __getattr__(name: str) -> Any:
    """``packer.prepare.cv2``: OpenCV, imported when first asked for (see `_decode_unchanged`)."""
    if name == "cv2":
        import cv2

        return cv2
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _decode_unchanged(data: bytes) -> Decoded:
    """`data` decoded as stored (`packer.decode_check`), sniffed again for its format."""
    return decode_source(data, sniff_format(data[:SNIFF_BYTES]) or "image")


def _check_unchanged(data: bytes, fmt: str) -> Checked:
    """`data` proven decodable as stored and measured (`packer.decode_check.check_source`)."""
    return check_source(data, fmt)


def _notes(
    rel: str,
    fmt: str,
    orientation: int | None,
    *,
    transformed: bool,
    warnings: tuple[str, ...] = (),
) -> tuple[Note, ...]:
    notes = [
        Note(rel, P.DECODE_WARNING, f"the {fmt.upper()} decoder warned: {w}; the image is whole")
        for w in warnings
    ]
    named = EXTENSION_FORMATS.get(os.path.splitext(rel)[1].lower())
    if named is not None and named != fmt:
        notes.append(
            Note(
                rel,
                P.EXTENSION_MISMATCH,
                f"the name says {named.upper()} but the content is {fmt.upper()}; packed as "
                f"{fmt.upper()} (the index's format)",
            )
        )
    if orientation is not None and orientation != 1:
        if transformed:
            message = (
                f"EXIF orientation {orientation} applied at pack time: the stored pixels are "
                "upright and the index gives their size"
            )
        else:
            swapped = " (height and width swapped)" if orientation >= 5 else ""
            message = (
                f"EXIF orientation {orientation} kept in the stored bytes: the index gives the "
                f"stored width and height; readers decoding rgb/bgr/gray apply the orientation "
                f"as cv2.imread does{swapped}"
            )
        notes.append(Note(rel, P.EXIF_ORIENTATION, message))
    return tuple(notes)


_KEEP = Transform()


def prepare_record(
    rel: str,
    path: str,
    label: Any,
    *,
    decode_check: bool = True,
    transform: Transform | None = None,
    root: str | None = None,
) -> Record | Problem:
    """Read `path`, check it is an image we can store, and describe it.

    Without a transform the stored bytes are the original bytes.  With `decode_check` the
    image is proven decodable as stored (without applying EXIF orientation) and measured, at
    the least cost that proves it (`packer.decode_check.check_source`: a JPEG decoded at 1/8
    scale, a PNG's stream inflated and checked, other formats decoded); without, JPEG and
    PNG are measured from their headers only.
    A transform always decodes, then resizes and re-encodes as asked.  Either way an image
    whose header gives more than ``transform.max_pixels`` pixels is refused undecoded; the
    policies for unusual images are in this module's docstring.
    """
    data = read_source(path, rel, root=root)
    if isinstance(data, Problem):
        return data
    return prepare_bytes(rel, data, label, decode_check=decode_check, transform=transform)


def prepare_bytes(
    rel: str,
    data: bytes,
    label: Any,
    *,
    decode_check: bool = True,
    transform: Transform | None = None,
) -> Record | Problem:
    """The checks and description of `prepare_record`, for bytes already read.

    ``packer convert`` gives this the stored bytes of a dataset it has no index of, so that
    they pass the same proof as a build's inputs (a decode, or with ``decode_check=False``
    the header probe only).
    """
    fmt = sniff_format(data[:SNIFF_BYTES])
    if fmt is None:
        return Problem(rel, P.NOT_IMAGE, "not an image (content matches no known image format)")
    if is_truncated(data, fmt):
        return Problem(rel, P.TRUNCATED, f"a {fmt.upper()} file cut short (no end marker)")
    t = transform or _KEEP
    size = image_size(data, fmt)
    if size is not None:
        width, height = size
        if width == 0 or height == 0:
            return Problem(rel, P.UNDECODABLE, f"the {fmt.upper()} header gives {width}x{height}")
        if t.max_pixels is not None and width * height > t.max_pixels:
            return Problem(
                rel,
                P.TOO_MANY_PIXELS,
                f"the {fmt.upper()} header gives {width}x{height} = {width * height} pixels, "
                f"above --max-pixels {t.max_pixels}; refused without decoding",
            )
    # OpenCV's IMREAD_UNCHANGED ignores the orientation of these formats (and applies TIFF's)
    orientation = exif_orientation(data, fmt) if fmt in _ORIENTED_FORMATS else None
    if not t.identity:
        decoded = _decode_unchanged(data)
        if decoded.image is None:
            return Problem(rel, P.UNDECODABLE, decoded.problem)
        image = decoded.image
        notes = _notes(rel, fmt, orientation, transformed=True, warnings=decoded.warnings)
        if orientation is not None:  # re-encoding drops the tag: store the pixels upright
            image = apply_orientation(image, orientation)
        stored, stored_fmt, pixels = apply_transform(image, fmt, t)
        channels = 1 if pixels.ndim == 2 else int(pixels.shape[2])
        return Record(
            rel,
            label,
            stored,
            stored_fmt,
            int(pixels.shape[1]),
            int(pixels.shape[0]),
            channels,
            crc32(stored),
            notes,
            t.compression if stored_fmt == "raw" else None,
        )
    warnings: tuple[str, ...] = ()
    dims: tuple[int, int, int] | None
    if decode_check:
        checked = _check_unchanged(data, fmt)
        if checked.dims is None:
            return Problem(rel, P.UNDECODABLE, checked.problem)
        dims, warnings = checked.dims, checked.warnings
    else:
        dims = probe_header(data, fmt)
    if dims is None:
        decoded = _decode_unchanged(data)
        if decoded.image is None:
            return Problem(rel, P.UNDECODABLE, decoded.problem)
        image, warnings = decoded.image, decoded.warnings
        channels = 1 if image.ndim == 2 else int(image.shape[2])
        dims = (int(image.shape[1]), int(image.shape[0]), channels)
    notes = _notes(rel, fmt, orientation, transformed=False, warnings=warnings)
    width, height, channels = dims
    return Record(rel, label, data, fmt, width, height, channels, crc32(data), notes)


Prepared = tuple[Record | Problem, IndexRow | None]
"""An entry read, checked and transformed, with its index row when that was made already
(in a process pool, beside the reading)."""

_BATCH = 256  # images per task sent to a pool process: amortises the IPC (fewer results
# for the pool's threads in the writing process to unpickle: 64 cost them 0.28 s per 12,000)


def prepare_entries(
    entries: list[Entry],
    settings: ShardSettings,
    *,
    pool: Any | None = None,
    in_flight: int = 1,
    ring: ByteRing | None = None,
) -> Iterator[Prepared]:
    """Each entry read, checked and transformed (`prepare_record`), in entry order.

    Without `pool`, in this process.  With `pool` (a ``multiprocessing`` pool), in batches
    there while the caller writes; at most `in_flight` batches are out at once, so memory
    stays bounded whatever the tree size, and results come back in order, so the output is
    identical for any number of processes.  Original bytes come back through `ring` (the
    pool's `packer.ring.ByteRing`, with at least `in_flight` slots) where they fit, else
    they are read again here (`restore_bytes`).
    """
    root = os.path.realpath(settings.src)
    if pool is None:
        for e in entries:
            item = prepare_record(
                e.file.rel,
                e.file.path,
                e.label,
                decode_check=settings.decode_check,
                transform=settings.transform,
                root=root,
            )
            yield item, None
        return
    tasks = [(e.file.rel, e.file.path, e.label) for e in entries]
    batches = (tasks[i : i + _BATCH] for i in range(0, len(tasks), _BATCH))
    strip = settings.transform.identity  # original bytes: not piped back (see packer.ring)
    if ring is not None and ring.slots < in_flight:
        ring = None
    pending: deque[tuple[Any, list[tuple[str, str, Any]], int | None]] = deque()

    def collect() -> list[Prepared]:
        result, batch, slot = pending.popleft()
        prepared, lengths = result.get()
        if slot is not None and lengths is not None:
            assert ring is not None
            for n, data in enumerate(ring.take(slot, lengths)):  # before the slot is reused
                item, row = prepared[n]  # (the CRC: a slot mixed up would not go unseen)
                if data and isinstance(item, Record) and crc32(data) == item.crc32:
                    prepared[n] = (_with_data(item, data), row)
        return [
            (restore_bytes(item, path, root=root), row)
            for (item, row), (_, path, _) in zip(prepared, batch, strict=True)
        ]

    for number, batch in enumerate(batches):
        slot = number % ring.slots if ring is not None and strip else None
        args = (batch, settings.decode_check, settings.transform, strip, root, slot)
        pending.append((pool.apply_async(_prepare_batch, args), batch, slot))
        if len(pending) >= in_flight:
            yield from collect()
    while pending:
        yield from collect()


def _with_data(r: Record, data: bytes) -> Record:
    """`r` with other bytes (the constructor called directly: dataclasses.replace took 4 us)."""
    return Record(
        r.rel,
        r.label,
        data,
        r.format,
        r.width,
        r.height,
        r.channels,
        r.crc32,
        r.notes,
        r.compression,
    )


def _prepare_batch(
    batch: list[tuple[str, str, Any]],
    decode_check: bool,
    transform: Transform,
    strip: bool = False,
    root: str | None = None,
    slot: int | None = None,
) -> tuple[list[Prepared], list[int] | None]:
    """Prepare each image of `batch` in a pool process, with its index row.

    The index row is encoded here, not in the writing process; with `strip`, the bytes are
    left out of the results: copied into `slot` of this process's `packer.ring.ByteRing`
    where they fit (their lengths come back, 0 where left out), else read again by the
    writer.
    """
    results: list[Prepared] = []
    for rel, path, label in batch:
        item = prepare_record(
            rel, path, label, decode_check=decode_check, transform=transform, root=root
        )
        results.append((item, make_index_row(item) if isinstance(item, Record) else None))
    if not strip:
        return results, None
    ring = worker_ring() if slot is not None else None
    lengths = None
    if ring is not None and slot is not None:
        lengths = ring.put(slot, [i.data if isinstance(i, Record) else b"" for i, _ in results])
    stripped: list[Prepared] = [
        (_with_data(item, b"") if isinstance(item, Record) else item, row) for item, row in results
    ]
    return stripped, lengths


def restore_bytes(
    item: Record | Problem, path: str, *, root: str | None = None
) -> Record | Problem:
    """A record whose bytes a pool process left out gets them again, from the page cache.

    Sending every image through a pipe cost more than reading it twice: with the bytes
    piped back, two workers were only 1.2x one. The CRC-32 the worker computed proves the
    bytes read now are the bytes it checked.
    """
    if not isinstance(item, Record) or item.data:
        return item
    fd = open_source(path, item.rel, root=root)  # as the worker opened it (within SRC)
    if isinstance(fd, Problem):
        if fd.reason == P.OUTSIDE_SRC:
            return fd
        return Problem(item.rel, P.CHANGED, f"cannot be read again after its check ({fd.message})")
    try:  # a plain read: the worker already vetted the file (regular, readable, an image)
        got = read_all(fd, os.fstat(fd).st_size)
    except OSError as exc:
        return Problem(item.rel, P.CHANGED, f"cannot be read again after its check ({exc})")
    finally:
        os.close(fd)
    if crc32(got) != item.crc32:
        return Problem(item.rel, P.CHANGED, "changed between its check and its packing")
    return _with_data(item, got)
