"""Parquet files, as the Hugging Face ``datasets`` library writes them, as an input of convert.

IN is one or more ``.parquet`` files, or a directory of them (every ``.parquet`` file under it,
hidden names skipped, in path order): ``data/train-00000-of-00002.parquet``, ... Each row is one
sample. Its image is one column: a binary column, or a struct whose binary ``bytes`` field holds
the encoded image (the ``datasets`` ``Image`` feature: ``{bytes, path}``). Its label is one
column (the value as JSON), several columns (a JSON object, keys the column names in the order
given), or none. Both are guessed from the first file when the choice is unambiguous: one image
column (the ``Image`` columns of the ``huggingface`` schema metadata, else the binary and
``{bytes, ...}`` columns) and at most one other column that can be a label. A ``ClassLabel``
column of that metadata keeps its ids as labels (-1, ``datasets``' "no label", is null); a
single such column gives meta.json its ``classes``.

Rows are named ``FILE#row N`` (FILE relative to the directory given, or to the one that holds
every file given; N from 0 within the file), or by the struct's ``path`` where it holds one. A
row without image bytes (null, or a struct with only a path: the file it names is not read) is
``missing``, one with 0 bytes ``empty``, and every image passes the decode check of a bare
input (`packer.prepare`), so a non-image is ``not_image``. Files are read a few rows at a time
(`BATCH_ROWS`), page by page, never more than one row group at once: once for the image sizes
that plan the shards, once to convert. Memory is bounded by the writer's row group, not by the
file or the dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import ConfigError, PackerError
from packer.labels.common import nonfinite_label
from packer.problems import BAD_LABEL, EMPTY, MISSING, Problem
from packer.repack import Item, RepackSource

PARQUET_SUFFIX = ".parquet"
MAGIC = b"PAR1"
BATCH_ROWS = 64
"""Rows taken at a time: a batch of images is what a conversion holds as Python bytes (besides
the pages of the row group pyarrow decodes, which the writer sized: ``datasets`` writes 100
rows per group for image datasets)."""
HF_METADATA_KEY = b"huggingface"
"""The schema metadata key under which ``datasets`` stores its features as JSON."""
INT64_RANGE = range(-(2**63), 2**63)


class ParquetInputError(PackerError):
    """A Parquet file convert cannot read, or that changed while it was read."""


@dataclass(frozen=True)
class ParquetPart:
    """One Parquet file of IN: its path, its name in messages, its rows per row group."""

    path: Path
    name: str
    group_rows: tuple[int, ...]
    first: int = 0  # the global number of its first row

    @property
    def rows(self) -> int:
        """The number of rows of the file."""
        return sum(self.group_rows)


@dataclass(frozen=True)
class ParquetColumns:
    """The columns a conversion reads, and the ``ClassLabel`` names of its label columns."""

    image: str
    struct: bool  # the image column is a {bytes, path} struct (else binary)
    labels: tuple[str, ...] = ()
    class_names: dict[str, list[str]] = field(default_factory=dict)


def is_parquet_file(path: Path) -> bool:
    """True when `path` is a file named ``*.parquet`` or that starts with Parquet's magic."""
    if not path.is_file():
        return False
    if path.suffix.lower() == PARQUET_SUFFIX:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def parquet_files_under(root: Path) -> list[Path]:
    """The ``.parquet`` files under directory `root`, hidden names skipped, in path order."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [
            Path(folder, f)
            for f in files
            if f.lower().endswith(PARQUET_SUFFIX) and not f.startswith(".")
        ]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _is(t: Any, *kinds: str) -> bool:
    """True when arrow type `t` is one of `kinds`, as ``pyarrow.types.is_<kind>`` tells.

    The view types are newer than the oldest pyarrow supported: skipped where it lacks them.
    """
    import pyarrow as pa

    return any(getattr(pa.types, f"is_{kind}", lambda _: False)(t) for kind in kinds)


BINARY = ("binary", "large_binary", "fixed_size_binary", "binary_view")
LISTS = ("list", "large_list", "fixed_size_list", "list_view", "large_list_view")
SCALARS = ("integer", "float32", "float64", "boolean", "string", "large_string", "string_view")


def image_kind(t: Any) -> str | None:
    """``binary`` or ``struct`` when a column of arrow type `t` can hold images, else None."""
    if _is(t, *BINARY):
        return "binary"
    if _is(t, "struct"):
        at = t.get_field_index("bytes")
        if at >= 0 and _is(t.field(at).type, *BINARY):
            return "struct"
    return None


def is_label_type(t: Any) -> bool:
    """True when the values of a column of arrow type `t` are JSON: numbers, text, lists..."""
    if _is(t, "dictionary"):
        return is_label_type(t.value_type)
    if _is(t, *LISTS):
        return is_label_type(t.value_type)
    if _is(t, "struct"):
        return all(is_label_type(t.field(i).type) for i in range(t.num_fields))
    return _is(t, *SCALARS, "null")


def hf_features(schema: Any, name: str) -> dict[str, Any]:
    """The ``datasets`` features (column -> feature JSON) of a file's schema metadata, or {}.

    Raises:
        ParquetInputError: the ``huggingface`` metadata is there but is not JSON.
    """
    raw = (schema.metadata or {}).get(HF_METADATA_KEY)
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ParquetInputError(
            f"{name}: its {HF_METADATA_KEY.decode()!r} schema metadata is not JSON ({exc})"
        ) from None
    info = doc.get("info") if isinstance(doc, dict) else None
    features = info.get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else {}


def class_label_names(feature: Any) -> list[str] | None:
    """The names of a ``{"_type": "ClassLabel", "names": [...]}`` feature, else None."""
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    return None


def _feature_type(features: dict[str, Any], column: str) -> Any:
    """The ``_type`` of a column's ``datasets`` feature (``Image``, ``ClassLabel``), or None."""
    feature = features.get(column)
    return feature.get("_type") if isinstance(feature, dict) else None


