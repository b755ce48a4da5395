"""Label sources: which files to pack and the label of each (folders, lists, manifests, sidecars).

Every source ends in one :class:`LabelPlan`: the entries to read and pack, and the per-entry
problems (a listed file that is missing, a duplicate, an unparseable line, an unknown class)
that are reported in ``errors.jsonl`` and never replaced by a default label.  A label source
that cannot be used at all raises :class:`LabelSourceError`.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import problems as P
from packer.config import LABEL_KEYWORDS
from packer.errors import LabelSourceError
from packer.problems import Problem
from packer.scan import ScanResult, SourceFile, check_name, resolve_entry, scan_tree

# Reason code of a label that the class map does not name (or that is not a class name).
UNKNOWN_CLASS = "unknown_class"

KEYWORDS = LABEL_KEYWORDS
NO_LABEL_MESSAGE = "an image outside every class folder (labels from dirname)"

_INT = re.compile(r"^(?:0|-?[1-9][0-9]*)$")  # canonical: "007" and "+7" stay text
_INT_LIST = re.compile(r"^(?:0|[1-9][0-9]*)(?:\s*,\s*(?:0|[1-9][0-9]*))*$")
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_DETECTION = re.compile(r"^\[\s*\{")  # PaddleOCR det/KIE: [{"transcription": ..., ...}]
_INT64 = 1 << 63
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 20
_BINARY_BYTES = 1024  # images, .rec and .mdb files hold a NUL byte well within this
_CSV_FIELD_LIMIT = (1 << 31) - 1


@dataclass(frozen=True)
class Entry:
    """One file to pack with its label (JSON-able: int, str, list, dict, or None).

    An entry without a label where one is required is still read, so that a file which is
    not an image is reported as such; one that is an image is then reported as ``no_label``
    (``note`` says why it has none).
    """

    file: SourceFile
    label: Any
    labelled: bool = True
    note: str = ""


@dataclass
class LabelPlan:
    entries: list[Entry]
    problems: list[Problem]
    source: str  # dirname | sidecar | none | <kind>:<file>[, <kind>:<file> ...]
    classes: list[str] | None = None  # class names by id, when labels are class ids
    ignored: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    class_map: str | None = None  # how names became ids: "auto" or "file:<path>"


# --------------------------------------------------------------------------- label values


def _int_or_none(text: str) -> int | None:
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
    value = _int_or_none(text)
    return text if value is None else value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


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


def _short(value: Any, limit: int = 60) -> str:
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


def _bad(name: str, path: Path | str, number: int, message: str) -> Problem:
    return Problem(f"{name}:{number}", P.BAD_LINE, f"{path}:{number}: {message}")


def _numbered_lines(data: Iterable[bytes]) -> Iterator[tuple[int, str | None]]:
    """Lines split on ``\\n`` only (``\\r\\n`` too), decoded; None for a line that is not UTF-8.

    ``str.splitlines`` would also split on U+2028, form feeds and the like inside a label.
    """
    for number, raw in enumerate(data, start=1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError:
            yield number, None


def _has_entry(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


# -- list files: PaddleOCR (path<TAB>label), PaddleClas (path label, path<TAB>1,4,7)


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
    lines: Iterable[tuple[int, str | None]], path: Path | str, *, names: bool = False
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
    for number, line in lines:
        if line is None:
            parsed.lines += 1
            parsed.bad.append(_bad(name, path, number, "not UTF-8 text"))
            continue
        if not _has_entry(line):
            continue
        parsed.lines += 1
        fields = split_list_line(line)
        if fields is None:
            parsed.bad.append(
                _bad(
                    name,
                    path,
                    number,
                    f"expected 'path<TAB>label' or 'path label', got {_short(line)}",
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
                parsed.bad.append(_bad(name, path, number, f"{why}, got {_short(label)}"))
                continue
            parsed.listed.append(Listed(where, rel, value))
        elif parsed.kind == "multilabel":
            parsed.listed.append(Listed(where, rel, [int(v) for v in label.split(",")]))
        else:
            parsed.listed.append(Listed(where, rel, label if names else parse_label_text(label)))
    return parsed


# -- MXNet im2rec .lst: index<TAB>label1<TAB>...<TAB>path


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


def _lst_fields(line: str) -> tuple[list[int | float], str] | None:
    fields = line.split("\t")
    if len(fields) < 3 or _int_or_none(fields[0].strip()) is None:
        return None
    numbers = [_number(f.strip()) for f in fields[1:-1]]
    path = fields[-1].strip()
    if not path or any(n is None for n in numbers):
        return None
    return [n for n in numbers if n is not None], path


def parse_lst_lines(lines: Iterable[tuple[int, str | None]], path: Path | str) -> Parsed:
    """Parse an MXNet im2rec ``.lst`` file: ``index<TAB>label...<TAB>path`` lines.

    One label becomes a number (an int when integral: im2rec writes ``3.000000``); several
    become a list of numbers (all ints when all are integral, else all floats).
    """
    name = Path(path).name
    parsed = Parsed("lst")
    for number, line in lines:
        if line is None:
            parsed.lines += 1
            parsed.bad.append(_bad(name, path, number, "not UTF-8 text"))
            continue
        if not _has_entry(line):
            continue
        parsed.lines += 1
        fields = _lst_fields(line)
        if fields is None:
            parsed.bad.append(
                _bad(
                    name,
                    path,
                    number,
                    "expected 'index<TAB>label<TAB>...<TAB>path' (MXNet "
                    f"im2rec .lst, finite numeric labels), got {_short(line)}",
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


# -- JSON Lines manifests


def parse_jsonl_lines(lines: Iterable[tuple[int, str | None]], path: Path | str) -> Parsed:
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
    for number, line in lines:
        if line is None:
            parsed.lines += 1
            parsed.bad.append(_bad(name, path, number, "not UTF-8 text"))
            continue
        if not line.strip():
            continue
        parsed.lines += 1
        try:
            obj = loads_label(line)
        except ValueError as exc:
            parsed.bad.append(_bad(name, path, number, f"not valid JSON ({exc})"))
            continue
        if not isinstance(obj, dict):
            parsed.bad.append(
                _bad(
                    name,
                    path,
                    number,
                    f"expected a JSON object with 'path' and 'label', got {_short(obj)}",
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
                _bad(name, path, number, f"'path' must be a non-empty string, got {_short(rel)}")
            )
            continue
        where = f"{name}:{number}"
        label = obj.get("label")
        if label is None:
            parsed.listed.append(Listed(where, rel.strip(), None, False, f"no label at {where}"))
        else:
            parsed.listed.append(Listed(where, rel.strip(), label))
    return parsed


# -- CSV manifests


def _csv_label(cell: str, *, names: bool) -> Any:
    """A CSV label cell: a JSON array or object, an int (unless ``names``), else the text."""
    stripped = cell.strip()
    if stripped[:1] in ("[", "{"):
        try:
            value = loads_label(stripped)
        except ValueError:
            return cell
        if isinstance(value, (list, dict)):
            return value
    if not names:
        number = _int_or_none(stripped)
        if number is not None:
            return number
    return cell


def _csv_listed(where: str, rel: str, cell: str, *, names: bool) -> Listed:
    if not cell.strip():
        return Listed(where, rel, None, False, f"an empty label cell at {where}")
    return Listed(where, rel, _csv_label(cell, names=names))


def _csv_header(text: str, path: Path | str) -> tuple[list[str], int, int]:
    """The header row and the positions of its path and label columns."""
    try:
        header = next(csv.reader(io.StringIO(text, newline="")), [])
    except csv.Error as exc:
        raise LabelSourceError(f"--labels {path}: cannot read the CSV header ({exc})") from exc
    columns = [c.strip().lower() for c in header]
    if columns.count("path") != 1 or columns.count("label") != 1:
        raise LabelSourceError(
            f"--labels {path}: found the columns {header}; expected a CSV manifest whose "
            "header row has one 'path' and one 'label' column"
        )
    return header, columns.index("path"), columns.index("label")


def csv_rows_arrow(
    data: bytes, header: list[str], path_col: int, label_col: int
) -> list[tuple[int, str, str]] | None:
    """(line, path cell, label cell) of a CSV read with pyarrow, or None to use the slow path.

    pyarrow cannot say on which line a row is, so it is used only when every row is exactly
    one line (no blank lines, no values spanning lines): then row n is on line n + 2.  On any
    error (a short row, bad UTF-8) the caller re-reads with :func:`csv_rows_python`, which
    reports each bad line with its number.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    body = data[len(codecs.BOM_UTF8) :] if data.startswith(codecs.BOM_UTF8) else data
    lines = body.count(b"\n") + (0 if body.endswith(b"\n") else 1)
    wanted = [header[path_col], header[label_col]]
    try:
        table = pacsv.read_csv(
            pa.BufferReader(body),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in wanted},
                include_columns=wanted,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows + 1 != lines:
        return None
    paths = table.column(0).to_pylist()
    labels = table.column(1).to_pylist()
    return [(n + 2, p, q) for n, (p, q) in enumerate(zip(paths, labels, strict=True))]


