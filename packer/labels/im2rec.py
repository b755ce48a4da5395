"""MXNet im2rec ``.lst`` files: ``index<TAB>label1<TAB>...<TAB>path`` lines."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packer.labels.common import Line, Listed, Parsed, bad_line, entry_lines, int_or_none, shorten

_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


def _number(text: str) -> int | float | None:
    """A finite decimal number (``3``, ``3.000000``, ``-1e-3``); None for anything else."""
    if not _NUMBER.match(text):
        return None
    value = float(text)
    if not math.isfinite(value):
        return None
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def lst_fields(line: str) -> tuple[list[int | float], str] | None:
    """Return the labels and path of a ``.lst`` line, or None when it is not one."""
    fields = line.split("\t")
    if len(fields) < 3 or int_or_none(fields[0].strip()) is None:
        return None
    numbers = [_number(f.strip()) for f in fields[1:-1]]
    path = fields[-1].strip()
    if not path or any(n is None for n in numbers):
        return None
    return [n for n in numbers if n is not None], path


def parse_lst_lines(lines: Iterable[tuple[int, Line]], path: Path | str) -> Parsed:
    """Parse an MXNet im2rec ``.lst`` file: ``index<TAB>label...<TAB>path`` lines.

    One label becomes a number (an int when integral: im2rec writes ``3.000000``); several
    become a list of numbers (all ints when all are integral, else all floats).
    """
    name = Path(path).name
    parsed = Parsed("lst")
    for number, line in entry_lines(lines, parsed, path):
        fields = lst_fields(line)
        if fields is None:
            parsed.bad.append(
                bad_line(
                    name,
                    path,
                    number,
                    "expected 'index<TAB>label<TAB>...<TAB>path' (MXNet "
                    f"im2rec .lst, finite numeric labels), got {shorten(line)}",
                )
            )
            continue
        values, rel = fields
        label: Any
        if len(values) == 1:
            label = values[0]
        elif all(isinstance(v, int) for v in values):
            label = values
        else:
            label = [float(v) for v in values]
        parsed.listed.append(Listed(f"{name}:{number}", rel, label))
    return parsed
