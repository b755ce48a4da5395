"""JSON Lines manifests: one ``{"path": ..., "label": ...}`` object per line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from packer.errors import LabelSourceError
from packer.labels.common import (
    Line,
    Listed,
    Parsed,
    bad_line,
    entry_lines,
    loads_label,
    shorten,
)


def parse_jsonl_lines(lines: Iterable[tuple[int, Line]], path: Path | str) -> Parsed:
    """Parse a JSON Lines manifest: one ``{"path": ..., "label": ...}`` object per line.

    Any JSON label is kept as it is; a missing or null label is an entry without a label.
    Read with :mod:`json`, not ``pyarrow.json``: Arrow infers one type per column, so labels
    of different shapes (an int here, boxes there; objects with different keys) would fail
    or come back altered (missing keys filled with null).

    Raises:
        LabelSourceError: the first object has no ``path`` or no ``label`` key.
    """
    name = Path(path).name
    parsed = Parsed("jsonl")
    checked = False
    for number, line in entry_lines(lines, parsed, path, is_entry=lambda text: bool(text.strip())):
        try:
            obj = loads_label(line)
        except ValueError as exc:
            parsed.bad.append(bad_line(name, path, number, f"not valid JSON ({exc})"))
            continue
        if not isinstance(obj, dict):
            parsed.bad.append(
                bad_line(
                    name,
                    path,
                    number,
                    f"expected a JSON object with 'path' and 'label', got {shorten(obj)}",
                )
            )
            continue
        if not checked:
            if "path" not in obj or "label" not in obj:
                raise LabelSourceError(
                    f"--labels {path}: line {number} has the keys {sorted(obj)}; expected a "
                    "JSON Lines manifest whose objects have 'path' and 'label' keys"
                )
            checked = True
        rel = obj.get("path")
        if not isinstance(rel, str) or not rel.strip():
            parsed.bad.append(
                bad_line(
                    name, path, number, f"'path' must be a non-empty string, got {shorten(rel)}"
                )
            )
            continue
        where = f"{name}:{number}"
        label = obj.get("label")
        if label is None:
            parsed.listed.append(Listed(where, rel.strip(), None, False, f"no label at {where}"))
        else:
            parsed.listed.append(Listed(where, rel.strip(), label))
    return parsed