def _valid_utf8(*cells: str) -> bool:
    try:
        for cell in cells:
            cell.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def csv_rows_python(
    text: str, path: Path | str, path_col: int, label_col: int
) -> tuple[list[tuple[int, str, str]], list[Problem], int]:
    """(line, path cell, label cell) rows, bad lines, and the number of data rows.

    `text` is the file decoded with ``surrogateescape``, so a line that is not UTF-8 is
    reported instead of failing the file.
    """
    name = Path(path).name
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    # lines end at "\n" only, as for list files and in the pyarrow path; a lone "\r" outside
    # quotes is then a csv.Error on its line
    reader = csv.reader(io.StringIO(text, newline="\n"))
    rows: list[tuple[int, str, str]] = []
    bad: list[Problem] = []
    width = -1
    count = 0
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            count += 1
            bad.append(_bad(name, path, start, f"not a CSV row ({exc})"))
            continue
        if width < 0:  # the header
            width = len(row)
            continue
        if not row:  # a blank line
            continue
        count += 1
        if not _valid_utf8(*row):
            bad.append(_bad(name, path, start, "not UTF-8 text"))
        elif len(row) != width:
            bad.append(
                _bad(
                    name,
                    path,
                    start,
                    f"expected {width} fields as in the header, got "
                    f"{len(row)}: {_short(','.join(row))}",
                )
            )
        else:
            rows.append((start, row[path_col], row[label_col]))
    return rows, bad, count


