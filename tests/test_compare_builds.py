"""A build with this tree is byte-identical to one with the revision the layout refactoring
started from, or for LMDB the first that writes ``wh-`` keys (``scripts/compare_builds.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_builds.py"


def _has_revision(rev: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


@pytest.mark.slow
def test_builds_are_byte_identical_to_the_base_revision() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from compare_builds import revisions
    finally:
        sys.path.remove(str(SCRIPT.parent))
    for rev in set(revisions(None).values()):
        if not _has_revision(rev):
            pytest.skip(f"not a git checkout holding {rev}")
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "identical"
