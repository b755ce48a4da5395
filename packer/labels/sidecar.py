"""Sidecar labels (``--labels sidecar``).

``a.jpg`` is labelled by the ``a.json`` or ``a.txt`` beside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packer import problems as P
from packer.labels.common import NOT_FINITE, NonFiniteLabelError, loads_label
from packer.problems import Problem
from packer.records import Entry
from packer.scan import ScanResult


def _sidecar_label(
    stem_path: str, listing: set[str], stem: str
) -> tuple[Any, str, tuple[str, str] | None]:
    """(label, sidecar name, (reason, message) when it cannot be used) for ``stem``.

    The label is None when the sidecar is empty or null; the name is "" when there is none.

    ``.json`` wins when both exist: it is the structured one, and a ``.txt`` beside it is
    often a note or a caption rather than the label.
    """
    for ext in (".json", ".txt"):
        if stem + ext not in listing:
            continue
        side = stem_path + ext
        where = os.path.basename(side)
        try:
            data = Path(side).read_bytes()
        except OSError as exc:
            return None, where, (P.UNREADABLE, f"cannot read the sidecar {where} ({exc})")
        try:
            text = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as exc:
            return None, where, (P.BAD_LINE, f"the sidecar {where} is not UTF-8 ({exc})")
        if ext == ".txt":
            if text.endswith("\n"):
                text = text[:-2] if text.endswith("\r\n") else text[:-1]
            return (text or None), where, None
        try:
            return loads_label(text), where, None
        except NonFiniteLabelError as exc:
            return (
                None,
                where,
                (P.BAD_LABEL, f"the sidecar {where}: the label is {NOT_FINITE} ({exc})"),
            )
        except ValueError as exc:
            return None, where, (P.BAD_LINE, f"the sidecar {where} is not valid JSON ({exc})")
    return None, "", None


def sidecar_labels(scan: ScanResult) -> tuple[list[tuple[Entry, str]], list[Problem], int]:
    """``a.jpg`` labelled by ``a.json`` (any JSON) or ``a.txt`` (text, one final newline cut).

    Returns the entries, the sidecars that cannot be used (``bad_line``, ``unreadable``) and
    how many images had both a ``.json`` and a ``.txt``.
    """
    listings: dict[str, set[str]] = {}
    items: list[tuple[Entry, str]] = []
    found: list[Problem] = []
    both = 0
    for f in scan.files:
        folder, base = os.path.split(f.path)
        if folder not in listings:
            try:
                listings[folder] = set(os.listdir(folder or "."))
            except OSError:
                listings[folder] = set()
        stem = os.path.splitext(base)[0]
        listing = listings[folder]
        both += stem + ".json" in listing and stem + ".txt" in listing
        label, where, problem = _sidecar_label(os.path.join(folder, stem), listing, stem)
        if problem is not None:
            found.append(Problem(f.rel, *problem))
        elif not where:
            note = f"no {stem}.json or {stem}.txt beside it (labels from sidecar)"
            items.append((Entry(f, None, labelled=False, note=note), f.rel))
        elif label is None:
            note = f"the sidecar {where} is empty or null (labels from sidecar)"
            items.append((Entry(f, None, labelled=False, note=note), where))
        else:
            items.append((Entry(f, label), where))
    return items, found, both
