"""A bare MXNet ``.rec`` (with or without its ``.idx``): which records are its samples.

With an ``.idx``, the samples are its records in file order; when the record of key 0 is an
InsightFace meta record (flag > 0, no image bytes; ``label[0]`` = 1 + the number of images,
``label[1]`` the end of the identity records that follow the images), the samples are keys
``1 .. label[0] - 1``, then every other record that holds image bytes (in ``.idx`` order: an
image outside the range the header names is a sample too, never dropped). Records with a label
vector and no image bytes (flag > 0: InsightFace's meta and identity records) are metadata,
not samples. Without an ``.idx`` the whole file is scanned, with the same rule. A record with
neither image bytes nor a label vector is a sample, which conversion reports as ``empty``.
Nothing here imports paddle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from math import isfinite
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import DatasetFormatError
from readers.formats.base import StoredItem, StoredProblem, StoredRecords
from readers.formats.recordio.idx import read_idx
from readers.formats.recordio.images import cut_short, header_at, unpack_image_record
from readers.formats.recordio.records import RecordIOError, read_record_at, scan_offsets


def int_labels(values: list[Any]) -> np.ndarray | None:
    """The labels as int64 when every one is a single integral number, else None."""
    if not values or not all(isinstance(v, float) and v.is_integer() for v in values):
        return None
    return np.asarray(values, dtype=np.int64)


def _metadata(buf: Any, offset: int) -> bool:
    """Whether the record at `offset` is metadata: a label vector (flag > 0), no image bytes.

    A record that does not parse is not metadata: conversion reports it when it reads it.
    """
    try:
        header, _, image_len = header_at(buf, offset)
    except RecordIOError:
        return False
    return header.flag > 0 and image_len == 0


def insightface_images(
    idx: Path,
    keys: np.ndarray,
    offsets: np.ndarray,
    meta_at: int,
    meta_label: np.ndarray,
    buf: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the keys and offsets of the samples of a ``.rec`` with an InsightFace meta record.

    Those are keys ``1 .. label[0] - 1``, then (with `buf`, the ``.rec`` mapped) every other
    record but metadata (`_metadata`: the identity records) in ``.idx`` order; without a
    usable range, every key but the meta record's.

    Raises:
        DatasetFormatError: a key of the range is not in the ``.idx``.
    """
    end = float(meta_label[0]) if meta_label.size else 0.0
    if not (end.is_integer() and 1 <= end <= len(keys)):
        return np.delete(keys, meta_at), np.delete(offsets, meta_at)
    wanted = np.arange(1, int(end), dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys[order], wanted)
    found = (pos < len(keys)) & (keys[order][np.minimum(pos, len(keys) - 1)] == wanted)
    if not found.all():
        missing = int(wanted[np.argmin(found)])
        raise DatasetFormatError(
            f"{idx}: the meta record (key 0) announces images with keys 1..{int(end) - 1}, "
            f"but key {missing} is not in the index"
        )
    chosen = order[pos]
    if buf is None:
        return wanted, offsets[chosen]
    outside = np.ones(len(keys), dtype=bool)
    outside[chosen] = False
    outside[meta_at] = False
    more = [int(i) for i in np.flatnonzero(outside) if not _metadata(buf, int(offsets[i]))]
    chosen = np.concatenate([chosen, np.asarray(more, dtype=np.int64)])
    return keys[chosen], offsets[chosen]


