"""Build the same image tree with another revision of packer and with this tree, and compare the
outputs byte for byte: a refactoring must not change a single byte on disk.

The tree is generated deterministically (``make_demo_data.py``: PNG and JPEG in class folders,
plus an empty file, a file that is not an image and a truncated JPEG, which end in errors.jsonl).
Each build runs ``python -m packer.cli build`` in a subprocess with ``PYTHONPATH`` set to the
tree under test; the revision is checked out with ``git worktree add`` into a temporary
directory and removed afterwards. Builds: ``--format lmdb``, ``--format recordio`` and
``--format lmdb --encode raw``, each with ``--workers 1`` (the output does not depend on the
worker count; one keeps the run short).

The LMDB cases are compared with a later revision, ``CASE_REVS``: LMDB shards gained a
``wh-%09d`` key per record on purpose (PaddleOCR's sizes), so their ``data.mdb`` files, the
index offsets and meta.json's shard sizes differ from the base revision's by those keys; they
are compared byte for byte with the first revision that writes them. RecordIO is compared with
the base revision. ``--rev`` compares every case with one revision.

Every file of the two outputs must be equal byte for byte, except ``meta.json``, which is
compared as parsed JSON without the keys ``created`` (the build's time) and ``tool_version``
(the package version, which a revision may bump). ``lock.mdb`` is skipped: it is LMDB's lock
table, not data (it differs between two builds of the same tree by the same code), and readers
never open it.

Exit status 0 and "identical" when every output matches; else the differing files and 1.

    python scripts/compare_builds.py [--rev REV] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REV = "d286a31"
WH_KEYS_REV = "99c13ba0a101c43cef7cd6383ce67f8cbc5ea23d"
"""The first revision that writes a ``wh-%09d`` key per LMDB record."""
CASE_REVS = {"lmdb": WH_KEYS_REV, "lmdb-raw": WH_KEYS_REV}
"""Cases compared with a revision other than `DEFAULT_REV` (their bytes changed on purpose)."""
VOLATILE_META_KEYS = ("created", "tool_version")
"""meta.json keys that legitimately differ between two builds of the same inputs."""
SKIPPED_FILES = ("lock.mdb",)
"""Files that differ between two builds of the same tree by the same code: not data."""
BUILDS: dict[str, list[str]] = {
    "lmdb": ["--format", "lmdb"],
    "recordio": ["--format", "recordio"],
    "lmdb-raw": ["--format", "lmdb", "--encode", "raw"],
}


def make_tree(src: Path) -> None:
    """Write the deterministic input tree: demo images and a few bad files."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_demo_data.py"),
            str(src),
            "--per-class",
            "4",
            "--size",
            "40",
            "--seed",
            "7",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    bad = src / "circle"
    (bad / "empty.png").write_bytes(b"")
    (bad / "notes.jpg").write_bytes(b"this is not an image\n" * 10)
    jpeg = next(p for p in sorted(src.rglob("*.jpg")) if p.stat().st_size > 200)
    (bad / "truncated.jpg").write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size // 2])


def run_packer(tree: Path, *args: str) -> None:
    """``python -m packer.cli ARGS`` with the packer of `tree`; a failure ends the script."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, "-m", "packer.cli", *args]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"failed with the packer of {tree} ({done.returncode}): {' '.join(command)}\n"
            f"{done.stdout}{done.stderr}"
        )


def run_build(tree: Path, src: Path, out: Path, options: list[str]) -> None:
    """``packer build SRC OUT OPTIONS`` with the packer of `tree`."""
    run_packer(tree, "build", str(src), str(out), *options, "--workers", "1", "--no-progress")


def _files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name not in SKIPPED_FILES
    }


def _meta(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for key in VOLATILE_META_KEYS:
        meta.pop(key, None)
    return meta


def compare_outputs(old: Path, new: Path) -> list[str]:
    """The files that differ between the outputs `old` and `new`, with how."""
    old_files, new_files = _files(old), _files(new)
    found = [f"{name}: only in the build of the revision" for name in sorted(old_files - new_files)]
    found += [f"{name}: only in the build of this tree" for name in sorted(new_files - old_files)]
    for name in sorted(old_files & new_files):
        if name == "meta.json":
            a, b = _meta(old / name), _meta(new / name)
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if keys:
                found.append(f"{name}: keys differ: {', '.join(keys)}")
        elif (old / name).read_bytes() != (new / name).read_bytes():
            sizes = f"{(old / name).stat().st_size} vs {(new / name).stat().st_size} bytes"
            found.append(f"{name}: bytes differ ({sizes})")
    return found


@contextlib.contextmanager
def checked_out(rev: str, tree: Path) -> Iterator[Path]:
    """Revision `rev` of this repository checked out at `tree` (a worktree removed after)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev],
        check=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
        )


def revisions(rev: str | None) -> dict[str, str]:
    """The revision each case is compared with: `rev` for all, or the defaults."""
    return {case: rev or CASE_REVS.get(case, DEFAULT_REV) for case in BUILDS}


def compare(rev: str | None, work: Path) -> list[str]:
    """Build every case with its revision and with this tree under `work`; the differences."""
    src = work / "src"
    make_tree(src)
    found: list[str] = []
    by_case = revisions(rev)
    for n, revision in enumerate(dict.fromkeys(by_case.values())):
        with checked_out(revision, work / f"rev-{n}") as old_tree:
            for case, options in BUILDS.items():
                if by_case[case] != revision:
                    continue
                old_out, new_out = work / "out-rev" / case, work / "out-tree" / case
                old_out.parent.mkdir(exist_ok=True)
                new_out.parent.mkdir(exist_ok=True)
                run_build(old_tree, src, old_out, options)
                run_build(ROOT, src, new_out, options)
                found += [f"{case}/{line}" for line in compare_outputs(old_out, new_out)]
    return found


def run_comparison(compare_in: Callable[[Path], list[str]], keep: Path | None, prefix: str) -> int:
    """``compare_in(work)`` under `keep` (kept) or a temporary directory; print, exit status.

    Prints the differences found and returns 1, or prints "identical" and returns 0.
    """
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=False)
        found = compare_in(keep)
    else:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            found = compare_in(Path(tmp))
    if found:
        print("\n".join(found))
        return 1
    print("identical")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when the builds are identical."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rev",
        help=f"the revision to compare every case with (default: {DEFAULT_REV}, the LMDB cases "
        f"{WH_KEYS_REV[:7]})",
    )
    parser.add_argument("--keep", type=Path, help="build under this directory and keep it")
    args = parser.parse_args(argv)
    return run_comparison(lambda work: compare(args.rev, work), args.keep, "compare-builds-")


if __name__ == "__main__":
    sys.exit(main())
