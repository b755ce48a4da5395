"""Class folders (``--labels dirname``).

The first ``--label-depth`` folders of a path name its class.
"""

from __future__ import annotations

import os
from pathlib import Path

from packer.problems import NO_LABEL_MESSAGE
from packer.records import Entry
from packer.scan import ScanResult, check_name


def _class_dirs(src: Path, depth: int, top_dirs: list[str], exclude: tuple[str, ...]) -> set[str]:
    """The non-hidden folders `depth` levels under SRC, as ``a/b`` paths (links kept inside)."""
    root = os.path.realpath(src)
    excluded = {os.path.realpath(p) for p in exclude}
    level = [(os.path.join(src, d), d) for d in top_dirs]
    for _ in range(depth - 1):
        below: list[tuple[str, str]] = []
        for path, rel in level:
            try:
                children = sorted(os.scandir(path), key=lambda e: e.name)
            except OSError:
                continue
            for child in children:
                if child.name.startswith(".") or not child.is_dir(follow_symlinks=True):
                    continue
                real = os.path.realpath(child.path)
                if real in excluded or not real.startswith(root.rstrip(os.sep) + os.sep):
                    continue
                below.append((child.path, f"{rel}/{child.name}"))
        level = below
    return {rel for _, rel in level}


def dirname_labels(
    scan: ScanResult, src: Path, *, depth: int = 1, exclude: tuple[str, ...] = ()
) -> tuple[list[str], list[tuple[Entry, str]]]:
    """Class folders: the first `depth` folders of each path, joined by ``/``, name its class.

    Returns the class names (sorted folders at that depth, empty ones included, names that
    cannot be stored left out) and each file with its class name as label.
    """
    classes = _class_dirs(src, depth, scan.top_dirs, exclude)
    items: list[tuple[Entry, str]] = []
    above = (
        NO_LABEL_MESSAGE
        if depth == 1
        else f"an image above the class folders (--label-depth {depth}: labels from dirname)"
    )
    for f in scan.files:
        parts = f.rel.split("/")
        if len(parts) <= depth:
            items.append((Entry(f, None, labelled=False, note=above), f.rel))
            continue
        name = "/".join(parts[:depth])
        classes.add(name)
        items.append((Entry(f, name), name + "/"))
    return sorted(c for c in classes if check_name(c) is None), items