def parse_csv(data: bytes, path: Path | str, *, names: bool = False) -> Parsed:
    """Parse a CSV manifest with a header row naming ``path`` and ``label`` columns.

    A label cell that is a JSON array or object becomes that JSON (``[1,2]``, boxes); a
    canonical integer becomes a class id (kept as text with ``names``); anything else is
    kept as written; an empty cell is an entry without a label.  Clean files are read with
    pyarrow; files it rejects are re-read line by line, so each bad line is reported.

    Raises:
        LabelSourceError: no header with ``path`` and ``label`` columns.
    """
    name = Path(path).name
    text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    header, path_col, label_col = _csv_header(text, path)
    parsed = Parsed("csv")
    rows = csv_rows_arrow(data, header, path_col, label_col)
    if rows is None:
        rows, parsed.bad, parsed.lines = csv_rows_python(text, path, path_col, label_col)
    else:
        parsed.lines = len(rows)
    for number, rel, cell in rows:
        if not rel.strip():
            parsed.bad.append(_bad(name, path, number, "an empty path cell"))
            continue
        parsed.listed.append(_csv_listed(f"{name}:{number}", rel.strip(), cell, names=names))
    return parsed


# -- choosing the parser


def _sniff(head: bytes) -> list[str]:
    """The first lines of a file that hold an entry (at most ``_SNIFF_LINES``)."""
    chunks = head.split(b"\n")
    if len(head) >= _SNIFF_BYTES:
        chunks = chunks[:-1]  # the last line may be cut short
    found: list[str] = []
    for _, line in _numbered_lines(chunks):
        if line is not None and _has_entry(line):
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
    if lines and all(_lst_fields(line) is not None for line in lines):
        return "lst"
    return "list"


