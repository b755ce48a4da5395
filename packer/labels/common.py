"""What every label source shares.

That is strict label values (int ids, JSON), the lines of a label file, and the
:class:`Listed` / :class:`Parsed` records its parser makes.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from packer import problems as P
from packer.config import LABEL_KEYWORDS
from packer.problems import Problem

# Reason code of a label that the class map does not name (or that is not a class name).
UNKNOWN_CLASS = "unknown_class"

KEYWORDS = LABEL_KEYWORDS

_INT = re.compile(r"^(?:0|-?[1-9][0-9]*)$")  # canonical: "007" and "+7" stay text
_INT64 = 1 << 63


def int_or_none(text: str) -> int | None:
    """`text` as an int64 when it is one written canonically, else None."""
    if not _INT.match(text):
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def parse_label_text(text: str) -> Any:
    """A label from a list file: an int class id when it is one, else the text itself.

    Only canonical integers become ids (``7``, ``-1``); ``007`` or ``+7`` stay text, so no
    label is altered by a round trip through int.
    """
    value = int_or_none(text)
    return text if value is None else value


NOT_FINITE = "not a finite number"
"""How a NaN or infinite label is refused, by build and convert alike (reason ``bad_label``)."""


class NonFiniteLabelError(ValueError):
    """A label holds NaN or an infinity: JSON has no such number (index.jsonl would not parse)."""


def _reject_constant(name: str) -> Any:
    raise NonFiniteLabelError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteLabelError(f"{text} is out of range for a number")
    return value


def nonfinite_label(label: Any) -> str | None:
    """Return a message when `label` is or holds NaN or an infinity (at any depth), else None.

    Such a label cannot be written as JSON; build and convert refuse the sample (``bad_label``).
    """
    if label is None or isinstance(label, str | int):
        return None
    stack = [label]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return f"the label {shorten(label)} holds {value!r}: {NOT_FINITE}"
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return None


def loads_label(text: str) -> Any:
    """Strict JSON for labels: no NaN/Infinity, no overflowing numbers, no ints beyond int64.

    Raises:
        ValueError: the text is not such JSON (the message says where).
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        raise ValueError(f"the class id {value} does not fit in 64 bits")
    return value


def shorten(value: Any, limit: int = 60) -> str:
    """Return `value` (JSON unless a string) quoted, cut to `limit` characters plus "..."."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --------------------------------------------------------------------------- reading files


@dataclass(frozen=True)
class Listed:
    """One entry of a label file before its path is checked."""

    where: str  # "train.txt:12"
    path: str
    label: Any
    labelled: bool = True
    note: str = ""


@dataclass
class Parsed:
    """What one parser made of one label file."""

    kind: str  # list | detection | multilabel | lst | jsonl | csv
    listed: list[Listed] = field(default_factory=list)
    bad: list[Problem] = field(default_factory=list)
    lines: int = 0  # lines that hold an entry (blank lines and comments excluded)


def bad_line(name: str, path: Path | str, number: int, message: str) -> Problem:
    """Return the problem for line `number` of the label file `path` (shown as `name`)."""
    return Problem(f"{name}:{number}", P.BAD_LINE, f"{path}:{number}: {message}")


MAX_LINE_BYTES = 1 << 20
"""The longest line a label file may hold, in bytes (1 MiB, without its line end).

