"""Which parser reads a label file (by extension, then by content), and reading it."""

from __future__ import annotations

import csv
from pathlib import Path

from packer.errors import LabelSourceError
from packer.labels.common import Parsed, has_entry, numbered_lines
from packer.labels.csvfile import read_csv
from packer.labels.im2rec import lst_fields, parse_lst_lines
from packer.labels.jsonl import parse_jsonl_lines
from packer.labels.listfile import parse_list_lines

_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 20
_BINARY_BYTES = 1024  # images, .rec and .mdb files hold a NUL byte well within this


def _sniff(head: bytes) -> list[str]:
    """The first lines of a file that hold an entry (at most ``_SNIFF_LINES``)."""
    chunks = head.split(b"\n")
    if len(head) >= _SNIFF_BYTES:
        chunks = chunks[:-1]  # the last line may be cut short
    found: list[str] = []
    for _, line in numbered_lines(chunks):
        if isinstance(line, str) and has_entry(line):
            found.append(line)
            if len(found) >= _SNIFF_LINES:
                break
    return found


def _is_csv_header(line: str) -> bool:
    try:
        row = next(csv.reader([line]), [])
    except csv.Error:
        return False
    columns = {c.strip().lower() for c in row}
    return len(row) >= 2 and {"path", "label"} <= columns


def detect_kind(path: Path, head: bytes) -> str:
    """``list``, ``lst``, ``jsonl`` or ``csv``: by extension, then by content.

    Raises:
        LabelSourceError: binary data, or a JSON document that is not JSON Lines.
    """
    if b"\x00" in head[:_BINARY_BYTES]:  # later NULs (a torn tail) are bad lines
        raise LabelSourceError(
            f"--labels {path}: binary data (a NUL byte at the start); expected a text list file "
            "(path<TAB>label), an im2rec .lst, a .jsonl or a .csv manifest"
        )
    ext = path.suffix.lower()
    if ext in (".jsonl", ".ndjson"):
        return "jsonl"
    if ext == ".csv":
        return "csv"
    if ext == ".lst":
        return "lst"
    lines = _sniff(head)
    first = lines[0].lstrip() if lines else ""
    if first.startswith("{"):
        return "jsonl"
    if ext == ".json":
        raise LabelSourceError(
            f"--labels {path}: a JSON document; expected JSON Lines (.jsonl), one "
            '{"path": ..., "label": ...} object per line'
        )
    if _is_csv_header(first) and "\t" not in first:
        return "csv"
    if lines and all(lst_fields(line) is not None for line in lines):
        return "lst"
    return "list"


_EXPECTED = {
    "list": "'path<TAB>label' or 'path label' lines",
    "lst": "'index<TAB>label<TAB>...<TAB>path' lines (MXNet im2rec)",
    "jsonl": 'one {"path": ..., "label": ...} object per line',
    "csv": "CSV rows under a 'path,label' header",
}


def read_label_file(path: Path, *, names: bool = False) -> Parsed:
    """Parse one label file of any kind.

    Raises:
        LabelSourceError: the file cannot be read, is empty, is of no known kind, or not one
            of its lines parses.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except FileNotFoundError:
        raise LabelSourceError(f"--labels {path}: no such file") from None
    except IsADirectoryError:
        raise LabelSourceError(
            f"--labels {path}: a directory; expected a label file, or dirname, sidecar or none"
        ) from None
    except OSError as exc:
        raise LabelSourceError(f"--labels {path}: cannot read ({exc})") from exc
    kind = detect_kind(path, head)
    try:
        if kind == "csv":
            parsed = read_csv(path, names=names)
        else:
            with open(path, "rb") as f:
                lines = numbered_lines(f)
                if kind == "lst":
                    parsed = parse_lst_lines(lines, path)
                elif kind == "jsonl":
                    parsed = parse_jsonl_lines(lines, path)
                else:
                    parsed = parse_list_lines(lines, path, names=names)
    except OSError as exc:
        raise LabelSourceError(f"--labels {path}: cannot read ({exc})") from exc
    if parsed.lines == 0:
        raise LabelSourceError(
            f"--labels {path}: no entries (the file is empty or holds only comments); "
            f"expected {_EXPECTED[kind]}"
        )
    if not parsed.listed and parsed.bad:
        first = parsed.bad[0].message
        raise LabelSourceError(
            f"--labels {path}: none of its {parsed.lines} lines could be read as "
            f"{_EXPECTED[kind]}; the first: {first}"
        )
    return parsed