_EXPECTED = {
    "list": "'path<TAB>label' or 'path label' lines",
    "lst": "'index<TAB>label<TAB>...<TAB>path' lines (MXNet im2rec)",
    "jsonl": 'one {"path": ..., "label": ...} object per line',
    "csv": "CSV rows under a 'path,label' header",
}


def find_label_file(spec: str, src: Path) -> Path:
    """The file `spec` names: as given, else relative to SRC."""
    candidate = Path(spec)
    if not candidate.exists() and (src / spec).exists():
        candidate = src / spec
    return candidate


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
            parsed = parse_csv(path.read_bytes(), path, names=names)
        else:
            with open(path, "rb") as f:
                lines = _numbered_lines(f)
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


# --------------------------------------------------------------------------- class maps


@dataclass(frozen=True)
class ClassMap:
    """Class names by id, and how they were made (``auto`` or ``file:<path>``)."""

    names: list[str]
    how: str

    def ids(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}


def _names_from_json(obj: Any, path: Path) -> list[str]:
    if isinstance(obj, list) and all(isinstance(n, str) for n in obj):
        return obj
    if isinstance(obj, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in obj.values()
    ):
        by_id = {v: k for k, v in obj.items()}
        if sorted(by_id) != list(range(len(obj))):
            raise LabelSourceError(
                f"--class-map {path}: the ids {sorted(obj.values())[:10]} are not 0..{len(obj) - 1}"
                " each once; expected an object mapping each class name to its id"
            )
        return [by_id[i] for i in range(len(obj))]
    raise LabelSourceError(
        f"--class-map {path}: found JSON {type(obj).__name__}; expected a list of class names "
        "(index = id) or an object mapping names to ids 0..k-1"
    )