A longer line is a ``bad_line`` and is skipped without being read into memory (a label line
costs several times its size once decoded and parsed); a CSV row whose field spanning lines
grows past it is a ``bad_line`` too.
"""


@dataclass(frozen=True)
class LongLine:
    """A line of a label file longer than :data:`MAX_LINE_BYTES`, skipped unread."""

    size: int  # its bytes, without the line end

    def message(self) -> str:
        """The ``bad_line`` message for it."""
        return (
            f"a line of {self.size} bytes, longer than the {MAX_LINE_BYTES >> 20} MiB a "
            "label line may hold; skipped"
        )


Line = str | LongLine | None
"""A line of a label file as `numbered_lines` gives it: its text, a `LongLine`, or None when
it is not UTF-8."""


_BLOCK = MAX_LINE_BYTES >> 2  # read at a time: a line between two line ends of a block is short


def _long(line: bytes) -> LongLine | None:
    r"""A `LongLine` for `line` (without its ``\n``) when it is past the bound, else None."""
    size = len(line) - line.endswith(b"\r")
    return LongLine(size) if size > MAX_LINE_BYTES else None


def bounded_lines(f: BinaryIO) -> Iterator[bytes | LongLine]:
    r"""The lines of the binary file `f`, without their ``\n``, read a block at a time.

    A line of more than :data:`MAX_LINE_BYTES` (without its line end) comes as a `LongLine`:
    it is read on and dropped a block at a time, never held whole.
    """
    tail = b""  # the start of a line that the next block goes on with
    skipped = -1  # bytes so far of a long line being dropped (-1: none)
    cr = False  # the bytes dropped so far end with "\r"
    while block := f.read(_BLOCK):
        if skipped >= 0:
            end = block.find(b"\n")
            if end < 0:
                skipped += len(block)
                cr = block.endswith(b"\r")
                continue
            before = block[end - 1 : end] == b"\r" if end else cr
            yield LongLine(skipped + end - before)
            skipped = -1
            block = block[end + 1 :]
        lines = block.split(b"\n")
        if len(lines) == 1:
            tail += block
        else:  # only the first line can be long: it goes on from earlier blocks
            first = tail + lines[0]
            yield _long(first) or first
            tail = lines.pop()
            yield from lines[1:]
        del lines
        if len(tail) > MAX_LINE_BYTES + 1:  # long even if a "\r\n" comes next
            skipped, cr, tail = len(tail), tail.endswith(b"\r"), b""
    if skipped >= 0:
        yield LongLine(skipped - cr)
    elif tail:
        yield _long(tail) or tail


def numbered_lines(data: Iterable[bytes] | BinaryIO) -> Iterator[tuple[int, Line]]:
    r"""Lines split on ``\n`` only (``\r\n`` too), decoded.

    None for a line that is not UTF-8, a `LongLine` for one past :data:`MAX_LINE_BYTES`
    (a binary file is read line by line with `bounded_lines`, so such a line is never held
    in memory whole). ``str.splitlines`` would also split on U+2028, form feeds and the like
    inside a label.
    """
    raws: Iterable[bytes | LongLine]
    if isinstance(data, io.IOBase):
        raws = bounded_lines(cast(BinaryIO, data))
    else:
        raws = (r if len(r) <= MAX_LINE_BYTES else LongLine(len(r)) for r in data)
    for number, raw in enumerate(raws, start=1):
        if isinstance(raw, LongLine):
            yield number, raw
            continue
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError:
            yield number, None


def has_entry(line: str) -> bool:
    """Return whether `line` holds an entry (is neither blank nor a ``#`` comment)."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def entry_lines(
    lines: Iterable[tuple[int, Line]],
    parsed: Parsed,
    path: Path | str,
    *,
    is_entry: Callable[[str], bool] = has_entry,
) -> Iterator[tuple[int, str]]:
    """Yield the entry lines of a label file, each counted in ``parsed.lines``.

    A line that is not UTF-8 or is too long (`LongLine`) is counted too and reported in
    ``parsed.bad``; blank (and comment) lines are not.
    """
    name = Path(path).name
    for number, line in lines:
        if line is None:
            parsed.lines += 1
            parsed.bad.append(bad_line(name, path, number, "not UTF-8 text"))
        elif isinstance(line, LongLine):
            parsed.lines += 1
            parsed.bad.append(bad_line(name, path, number, line.message()))
        elif is_entry(line):
            parsed.lines += 1
            yield number, line


def find_label_file(spec: str, src: Path) -> Path:
    """The file `spec` names: as given, else relative to SRC."""
    candidate = Path(spec)
    if not candidate.exists() and (src / spec).exists():
        candidate = src / spec
    return candidate