def _listed(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) or "none"


def choose_columns(
    schema: Any,
    features: dict[str, Any],
    name: str,
    *,
    image_column: str | None,
    label_columns: Sequence[str],
) -> ParquetColumns:
    """The image and label columns of a file with `schema`, as asked or guessed.

    Raises:
        ConfigError: a column asked for is not there or cannot serve, or the guess is
            ambiguous or finds no image column; the message lists the columns and the fix.
    """
    names = list(schema.names)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # pyarrow cannot select such a column by name
        raise ConfigError(f"{name}: the column names {_listed(twice)} are there twice")
    types = {n: schema.field(n).type for n in names}

    def column(option: str, col: str) -> Any:
        if col not in types:
            raise ConfigError(
                f"{option} {col!r}: {name} has no such column (columns: {_listed(names)})"
            )
        return types[col]

    if image_column is None:
        marked = [
            n for n in names if _feature_type(features, n) == "Image" and image_kind(types[n])
        ]
        found = marked or [n for n in names if image_kind(types[n])]
        if len(found) != 1:
            what = "no column" if not found else f"{len(found)} columns ({_listed(found)})"
            raise ConfigError(
                f"{name}: {what} could hold the images (a binary column, or a struct with a "
                f"binary 'bytes' field as the datasets Image feature stores it); name it with "
                f"--image-column (columns: {_listed(names)})"
            )
        image = found[0]
    else:
        image = image_column
        if image_kind(column("--image-column", image)) is None:
            raise ConfigError(
                f"--image-column {image!r}: a column of type {types[image]} in {name}; expected "
                "a binary column or a struct with a binary 'bytes' field (the datasets Image "
                "feature)"
            )
    if label_columns:
        labels = tuple(label_columns)
        for col in labels:
            if labels.count(col) > 1:
                raise ConfigError(f"--label-column {col!r} is given twice")
            if col == image:
                raise ConfigError(f"--label-column {col!r} is the image column")
            if not is_label_type(column("--label-column", col)):
                raise ConfigError(
                    f"--label-column {col!r}: a column of type {types[col]} in {name}; a label "
                    "is numbers, text or booleans (or lists and structs of them)"
                )
    else:
        found = [n for n in names if n != image and is_label_type(types[n])]
        if len(found) > 1:
            raise ConfigError(
                f"{name}: {len(found)} columns could be the label ({_listed(found)}); name it "
                "with --label-column (repeat it to take several as a JSON object)"
            )
        labels = tuple(found)
    return ParquetColumns(
        image, image_kind(types[image]) == "struct", labels, _class_names(schema, features, labels)
    )


def _class_names(
    schema: Any, features: dict[str, Any], labels: tuple[str, ...]
) -> dict[str, list[str]]:
    """The ClassLabel names of the integer columns among `labels`."""
    import pyarrow as pa

    classes = {}
    for col in labels:
        names = class_label_names(features.get(col))
        if names is not None and pa.types.is_integer(schema.field(col).type):
            classes[col] = names
    return classes


