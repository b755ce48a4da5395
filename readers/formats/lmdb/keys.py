"""PaddleOCR's LMDB key layout, the file names of an environment, and how a label is stored.

The keys are ``num-samples``, ``image-%09d``, ``label-%09d`` and ``wh-%09d`` (counting from 1
within a shard); ``wh-%09d`` holds ``"W_H"``, the stored image's width and height in ASCII, as
PaddleOCR's ``RatioDataSet`` reads it to bucket by aspect ratio without decoding.
"""

from __future__ import annotations

import json
from typing import Any

NUM_SAMPLES_KEY = b"num-samples"
WH_PREFIX = b"wh-"
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"


def image_key(local: int) -> bytes:
    """The key of the image of the `local`-th record (1-based) of a shard."""
    return b"image-%09d" % local


def label_key(local: int) -> bytes:
    """The key of the label of the `local`-th record (1-based) of a shard."""
    return b"label-%09d" % local


def wh_key(local: int) -> bytes:
    """The key of the width and height of the `local`-th record (1-based) of a shard."""
    return b"wh-%09d" % local


def encode_wh(width: int, height: int) -> bytes:
    """Return a ``wh-%09d`` value: ``b"W_H"``, the width and height in ASCII decimal."""
    return b"%d_%d" % (width, height)


def parse_wh(raw: bytes) -> tuple[int, int] | None:
    """Return the (width, height) of a ``wh-%09d`` value, or None when it is not ``W_H``.

    The value is read as PaddleOCR's ``RatioDataSet`` reads it: two decimal numbers joined by
    ``_`` (surrounding whitespace allowed); anything else is None.
    """
    parts = raw.strip().split(b"_")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def encode_label(label: Any) -> bytes:
    """Return a label as stored in LMDB.

    A class id is stored as its decimal string, text as itself, anything structured as
    compact JSON, and ``None`` as the empty string.
    """
    if label is None:
        return b""
    if isinstance(label, bool):
        return json.dumps(label).encode()
    if isinstance(label, int):
        return str(label).encode()
    if isinstance(label, str):
        return label.encode("utf-8")
    return json.dumps(label, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
