"""PaddleOCR's LMDB key layout, the file names of an environment, and how a label is stored.

The keys are ``num-samples``, ``image-%09d`` and ``label-%09d`` (counting from 1 within a
shard).
"""

from __future__ import annotations

import json
from typing import Any

NUM_SAMPLES_KEY = b"num-samples"
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"


def image_key(local: int) -> bytes:
    """The key of the image of the `local`-th record (1-based) of a shard."""
    return b"image-%09d" % local


def label_key(local: int) -> bytes:
    """The key of the label of the `local`-th record (1-based) of a shard."""
    return b"label-%09d" % local


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
