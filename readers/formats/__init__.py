"""Byte layouts of packed datasets, defined once and shared by the writer and the readers.

``REGISTRY`` holds one `ShardFormat` object per format, keyed by the ``format`` field of
meta.json; generic code asks these objects instead of naming a format. Nothing in this
package imports paddle, so `packer` can use it without pulling in the training stack.
"""

from __future__ import annotations

from readers.formats import lmdb, recordio, webdataset
from readers.formats.base import ShardFormat

REGISTRY: dict[str, ShardFormat] = {
    lmdb.FORMAT.name: lmdb.FORMAT,
    recordio.FORMAT.name: recordio.FORMAT,
}
"""Every format readers can open, in the order bare paths are tried; the first is the
default of ``packer build``."""

READ_ONLY: dict[str, ShardFormat] = {webdataset.FORMAT.name: webdataset.FORMAT}
"""Formats readers open only as bare copies (``open_dataset``, ``packer convert``), which packer
does not write datasets in: no writer, no meta.json, no ``packer verify`` checks."""

BARE_FORMATS: dict[str, ShardFormat] = {**REGISTRY, **READ_ONLY}
"""Every format a bare copy of may be opened, in the order bare paths are tried."""

FORMATS: tuple[str, ...] = tuple(REGISTRY)
"""The registered format names."""


def get_format(name: str) -> ShardFormat | None:
    """The registered format called `name`, or None."""
    return REGISTRY.get(name)


__all__ = ["BARE_FORMATS", "FORMATS", "READ_ONLY", "REGISTRY", "ShardFormat", "get_format"]
