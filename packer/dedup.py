"""``packer build --dedup``: drop source files whose bytes equal an earlier file's, before planning.

The check runs once, in the main process, before the entries are cut into shards, so every
shard task (local or Ray, any ``--workers``) sees the same entries, and the index and shards
stay consistent: a dropped file is never read by a task. Files are compared by size first
(the stat the plan makes anyway); only files that share a size are read and hashed (BLAKE2b),
so a tree of distinct sizes costs no reads. Of equal files, the first in sorted path order is
kept; the others become ``duplicate_content`` problems naming it. Transforms are
deterministic, so equal sources give equal stored records under any ``--resize`` or
``--encode``; two different sources that happen to encode to the same stored bytes are not
merged (``packer dupes`` finds those afterwards).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from packer.problems import Problem
from packer.records import Entry

DUPLICATE_CONTENT = "duplicate_content"  # the same bytes as an earlier source file
_CHUNK = 1 << 20


def _digest(path: str) -> str | None:
    """BLAKE2b of the file at `path`, or None when it cannot be read (the task reports it)."""
    h = hashlib.blake2b(digest_size=20)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def drop_duplicates(
    entries: list[Entry], sizes: list[int]
) -> tuple[list[Entry], list[int], list[Problem]]:
    """`entries` (and their `sizes`) without the files whose bytes an earlier file has.

    Returns the kept entries in their order, their sizes, and one ``duplicate_content``
    problem per dropped file. Empty and unreadable files are left for the build to report.
    """
    by_size: dict[int, list[int]] = defaultdict(list)
    for k, size in enumerate(sizes):
        if size > 0:
            by_size[size].append(k)
    drop: dict[int, str] = {}
    for ks in by_size.values():
        if len(ks) < 2:
            continue
        first: dict[str, int] = {}
        for k in sorted(ks, key=lambda k: entries[k].file.rel):  # first in path order wins
            digest = _digest(entries[k].file.path)
            if digest is None:
                continue
            if digest in first:
                drop[k] = entries[first[digest]].file.rel
            else:
                first[digest] = k
    problems = [
        Problem(
            entries[k].file.rel,
            DUPLICATE_CONTENT,
            f"the same bytes as {kept} (--dedup keeps the first in path order)",
        )
        for k, kept in sorted(drop.items())
    ]
    kept_entries = [e for k, e in enumerate(entries) if k not in drop]
    kept_sizes = [s for k, s in enumerate(sizes) if k not in drop]
    return kept_entries, kept_sizes, problems
