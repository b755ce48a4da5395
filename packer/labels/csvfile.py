"""CSV manifests: a header row naming ``path`` and ``label`` columns.

Clean files are read with pyarrow, the rest with the csv module (line by line, each bad line
reported).
"""

from __future__ import annotations

import codecs
import csv
import io
from pathlib import Path
from typing import Any

from packer.errors import LabelSourceError
from packer.labels.common import Listed, Parsed, bad_line, int_or_none, loads_label, shorten
from packer.problems import Problem

_CSV_FIELD_LIMIT = (1 << 31) - 1


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
        number = int_or_none(stripped)
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
            bad.append(bad_line(name, path, start, f"not a CSV row ({exc})"))
            continue
        if width < 0:  # the header
            width = len(row)
            continue
        if not row:  # a blank line
            continue
        count += 1
        if not _valid_utf8(*row):
            bad.append(bad_line(name, path, start, "not UTF-8 text"))
        elif len(row) != width:
            bad.append(
                bad_line(
                    name,
                    path,
                    start,
                    f"expected {width} fields as in the header, got "
                    f"{len(row)}: {shorten(','.join(row))}",
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
            parsed.bad.append(bad_line(name, path, number, "an empty path cell"))
            continue
        parsed.listed.append(_csv_listed(f"{name}:{number}", rel.strip(), cell, names=names))
    return parsed
