"""List files: PaddleOCR and PaddleClas.

PaddleOCR's are ``path<TAB>label`` (or detection JSON); PaddleClas's are ``path label`` or
``path<TAB>1,4,7`` (multi-label).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from packer.labels.common import (
    Line,
    Listed,
    Parsed,
    bad_line,
    entry_lines,
    loads_label,
    parse_label_text,
    shorten,
)

_INT_LIST = re.compile(r"^(?:0|[1-9][0-9]*)(?:\s*,\s*(?:0|[1-9][0-9]*))*$")
_DETECTION = re.compile(r"^\[\s*\{")  # PaddleOCR det/KIE: [{"transcription": ..., ...}]


def split_list_line(line: str) -> tuple[str, str] | None:
    """``path<TAB>label`` (PaddleOCR) or ``path label`` (PaddleClas) -> (path, label).

    The label after a tab may be empty (an entry without a label); without a tab the label
    is the last space-separated word.  None when the line has no separator or no path.
    """
    if "\t" in line:
        path, _, label = line.partition("\t")
    else:
        parts = line.rsplit(None, 1) if " " in line.strip() else []
        if len(parts) != 2:
            return None
        path, label = parts
    path, label = path.strip(), label.strip()
    if not path:
        return None
    return path, label


def parse_list_lines(
    lines: Iterable[tuple[int, Line]], path: Path | str, *, names: bool = False
) -> Parsed:
    """Parse a list file of ``path<TAB>label`` or ``path label`` lines.

    The kind of label is decided for the whole file, so a file never mixes interpretations:
    a PaddleOCR detection file (some label starts with ``[{``) stores every label as the JSON
    list it holds; a PaddleClas multi-label file (every label is ``int,int,...``, and some
    have a comma) stores lists of ints; otherwise a canonical integer is a class id and
    anything else text.  With ``names`` (a class map will turn names into ids) labels other
    than detection JSON stay text.
    """
    name = Path(path).name
    rows: list[tuple[int, str, str]] = []
    parsed = Parsed("list")
    for number, line in entry_lines(lines, parsed, path):
        fields = split_list_line(line)
        if fields is None:
            parsed.bad.append(
                bad_line(
                    name,
                    path,
                    number,
                    f"expected 'path<TAB>label' or 'path label', got {shorten(line)}",
                )
            )
            continue
        rows.append((number, *fields))
    labels = [label for _, _, label in rows if label]
    if any(_DETECTION.match(label) for label in labels):
        parsed.kind = "detection"
    elif (
        not names
        and labels
        and all(_INT_LIST.match(label) for label in labels)
        and any("," in label for label in labels)
    ):
        parsed.kind = "multilabel"
    for number, rel, label in rows:
        where = f"{name}:{number}"
        if not label:
            parsed.listed.append(Listed(where, rel, None, False, f"an empty label at {where}"))
        elif parsed.kind == "detection":
            value = None
            why = "expected a JSON list of regions as in the other PaddleOCR detection lines"
            if label.startswith("["):
                try:
                    value = loads_label(label)
                except ValueError as exc:
                    why = f"a PaddleOCR detection label that is not valid JSON ({exc})"
            if not isinstance(value, list):
                parsed.bad.append(bad_line(name, path, number, f"{why}, got {shorten(label)}"))
                continue
            parsed.listed.append(Listed(where, rel, value))
        elif parsed.kind == "multilabel":
            parsed.listed.append(Listed(where, rel, [int(v) for v in label.split(",")]))
        else:
            parsed.listed.append(Listed(where, rel, label if names else parse_label_text(label)))
    return parsed
