"""Shard planning: which inputs go into which shard, decided before any image is read.

A plan is a pure function of the label plan (entries in order), the source files' sizes and
the build options, so a resumed build, a local build and a Ray build of the same inputs
cut the same shards.  The plan is saved in the build directory; ``--resume`` keeps the
finished shards of a build whose plan is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.records import Entry

PLAN_NAME = "plan.json"
MERGING_NAME = "merging"


@dataclass(frozen=True)
class ShardPlan:
    """Planned shard `number`: entries ``[start, stop)`` of the label plan."""

    number: int
    start: int
    stop: int


def source_sizes(entries: list[Entry]) -> list[int]:
    """The size of each entry's file now (0 when it cannot be read: it will be reported)."""
    sizes = []
    for entry in entries:
        try:
            sizes.append(os.stat(entry.file.path).st_size)
        except OSError:
            sizes.append(0)
    return sizes


def plan_shards(sizes: list[int], shard_size: int) -> list[ShardPlan]:
    """Cut the entries into shards of at most `shard_size` source bytes (at least one each).

    Shards are planned from the sizes of the source files: a shard of re-encoded or
    partly bad inputs stores fewer bytes than planned, never more than one file over.
    """
    shards: list[ShardPlan] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > shard_size:
            shards.append(ShardPlan(len(shards), start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        shards.append(ShardPlan(len(shards), start, len(sizes)))
    return shards


def plan_digest(entries: list[Entry], sizes: list[int], options: dict[str, Any]) -> str:
    """A digest of everything that decides the output: entries, labels, sizes, options."""
    digest = hashlib.sha256()
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    for entry, size in zip(entries, sizes, strict=True):
        digest.update(
            json.dumps([entry.file.rel, entry.label, entry.labelled, size], default=str).encode()
        )
        digest.update(b"\n")
    return digest.hexdigest()


def save_plan(root: Path, digest: str, shards: list[ShardPlan]) -> None:
    path = root / PLAN_NAME
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"digest": digest, "shards": [[s.start, s.stop] for s in shards]}, f)
        f.flush()
        os.fsync(f.fileno())


def load_plan_digest(root: Path) -> str | None:
    """The digest of the plan saved in an unfinished build directory, or None."""
    try:
        with open(root / PLAN_NAME, encoding="utf-8") as f:
            return str(json.load(f)["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
