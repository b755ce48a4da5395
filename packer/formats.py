"""The packer-side format registry: one line per format, its writer class and its checks.

The readers-side object (byte layout, detection, opening) comes from ``readers.formats``
under the same name; ``packer build`` takes the writer from here and ``packer verify`` the
checks. The checks module (``packer.verify.<fmt>``) is imported only when a dataset is
verified, so building never loads it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from packer.writers.base import ShardWriter
from packer.writers.lmdb import LmdbShardWriter
from packer.writers.recordio import RecordIOShardWriter
from readers.formats import REGISTRY as READERS
from readers.formats.base import ShardFormat


@dataclass(frozen=True)
class PackFormat:
    """What packer needs of one registered format."""

    name: str
    writer: type[ShardWriter]
    checks_module: str
    """``packer.verify.<fmt>``: ``verify_packed(root, meta, deep=, report=, note=)`` and
    ``verify_bare(found, deep=, report=)`` (found: what ``ShardFormat.find_bare`` returned)."""

    @property
    def reader(self) -> ShardFormat:
        """The readers-side format object of the same name."""
        return READERS[self.name]

    def checks(self) -> Any:
        """The module of this format's ``packer verify`` checks."""
        return importlib.import_module(self.checks_module)


FORMATS: dict[str, PackFormat] = {
    fmt.name: fmt
    for fmt in (
        PackFormat("lmdb", LmdbShardWriter, "packer.verify.lmdb"),
        PackFormat("recordio", RecordIOShardWriter, "packer.verify.recordio"),
    )
}
"""Every format packer can write and verify, in the readers registry's order."""

DEFAULT_FORMAT = next(iter(FORMATS))


def get_pack_format(name: str) -> PackFormat | None:
    """The registered format called `name`, or None."""
    return FORMATS.get(name)


def _check_registries() -> None:
    if list(FORMATS) != list(READERS):
        raise RuntimeError(
            f"packer.formats registers {list(FORMATS)} but readers.formats {list(READERS)}: "
            "a format is registered on both sides, in the same order"
        )
    for fmt in FORMATS.values():
        if getattr(fmt.writer, "format", fmt.name) != fmt.name:
            raise RuntimeError(
                f"{fmt.writer.__name__} writes {fmt.writer.format!r}, not {fmt.name}"
            )


_check_registries()
