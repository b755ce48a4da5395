"""Re-read a packed dataset, or a bare copy of a registered format, through readers.formats:
counts, keys, offsets, checksums, labels, decodability.

The checks every format shares are in ``common``; each format's own are in
``packer/verify/<fmt>.py``, found through the registry (``packer.formats``).
"""

from __future__ import annotations

from pathlib import Path

from packer.verify.common import Report, check_shard_table, shard_rows
from readers.errors import DatasetFormatError
from readers.formats.layout import META_NAME
from readers.meta import load_meta

__all__ = ["verify", "verify_packed"]


def verify_packed(root: Path, *, deep: bool, report: Report) -> None:
    """Check a dataset written by ``packer build``; call `report` once per problem."""
    from packer.formats import get_pack_format

    try:
        meta = load_meta(root)
    except DatasetFormatError as exc:
        report(str(exc))
        return
    fmt = get_pack_format(meta["format"])
    if fmt is None:
        report(f"{META_NAME}: format {meta['format']!r} cannot be verified by this version")
        return
    bounds = check_shard_table(root, meta, report)
    rows = shard_rows(root, meta, bounds, report)
    fmt.checks().verify_packed(root, meta, rows, deep=deep, report=report)


def verify(path: str | Path, *, deep: bool = False) -> list[str]:
    """All problems found in the dataset at `path` (an empty list when it is intact)."""
    from packer.formats import FORMATS

    root = Path(path)
    found: list[str] = []
    if (root / META_NAME).exists():
        verify_packed(root, deep=deep, report=found.append)
        return found
    for fmt in FORMATS.values():
        bare = fmt.reader.find_bare(root)
        if bare is not None:
            fmt.checks().verify_bare(bare, deep=deep, report=found.append)
            return found
    if not root.exists():
        found.append(f"{root}: does not exist")
    else:
        hints = [f"a packed dataset ({META_NAME})"] + [f.reader.bare_hint for f in FORMATS.values()]
        found.append(f"{root}: neither " + ", ".join(hints[:-1]) + " nor " + hints[-1])
    return found