def load_class_map(spec: str, src: Path) -> ClassMap:
    """Read ``--class-map FILE``: one class name per line (line n holds id n-1), or JSON.

    Raises:
        LabelSourceError: the file is missing, unreadable, empty, has a blank line between
            names, or names a class twice.
    """
    path = find_label_file(spec, src)
    try:
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except FileNotFoundError:
        raise LabelSourceError(
            f"--class-map {path}: no such file; expected auto or a file of class names"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelSourceError(f"--class-map {path}: cannot read ({exc})") from exc
    names: list[str] | None = None
    if path.suffix.lower() == ".json" or text.lstrip()[:1] in ("[", "{"):
        try:
            obj = loads_label(text)
        except ValueError as exc:
            if path.suffix.lower() == ".json":
                raise LabelSourceError(f"--class-map {path}: not valid JSON ({exc})") from exc
        else:
            names = _names_from_json(obj, path)
    if names is None:
        lines = [line.strip() for line in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        if "" in lines:
            raise LabelSourceError(
                f"--class-map {path}:{lines.index('') + 1}: an empty line; expected one class "
                "name per line (line n is class id n-1)"
            )
        names = lines
    if not names:
        raise LabelSourceError(f"--class-map {path}: no class names")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise LabelSourceError(f"--class-map {path}: the class {name!r} is listed twice")
        seen.add(name)
    return ClassMap(names, f"file:{path}")


def class_names(labels: Iterable[Any]) -> list[str]:
    """The sorted text labels (and text items of list labels): ``--class-map auto``."""
    found: set[str] = set()
    for label in labels:
        if isinstance(label, str):
            found.add(label)
        elif isinstance(label, list):
            found.update(v for v in label if isinstance(v, str))
    return sorted(found)


def map_label(label: Any, ids: dict[str, int]) -> tuple[Any, str | None]:
    """A class name -> its id, a list of names -> their ids; else (None, why not)."""
    if isinstance(label, str):
        if label in ids:
            return ids[label], None
        return None, f"the class {_short(label)} is not in the class map"
    if isinstance(label, list) and all(isinstance(v, str) for v in label):
        unknown = [v for v in label if v not in ids]
        if unknown:
            return None, f"the classes {unknown[:5]} are not in the class map"
        return [ids[v] for v in label], None
    return None, (
        f"the label {_short(label)} is not a class name; --class-map maps text labels (or "
        "lists of them) to ids"
    )


def _apply_class_map(
    items: list[tuple[Entry, str]], cmap: ClassMap, found: list[Problem]
) -> list[Entry]:
    ids = cmap.ids()
    entries: list[Entry] = []
    for entry, where in items:
        if not entry.labelled:
            entries.append(entry)
            continue
        value, why = map_label(entry.label, ids)
        if why is not None:
            found.append(Problem(entry.file.rel, UNKNOWN_CLASS, f"{why} ({where})"))
        else:
            entries.append(Entry(entry.file, value))
    return entries


# --------------------------------------------------------------------------- the sources


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


def _resolve_listed(
    src: Path, files: list[tuple[Path, Parsed]]
) -> tuple[list[tuple[Entry, str]], list[Problem]]:
    """Check every listed path (inside SRC, present), keep the first of duplicates."""
    items: list[tuple[Entry, str]] = []
    found: list[Problem] = []
    first: dict[str, str] = {}
    for _, parsed in files:
        found.extend(parsed.bad)
        for listed in parsed.listed:
            if "\x00" in listed.path:
                found.append(
                    Problem(
                        listed.path.replace("\x00", "\\x00"),
                        P.BAD_NAME,
                        f"the name holds a NUL byte ({listed.where})",
                    )
                )
                continue
            source, problem = resolve_entry(src, listed.path)
            if problem is not None:
                found.append(
                    Problem(problem.path, problem.reason, f"{problem.message} ({listed.where})")
                )
                continue
            assert source is not None
            if source.rel in first:
                found.append(
                    Problem(
                        source.rel,
                        P.DUPLICATE,
                        f"listed again at {listed.where} (first at {first[source.rel]}); "
                        "the first entry is packed",
                    )
                )
                continue
            first[source.rel] = listed.where
            entry = Entry(source, listed.label, listed.labelled, listed.note)
            items.append((entry, listed.where))
    return items, found


def from_label_files(src: Path, specs: Sequence[str], *, class_map: str | None = None) -> LabelPlan:
    """List files and manifests, merged; the lists *are* the dataset (unlisted files are not
    packed).  Paths are relative to SRC; an entry listed twice (in one file or two) is packed
    once, as first listed, and the repeat reported.
    """
    names = class_map is not None
    files = [(p, read_label_file(p, names=names)) for p in (find_label_file(s, src) for s in specs)]
    items, found = _resolve_listed(src, files)
    source = ", ".join(
        f"{'list' if parsed.kind in ('detection', 'multilabel') else parsed.kind}:{p}"
        for p, parsed in files
    )
    plan = LabelPlan([], found, source, extra={"kinds": [parsed.kind for _, parsed in files]})
    if class_map is None:
        plan.entries = [entry for entry, _ in items]
    else:
        every = (listed.label for _, parsed in files for listed in parsed.listed if listed.labelled)
        _finish_class_map(plan, items, src, class_map, every)
    plan.entries.sort(key=lambda e: e.file.rel)
    plan.problems.sort(key=lambda p: p.path)
    return plan


def _finish_class_map(
    plan: LabelPlan,
    items: list[tuple[Entry, str]],
    src: Path,
    spec: str,
    labels: Iterable[Any],
) -> None:
    cmap = ClassMap(class_names(labels), "auto") if spec == "auto" else load_class_map(spec, src)
    plan.entries = _apply_class_map(items, cmap, plan.problems)
    plan.classes = cmap.names
    plan.class_map = cmap.how


def check_specs(specs: Sequence[str]) -> None:
    """Raise LabelSourceError unless `specs` is one keyword or one or more label files."""
    if not specs:
        raise LabelSourceError("--labels: no label source given")
    keywords = [s for s in specs if s in KEYWORDS]
    if keywords and len(specs) > 1:
        raise LabelSourceError(
            f"--labels {keywords[0]} cannot be combined with other --labels; several --labels "
            "are for label files (list files and manifests), merged"
        )


def plan_labels(
    src: Path,
    spec: str | Sequence[str],
    *,
    exclude: tuple[str, ...] = (),
    depth: int = 1,
    class_map: str | None = None,
) -> LabelPlan:
    """Resolve ``--labels`` into the files to pack and their labels.

    Args:
        src: SRC.
        spec: ``auto`` (class folders when SRC has subfolders, else none), ``dirname``,
            ``sidecar``, ``none``, or the path(s) of label files: list files (PaddleOCR,
            PaddleClas), MXNet ``.lst``, ``.jsonl`` or ``.csv`` manifests, merged.
        exclude: real paths the scan must not enter (the output being written).
        depth: for class folders, how many folder levels name the class.
        class_map: ``auto`` or a file of class names: text labels become class ids.

    Raises:
        LabelSourceError: a label source that cannot be used at all.
    """
    specs = (spec,) if isinstance(spec, str) else tuple(spec)
    check_specs(specs)
    if specs[0] not in KEYWORDS:
        return from_label_files(src, specs, class_map=class_map)
    kind = specs[0]
    scan = scan_tree(src, exclude=exclude)
    if kind == "sidecar":
        items, bad, both = sidecar_labels(scan)
        plan = LabelPlan(
            [],
            [*scan.problems, *bad],
            "sidecar",
            ignored=scan.ignored,
            extra={"sidecar_both": both},
        )
        if class_map is None:
            plan.entries = [entry for entry, _ in items]
        else:
            labels = (entry.label for entry, _ in items if entry.labelled)
            _finish_class_map(plan, items, src, class_map, labels)
        plan.problems.sort(key=lambda p: p.path)
        return plan
    if kind == "dirname" or (kind == "auto" and scan.top_dirs):
        if not scan.top_dirs:
            raise LabelSourceError(
                f"--labels dirname: {src} has no class folders (found only files); use "
                "--labels none or a list file"
            )
        classes, items = dirname_labels(scan, src, depth=depth, exclude=exclude)
        if not classes:
            raise LabelSourceError(
                f"--labels dirname --label-depth {depth}: no folders {depth} levels under {src} "
                f"(found the top-level folders {scan.top_dirs[:10]}); use a smaller "
                "--label-depth"
            )
        plan = LabelPlan([], list(scan.problems), "dirname", ignored=scan.ignored)
        if class_map is None or class_map == "auto":
            plan.entries = _apply_class_map(items, ClassMap(classes, "auto"), plan.problems)
            plan.classes, plan.class_map = classes, "auto"
        else:
            _finish_class_map(plan, items, src, class_map, ())
        plan.problems.sort(key=lambda p: p.path)
        return plan
    if class_map is not None:
        raise LabelSourceError(
            f"--class-map {class_map}: there are no labels to map (--labels {kind}"
            + (" found no class folders under SRC" if kind == "auto" else "")
            + ")"
        )
    return LabelPlan(
        [Entry(f, None) for f in scan.files], list(scan.problems), "none", ignored=scan.ignored
    )
