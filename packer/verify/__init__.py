"""Re-read a packed dataset, or a bare copy of a registered format, and report problems.

Through readers.formats: counts, keys, offsets, checksums, labels, decodability.

The checks every format shares are in ``common``; each format's own are in
``packer/verify/<fmt>.py``, found through the registry (``packer.formats``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from packer.engines import progress_bar
from packer.feedback import test_delay
from packer.metadata import meta_problems
from packer.verify.common import Report, Rows, check_entries, check_shard_table, shard_rows
from packer.verify.split import sibling_problems
from readers.errors import DatasetFormatError, DatasetRebuiltError
from readers.formats.layout import META_NAME
from readers.io.readahead import FileAhead
from readers.meta import load_meta
from readers.not_dataset import explain_not_dataset

__all__ = ["verify", "verify_packed"]


def verify_packed(root: Path, *, deep: bool, report: Report, note: Report | None = None) -> None:
    """Check a dataset written by ``packer build``; call `report` once per problem.

    `note` receives what is worth knowing but is no problem (LMDB shards built by a packer
    older than the ``wh-`` keys).
    """
    from packer.formats import get_pack_format

    try:
        meta = load_meta(root)
    except DatasetFormatError as exc:
        report(str(exc))
        return
    for problem in meta_problems(meta):
        report(f"{META_NAME}: {problem}")
    for problem in sibling_problems(root, meta):
        report(problem)
    fmt = get_pack_format(meta["format"])
    if fmt is None:
        report(f"{META_NAME}: format {meta['format']!r} cannot be verified by this version")
        return
    if not check_entries(root, meta, fmt.reader, report):
        return  # a shard file is a FIFO, a device...: reading it would block
    bounds = check_shard_table(root, meta, report)
    rows = _read_ahead(root, meta, fmt.reader, shard_rows(root, meta, bounds, report))
    total = meta.get("num_samples")
    with progress_bar(total if isinstance(total, int) else 0, None, desc="verifying") as bar:
        try:
            fmt.checks().verify_packed(
                root, meta, _counted(rows, bar), deep=deep, report=report, note=note
            )
        except DatasetRebuiltError as exc:  # the rest would be checked against another build
            report(str(exc))


def _counted(rows: Rows, bar: Any) -> Rows:
    """Yield `rows`, moving `bar` every 64 of them (and at the end)."""
    delay = test_delay()
    count = 0
    for row in rows:
        if delay:
            time.sleep(delay)
        yield row
        count += 1
        if count == 64:
            bar.update(count)
            count = 0
    bar.update(count)


def _read_ahead(root: Path, meta: dict[str, Any], reader: Any, rows: Rows) -> Rows:
    """Yield `rows`, hinting each shard's data file ahead of the checks.

    The checks read the records in id order, through handles opened with the kernel's
    read-ahead off. Where a record lies is estimated from its place in the shard (records are
    written in id order).
    """
    ahead: dict[int, FileAhead | None] = {}
    for shard, row in rows:
        if shard not in ahead:
            try:
                path = reader.data_file(reader.shard_path(root, meta["shards"][shard]["name"]))
                ahead[shard] = FileAhead(path)
            except (OSError, KeyError, TypeError, ValueError):
                ahead[shard] = None
        hint = ahead[shard]
        if hint is not None:
            info = meta["shards"][shard]
            done = (int(row["id"]) - int(info["first"])) / max(1, int(info["count"]))
            hint.at(int(done * hint.size))
        yield shard, row


def verify(path: str | Path, *, deep: bool = False, notes: list[str] | None = None) -> list[str]:
    """All problems found in the dataset at `path` (an empty list when it is intact).

    Notes (facts worth knowing that are no problem) are appended to `notes` when given.
    """
    from packer.formats import FORMATS

    root = Path(path)
    found: list[str] = []
    if (root / META_NAME).exists():
        note = None if notes is None else notes.append
        verify_packed(root, deep=deep, report=found.append, note=note)
        return found
    for fmt in FORMATS.values():
        bare = fmt.reader.find_bare(root)
        if bare is not None:
            fmt.checks().verify_bare(bare, deep=deep, report=found.append)
            return found
    why = explain_not_dataset(root)  # missing, or a folder of images to pack first
    if why is not None:
        found.append(why)
    else:
        hints = [f"a packed dataset ({META_NAME})"] + [f.reader.bare_hint for f in FORMATS.values()]
        found.append(f"{root}: neither " + ", ".join(hints[:-1]) + " nor " + hints[-1])
    return found
