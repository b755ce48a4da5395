"""zlib's inflate and CRC-32, from zlib-ng where it is installed (the same streams, faster).

zlib-ng reads and writes exactly the streams zlib does and computes the same CRC-32, with SIMD
code: on 96x96 PNGs of noise it inflates in about two thirds of zlib 1.2's time, which is most
of the build's decode check of a PNG. Its CRC-32 takes 0.06-0.13 ms per MB here against
CPython's 0.3-0.5 (0.22 vs 2.12 us for a 5 KB record): the CRC of every stored image at build
time, of every record read by range or with ``verify_crc=True``, and of every staged object.
Without the package (a dependency, but an environment may predate it) the standard library's
zlib gives the same results, slower; `ACCELERATED` says which is in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ACCELERATED", "crc32", "decompressobj", "error"]

if TYPE_CHECKING:  # the same API: typed as the standard library's
    from zlib import crc32, decompressobj, error

    ACCELERATED: bool
else:
    try:
        from zlib_ng.zlib_ng import crc32, decompressobj, error
    except ImportError:  # not installed: the same answers, slower
        from zlib import crc32, decompressobj, error

        ACCELERATED = False
    else:
        ACCELERATED = True