def check_columns(
    schema: Any, features: dict[str, Any], name: str, columns: ParquetColumns
) -> None:
    """Refuse a file after the first whose columns differ from those of the first file.

    Raises:
        ConfigError: a column is missing or of another kind, or the ClassLabel names differ.
    """
    names = list(schema.names)
    same = "convert files of one schema together"
    twice = sorted({n for n in names if names.count(n) > 1} & {columns.image, *columns.labels})
    if twice:
        raise ConfigError(f"{name}: the column names {_listed(twice)} are there twice")
    for col in (columns.image, *columns.labels):
        if col not in names:
            raise ConfigError(
                f"{name} has no column {col!r}, which the first file has (columns: "
                f"{_listed(names)}); {same}"
            )
    image_type = schema.field(columns.image).type
    if image_kind(image_type) != ("struct" if columns.struct else "binary"):
        raise ConfigError(
            f"{name}: its image column {columns.image!r} is {image_type}, another type than "
            f"in the first file; {same}"
        )
    for col in columns.labels:
        if not is_label_type(schema.field(col).type):
            raise ConfigError(
                f"{name}: its column {col!r} is {schema.field(col).type}, not a label as in "
                f"the first file; {same}"
            )
    found = _class_names(schema, features, columns.labels)
    if found != columns.class_names:
        raise ConfigError(
            f"{name}: its ClassLabel names ({found}) differ from the first file's "
            f"({columns.class_names}); {same}"
        )


def _label_problem(label: Any) -> str | None:
    """Why `label` cannot be stored as a label (NaN, an integer beyond int64), else None."""
    found = nonfinite_label(label)
    if found is not None:
        return found
    stack = [label]
    while stack:
        value = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and value not in INT64_RANGE:
            return f"the label holds {value}, beyond a 64-bit signed integer"
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return None


@contextlib.contextmanager
def _reading(part: ParquetPart) -> Iterator[Any]:
    """`part` open for reading; what pyarrow cannot read raises `ParquetInputError`.

    pyarrow reports a damaged page as a plain ``OSError``, as the disk's own errors: both end
    the convert with one message naming the file (a rerun starts afresh).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # pre_buffer would read every row group asked for at once; buffered: page by page
        with pq.ParquetFile(part.path, pre_buffer=False, buffer_size=1 << 20) as f:
            yield f
    except (pa.ArrowException, OSError) as exc:
        detail = " ".join(str(exc).split())  # pyarrow's messages span lines
        raise ParquetInputError(f"{part.name}: cannot be read ({detail})") from None


class ParquetRows:
    """The rows of IN's Parquet files as convert items, read a batch at a time."""

    def __init__(
        self, parts: list[ParquetPart], columns: ParquetColumns, *, decode_check: bool
    ) -> None:
        self.parts = parts
        self.columns = columns
        self.decode_check = decode_check

    def sizes(self) -> list[int]:
        """The stored size of each row's image, in row order (0 for a row without one)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        sizes: list[int] = []
        for part in self.parts:
            with _reading(part) as f:
                for batch in f.iter_batches(
                    batch_size=BATCH_ROWS, columns=[self.columns.image], use_threads=False
                ):
                    images = batch.column(0)
                    if self.columns.struct:
                        images = pc.struct_field(images, "bytes")
                    if _is(images.type, "binary_view"):  # binary_length has no kernel for it
                        images = images.cast(pa.large_binary())
                    sizes += pc.binary_length(images).fill_null(0).to_pylist()
        return sizes

    def read(self, start: int, stop: int) -> Iterator[Item]:
        """Yield the items of rows ``start..stop-1`` (global row numbers), in order."""
        for part in self.parts:
            lo = max(start, part.first) - part.first  # within the part
            hi = min(stop, part.first + part.rows) - part.first
            if lo < hi:
                yield from self._read_part(part, lo, hi)

    def _read_part(self, part: ParquetPart, lo: int, hi: int) -> Iterator[Item]:
        groups: list[int] = []  # the row groups that hold rows lo..hi-1
        skip = at = 0  # skip: the rows of the first of them before lo
        for number, rows in enumerate(part.group_rows):
            if at + rows > lo and at < hi:
                skip = skip if groups else lo - at
                groups.append(number)
            at += rows
        cols = [self.columns.image, *self.columns.labels]
        row = lo
        with _reading(part) as f:
            if f.metadata.num_rows != part.rows:
                raise ParquetInputError(
                    f"{part.name} changed while it was converted ({part.rows} rows before, "
                    f"{f.metadata.num_rows} now); run the convert again"
                )
            batches = f.iter_batches(
                batch_size=BATCH_ROWS, row_groups=groups, columns=cols, use_threads=False
            )
            for batch in batches:
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                batch = batch.slice(skip, hi - row)
                skip = 0
                values = [batch.column(i).to_pylist() for i in range(len(cols))]
                for k in range(batch.num_rows):
                    yield self._item(part, row + k, values[0][k], [v[k] for v in values[1:]])
                row += batch.num_rows
                if row >= hi:
                    return

    def _item(self, part: ParquetPart, row: int, image: Any, labels: list[Any]) -> Item:
        col = self.columns.image
        where = f"{part.name}#row {row}"
        data, path = image, None
        if self.columns.struct and image is not None:
            data, path = image.get("bytes"), image.get("path")
        name = path if isinstance(path, str) and path else where
        if data is None:
            if path:
                why = f"only the path {path!r}, no bytes: convert reads no file a path names"
            else:
                why = "null"
            return Problem(name, MISSING, f"no image in column {col!r} of {where} ({why})")
        if not data:
            return Problem(name, EMPTY, f"column {col!r} of {where} holds 0 bytes")
        label, problem = self._label(labels)
        if problem is not None:
            return Problem(name, BAD_LABEL, f"{where}: {problem}")
        from packer.prepare import prepare_bytes

        return prepare_bytes(name, bytes(data), label, decode_check=self.decode_check)

    def _label(self, values: list[Any]) -> tuple[Any, str | None]:
        """The label of a row from its label columns' values, or why it has none."""
        cols = self.columns.labels
        if not cols:
            return None, None
        kept = []
        for col, value in zip(cols, values, strict=True):
            names = self.columns.class_names.get(col)
            if names is not None and value is not None:
                if value == -1:  # datasets' ClassLabel for "no label" (e.g. a test split)
                    value = None
                elif not 0 <= value < len(names):
                    return None, (
                        f"column {col!r} holds {value}, not a class id of its ClassLabel "
                        f"({len(names)} names)"
                    )
            kept.append(value)
        label = kept[0] if len(cols) == 1 else dict(zip(cols, kept, strict=True))
        return label, _label_problem(label)


