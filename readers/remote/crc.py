"""CRC-32 (zlib's) of the bytes read, with zlib-ng's when it is installed.

Every record read by range is checked against the index's CRC-32, and every staged object as it
arrives; so is every record a dataset opened with ``verify_crc=True`` reads. CPython's
``zlib.crc32`` takes 0.3-0.5 ms per MB here (records of 5 KB: 0.49); zlib-ng's (a dependency,
and in the ``s3`` extra) computes the same value with carry-less multiplication in 0.06-0.13 ms
per MB. Without it, ``zlib.crc32`` is used.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

__all__ = ["ACCELERATED", "crc32"]

crc32: Callable[..., int]
"""``crc32(data, value=0)``: zlib's CRC-32 of `data` continuing from `value`."""

try:
    from zlib_ng import zlib_ng as _zlib_ng
except ImportError:  # the s3 extra's accelerator is optional
    crc32 = zlib.crc32
    ACCELERATED = False
else:
    crc32 = _zlib_ng.crc32
    ACCELERATED = True
