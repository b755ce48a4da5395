"""Hints for label files whose paths do not fit SRC, found from the ``missing`` problems."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from packer.problems import MISSING, Problem

SAMPLE = 100
"""Prefixed missing paths checked against SRC, at most."""


def prefix_hint(src: Path, problems: Sequence[Problem]) -> str | None:
    """A hint when most ``missing`` label paths start with SRC's own name, else None.

    PaddleOCR's lists are often written from SRC's parent (``imgs/a.jpg`` with SRC ``imgs``);
    label paths are relative to SRC, so those entries are all missing. The hint is given when
    at least half of the missing entries start with ``<SRC's name>/`` and name a file under
    SRC once that prefix is dropped.
    """
    missing = [p.path for p in problems if p.reason == MISSING]
    prefix = f"{src.name}/"
    if not missing or not src.name:
        return None
    prefixed = [path for path in missing if path.startswith(prefix)]
    if not prefixed or 2 * len(prefixed) < len(missing):
        return None
    tried = prefixed[:SAMPLE]  # a stat each: enough to be sure, cheap for a million entries
    if 2 * sum((src / path[len(prefix) :]).is_file() for path in tried) < len(tried):
        return None
    count = f"{len(prefixed)} label path{'s' if len(prefixed) != 1 else ''}"
    return (
        f"hint: {count} start with {prefix!r} (SRC's own name) and are missing; label paths "
        f"are relative to SRC: pass the parent folder as SRC ({src.parent}) or drop the prefix"
    )