def _open_part(path: Path, name: str, first: int) -> tuple[ParquetPart, Any]:
    """The part at `path` and its schema (the file is not read beyond its footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as f:
            meta = f.metadata
            groups = tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
            return ParquetPart(path, name, groups, first), f.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise ParquetInputError(f"{name}: not a Parquet file convert can read ({detail})") from None


def parquet_parts(inputs: Sequence[Path]) -> list[tuple[Path, str]]:
    """Every Parquet file of `inputs` (files, or directories of them) and its name in paths.

    A directory's files are named relative to it; files given as INs, relative to the deepest
    directory that holds them all (one file: its name).

    Raises:
        ParquetInputError: a directory holds no Parquet file, or a file is named twice.
    """
    found: list[tuple[Path, str]] = []
    files = [os.path.abspath(item) for item in inputs if not item.is_dir()]
    top = os.path.commonpath([os.path.dirname(f) for f in files]) if files else ""
    for item in inputs:
        if item.is_dir():
            under = parquet_files_under(item)
            if not under:
                raise ParquetInputError(f"{item}: a directory without .parquet files")
            found += [(f, f.relative_to(item).as_posix()) for f in under]
        else:  # named from the directory that holds every file IN: data/*.parquet -> train-...
            found.append((item, Path(os.path.relpath(os.path.abspath(item), top)).as_posix()))
    seen: set[str] = set()
    for path, _ in found:
        real = os.path.realpath(path)
        if real in seen:
            raise ParquetInputError(f"{path}: the same Parquet file is given twice")
        seen.add(real)
    return found


def open_parquet(
    inputs: Sequence[Path],
    *,
    image_column: str | None = None,
    label_columns: Sequence[str] = (),
    decode_check: bool = True,
) -> RepackSource:
    """The rows of the Parquet files `inputs` (or directories of them) as a repack source.

    Raises:
        ParquetInputError: a file cannot be read as Parquet.
        ConfigError: the columns asked for cannot serve, or cannot be guessed.
    """
    parts: list[ParquetPart] = []
    columns: ParquetColumns | None = None
    first = 0
    for path, name in parquet_parts(inputs):
        part, schema = _open_part(path, name, first)
        features = hf_features(schema, name)
        if columns is None:
            columns = choose_columns(
                schema, features, name, image_column=image_column, label_columns=label_columns
            )
        else:
            check_columns(schema, features, name, columns)
        parts.append(part)
        first += part.rows
    assert columns is not None  # parquet_parts gives at least one file
    rows = ParquetRows(parts, columns, decode_check=decode_check)
    identity = "\n".join(
        f"{os.path.realpath(p.path)}:{st.st_size}:{st.st_mtime_ns}"
        for p in parts
        for st in [os.stat(p.path)]
    )
    single = len(columns.labels) == 1 and columns.labels[0] in columns.class_names
    options: dict[str, Any] = {
        "decode_check": decode_check,
        "image_column": columns.image,
        "label_columns": list(columns.labels),
    }
    if columns.class_names and not single:
        options["class_names"] = columns.class_names
    return RepackSource(
        sizes=rows.sizes(),
        read=rows.read,
        identity=f"parquet\n{identity}",
        inputs=[*inputs, *(p.path for p in parts)],
        source=" ".join(str(p) for p in inputs),
        options=options,
        classes=columns.class_names[columns.labels[0]] if single else None,
        label_source="parquet" if columns.labels else "none",
    )
