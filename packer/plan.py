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

from packer.errors import PackerError
from packer.records import Entry
from readers.durable import write_durably
from readers.formats.layout import ERRORS_NAME, INDEX_NAME

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


_ENTRY_JSON = json.JSONEncoder(default=str)  # json.dumps' output, without a new encoder per entry


def plan_digest(entries: list[Entry], sizes: list[int], options: dict[str, Any]) -> str:
    """A digest of everything that decides the output: entries, labels, sizes, options."""
    digest = hashlib.sha256()
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    encode = _ENTRY_JSON.encode
    for entry, size in zip(entries, sizes, strict=True):
        digest.update(encode([entry.file.rel, entry.label, entry.labelled, size]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def save_plan(root: Path, digest: str, shards: list[ShardPlan]) -> None:
    """Record the plan in the build directory `root` (what ``--resume`` compares)."""
    plan = {"digest": digest, "shards": [[s.start, s.stop] for s in shards]}
    write_durably(root / PLAN_NAME, json.dumps(plan))


def load_plan_digest(root: Path) -> str | None:
    """The digest of the plan saved in an unfinished build directory, or None."""
    try:
        with open(root / PLAN_NAME, encoding="utf-8") as f:
            return str(json.load(f)["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _recorded_paths(out: Path) -> set[str] | None:
    """The source paths a finished dataset accounts for: packed (index) or skipped (errors)."""
    paths: set[str] = set()
    try:
        for name in (INDEX_NAME, ERRORS_NAME):
            with open(out / name, encoding="utf-8") as f:
                paths.update(str(json.loads(line)["path"]) for line in f if line.strip())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return paths


def _some(paths: set[str]) -> str:
    shown = ", ".join(sorted(paths)[:3])
    return shown + (", ..." if len(paths) > 3 else "")


OMITTED_DEFAULTS = {"compress": "none"}
"""Options that meta.json records only when they differ from their default (so a build that
does not use them is byte for byte what a packer without them built): the default stands
for an absent key when two builds are compared."""


def complete_differences(
    out: Path, meta: dict[str, Any], digest: str, options: dict[str, Any], entries: list[Entry]
) -> list[str]:
    """Say how a finished dataset `out` differs from the build planned now.

    `meta` is its meta.json; the build is given by the plan `digest`, output `options` and
    label-plan `entries`. Empty when it is the same.

    Each difference is a phrase a user can act on: the option, its value in OUT and now;
    or which source files were added or removed; or that sources changed in size or label.
    """
    if meta.get("plan_digest") == digest:
        return []
    old_options = {**OMITTED_DEFAULTS, **dict(meta.get("options") or {})}
    new_options = {**OMITTED_DEFAULTS, **_json_value(options)}
    differences = [
        f"--{key.replace('_', '-')} is {old_options.get(key, '(not recorded)')!r} in OUT, "
        f"{new_options.get(key)!r} now"
        for key in sorted(set(old_options) | set(new_options))
        if key in new_options and old_options.get(key) != new_options.get(key)
    ]
    if differences:
        return differences
    if "plan_digest" not in meta:
        return ["OUT records no plan digest (it was built by an older packer)"]
    recorded = _recorded_paths(out)
    if recorded is not None:
        now = {e.file.rel for e in entries}
        if now - recorded:
            differences.append(
                f"the sources changed: {len(now - recorded)} file(s) added "
                f"({_some(now - recorded)})"
            )
        if recorded - now:
            differences.append(
                f"the sources changed: {len(recorded - now)} file(s) removed "
                f"({_some(recorded - now)})"
            )
    return differences or ["the sources changed: files were modified (their sizes) or relabelled"]


class OutputDiffersError(PackerError):
    """``--resume`` on a finished OUT that was built from another plan or other options."""

    def __init__(self, out: str, differences: list[str]) -> None:
        super().__init__(
            f"{out} is already complete, but not as this build would make it: "
            + "; ".join(differences)
            + ". Use --overwrite to rebuild it, or another OUT"
        )
        self.out = out
        self.differences = differences
