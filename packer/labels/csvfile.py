"""CSV manifests: a header row naming ``path`` and ``label`` columns.

Clean files are read with pyarrow, the rest with the csv module (line by line, each bad line
reported). A file with a line past `MAX_LINE_BYTES` is read line by line, that line unread.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from packer.errors import LabelSourceError
from packer.labels.common import (
    MAX_LINE_BYTES,
    Listed,
    LongLine,
    Parsed,
    bad_line,
    bounded_lines,
    int_or_none,
    loads_label,
    shorten,
)
from packer.problems import Problem


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


@contextlib.contextmanager
def _field_limit(limit: int) -> Iterator[None]:
    """The csv module's field size limit (process-wide) set to `limit` inside the block."""
    saved = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(saved)


def csv_rows_python(
    text: str, path: Path | str, path_col: int, label_col: int
) -> tuple[list[tuple[int, str, str]], list[Problem], int]:
    """(line, path cell, label cell) rows, bad lines, and the number of data rows.

    `text` is the file decoded with ``surrogateescape``, so a line that is not UTF-8 is
    reported instead of failing the file.
    """
    # lines end at "\n" only, as for list files and in the pyarrow path; a lone "\r" outside
    # quotes is then a csv.Error on its line
    return _csv_rows(io.StringIO(text, newline="\n"), path, path_col, label_col)


def _csv_rows(
    lines: Iterable[str],
    path: Path | str,
    path_col: int,
    label_col: int,
    *,
    before: int = 0,
    width: int = -1,
    bad: list[Problem] | None = None,
) -> tuple[list[tuple[int, str, str]], list[Problem], int]:
    """`csv_rows_python` over `lines`, which come after `before` lines of the file.

    With `width` (the header's, already read) every row is data. A field (spanning lines)
    past `MAX_LINE_BYTES` is a bad line. `bad` may hold problems already, and grow as `lines`
    is read.
    """
    name = Path(path).name
    reader = csv.reader(lines)
    rows: list[tuple[int, str, str]] = []
    bad = [] if bad is None else bad
    count = 0
    with _field_limit(MAX_LINE_BYTES):
        while True:
            start = before + reader.line_num + 1
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


def _may_have_long_line(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> bool:
    r"""Whether a line of `f` may be longer than `limit` bytes, read `limit` bytes at a time.

    Lines between two line ends of one piece are shorter: only the runs across pieces are
    measured (a ``\r`` before a line end counts, so a line of exactly `limit` bytes and
    ``\r\n`` may be taken as long: `bounded_lines` then measures it exactly).
    """
    since = 0  # bytes since the last "\n"
    while block := f.read(limit):
        first = block.find(b"\n")
        if first < 0:
            since += len(block)
        elif since + first > limit:
            return True
        else:
            since = len(block) - block.rfind(b"\n") - 1
        if since > limit:
            return True
    return False


class _CsvLines:
    """The lines of a CSV for the csv module, each `LongLine` as a blank line.

    Each long line is reported in `bad` as it is read, and counted in ``longs``.
    """

    def __init__(
        self, raws: Iterable[bytes | LongLine], path: Path | str, bad: list[Problem], *, before: int
    ) -> None:
        self.raws, self.path, self.bad, self.before = raws, path, bad, before
        self.longs = 0

    def __iter__(self) -> Iterator[str]:
        name = Path(self.path).name
        for number, raw in enumerate(self.raws, start=self.before + 1):
            if isinstance(raw, LongLine):
                self.longs += 1
                self.bad.append(bad_line(name, self.path, number, raw.message()))
                yield "\n"
            else:
                yield raw.decode("utf-8", "surrogateescape") + "\n"


def read_csv(path: Path, *, names: bool = False) -> Parsed:
    """Parse the CSV manifest at `path` (`parse_csv`), no line of it read whole past the bound.

    A file with no line past `MAX_LINE_BYTES` is read whole and parsed as `parse_csv` does;
    otherwise it is read line by line, each long line reported as a bad line unread.

    Raises:
        LabelSourceError: no header with ``path`` and ``label`` columns.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size <= MAX_LINE_BYTES or not _may_have_long_line(f):
            f.seek(0)
            return parse_csv(f.read(), path, names=names)
        f.seek(0)
        raws = bounded_lines(f)
        first = next(raws)
        if isinstance(first, LongLine):
            raise LabelSourceError(f"--labels {path}: the header row is {first.message()}")
        header, path_col, label_col = _csv_header(
            first.decode("utf-8", "surrogateescape").removeprefix("\ufeff"), path
        )
        lines = _CsvLines(raws, path, [], before=1)
        rows, bad, count = _csv_rows(
            lines, path, path_col, label_col, before=1, width=len(header), bad=lines.bad
        )
    return _parsed_csv(rows, bad, count + lines.longs, path, names=names)


def parse_csv(data: bytes, path: Path | str, *, names: bool = False) -> Parsed:
    """Parse a CSV manifest with a header row naming ``path`` and ``label`` columns.

    A label cell that is a JSON array or object becomes that JSON (``[1,2]``, boxes); a
    canonical integer becomes a class id (kept as text with ``names``); anything else is
    kept as written; an empty cell is an entry without a label.  Clean files are read with
    pyarrow; files it rejects are re-read line by line, so each bad line is reported.

    Raises:
        LabelSourceError: no header with ``path`` and ``label`` columns.
    """
    text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    header, path_col, label_col = _csv_header(text, path)
    rows = csv_rows_arrow(data, header, path_col, label_col)
    if rows is None:
        rows, bad, count = csv_rows_python(text, path, path_col, label_col)
        return _parsed_csv(rows, bad, count, path, names=names)
    return _parsed_csv(rows, [], len(rows), path, names=names)


def _parsed_csv(
    rows: list[tuple[int, str, str]],
    bad: list[Problem],
    count: int,
    path: Path | str,
    *,
    names: bool,
) -> Parsed:
    """The `Parsed` of a CSV manifest from its rows, bad lines and count of data rows."""
    name = Path(path).name
    parsed = Parsed("csv", bad=bad, lines=count)
    for number, rel, cell in rows:
        if not rel.strip():
            parsed.bad.append(bad_line(name, path, number, "an empty path cell"))
            continue
        parsed.listed.append(_csv_listed(f"{name}:{number}", rel.strip(), cell, names=names))
    return parsed