def scan_images(rec: Path, buf: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Return ``(keys, offsets, int labels or None)`` of the image records of a ``.rec``.

    For a ``.rec`` without ``.idx``: found by reading the whole file (metadata records, a label
    vector without image bytes, are skipped).
    """
    try:
        keys: list[int] = []
        kept: list[int] = []
        labels: list[Any] = []
        for offset in scan_offsets(buf).tolist():
            header, label, image_len = header_at(buf, offset)
            if header.flag > 0 and image_len == 0:  # a meta or identity record (InsightFace)
                continue
            kept.append(offset)
            keys.append(header.id)
            labels.append(label)
    except RecordIOError as exc:
        raise DatasetFormatError(f"{rec}: not a readable RecordIO file ({exc})") from exc
    if not kept:
        raise DatasetFormatError(f"{rec}: holds no image records")
    key_array = np.asarray(keys, dtype=np.uint64).astype(np.int64)
    return key_array, np.asarray(kept, dtype=np.int64), int_labels(labels)


def indexed_images(
    rec: Path, idx: Path, buf: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Return ``(keys, offsets, InsightFace meta label or None)`` of a ``.rec``'s samples.

    The ``.idx`` is `idx`; `buf` is the ``.rec`` mapped.

    Raises:
        DatasetFormatError: the ``.idx`` is unreadable or empty, points past the ``.rec``, the
            last record is cut short, or the meta record does not parse.
    """
    try:
        keys, offsets = read_idx(idx)
    except (RecordIOError, OSError) as exc:
        raise DatasetFormatError(f"{idx}: cannot read the index ({exc})") from exc
    if len(keys) == 0:
        raise DatasetFormatError(f"{idx}: no records listed")
    size = len(buf)
    if int(offsets.max()) >= size:
        at = int(np.argmax(offsets >= size))
        raise DatasetFormatError(
            f"{idx}: key {int(keys[at])} has offset {int(offsets[at])}, past the end of "
            f"{rec} ({size} bytes); is the .rec cut short or the .idx from another file?"
        )
    last = int(offsets.max())
    cut = cut_short(buf, last)
    if cut is not None:
        raise DatasetFormatError(
            f"{rec}: the last record (offset {last}, from {idx}) {cut}; is the .rec cut short?"
        )
    meta_label = None
    zero = np.flatnonzero(keys == 0)
    if zero.size:
        try:
            header, label, image_len = header_at(buf, int(offsets[zero[0]]))
        except RecordIOError as exc:
            raise DatasetFormatError(
                f"{rec}: the record of key 0 at offset {int(offsets[zero[0]])} does not "
                f"parse ({exc})"
            ) from exc
        if header.flag > 0 and image_len == 0:
            meta_label = np.asarray(label, dtype=np.float32)
            keys, offsets = insightface_images(idx, keys, offsets, zero[0], meta_label, buf)
    return keys, offsets, meta_label


def _stored_label(label: Any, ints: bool) -> Any:
    """Return a header label as a dataset label.

    A class id when every label is integral, a float, or a list of floats (flag > 0).
    """
    if isinstance(label, np.ndarray):
        return [float(v) for v in label.tolist()]
    return int(label) if ints and isfinite(label) else float(label)


def bare_records(pair: tuple[Path, Path | None], buf: Any) -> StoredRecords:
    """The image records of a bare ``.rec`` (`buf`: it mapped) as stored, for conversion.

    Labels come from the headers: class ids (int) when every label is one integral float,
    else floats, and a list of floats for several labels (flag > 0).
    """
    rec, idx = pair
    if idx is None:
        keys, offsets, _ = scan_images(rec, buf)
    else:
        keys, offsets, _ = indexed_images(rec, idx, buf)
    sizes: list[int] = []
    labels: list[Any] = []
    try:
        for offset in offsets.tolist():
            _, label, image_len = header_at(buf, offset)
            sizes.append(image_len)
            labels.append(label)
    except RecordIOError as exc:
        raise DatasetFormatError(f"{rec}: a record does not parse ({exc})") from exc
    # NaN and infinities are refused by the conversion; they do not make the rest floats
    ints = int_labels([v for v in labels if not (isinstance(v, float) and not isfinite(v))])
    kept = [_stored_label(label, ints is not None) for label in labels]

    def read(start: int, stop: int) -> Iterator[StoredItem]:
        for i in range(start, stop):
            try:
                payload, _ = read_record_at(buf, int(offsets[i]))
                _, _, image = unpack_image_record(payload)
            except RecordIOError as exc:
                yield f"the record at offset {int(offsets[i])} does not parse ({exc})"
                continue
            if len(image) == 0:
                yield StoredProblem(
                    "empty", f"the record at offset {int(offsets[i])} holds no image bytes"
                )
                continue
            yield bytes(image), kept[i]

    files = [rec] if idx is None else [rec, idx]
    names = [f"{rec.name}:{int(k)}" for k in keys.tolist()]
    return StoredRecords(files, names, sizes, read, label_source="IRHeader")


def read_stored(buf: Any, offsets: Sequence[int]) -> Iterator[bytes]:
    """The image bytes of the records at `offsets` of a packed shard (`buf`: its ``.rec``)."""
    for offset in offsets:
        payload, _ = read_record_at(buf, int(offset))
        yield bytes(unpack_image_record(payload)[2])
