"""``.idx`` files, and finding the ``.rec`` / ``.idx`` pair a path names.

An ``.idx`` file holds ``key<TAB>offset`` lines, as MXNet writes them.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import numpy.typing as npt

from readers.formats.layout import META_NAME
from readers.formats.recordio.records import RecordIOFormatError

_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def format_idx_line(key: int, offset: int) -> str:
    r"""Return the ``.idx`` line for a record: ``"{key}\t{offset}\n"`` (as MXNet writes it)."""
    return f"{int(key)}\t{int(offset)}\n"


def read_idx(path: str | os.PathLike[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Load a ``.idx`` file into ``(keys, offsets)`` int64 arrays, in file order.

    Lines are ``key<TAB>offset`` with integer key and offset; blank lines (such as a trailing
    newline) are ignored. Duplicate keys are kept as they are; the caller decides.

    Raises:
        RecordIOFormatError: naming ``path:line`` of the first malformed line.
    """
    try:
        # numpy's C parser handles the common, well-formed case fast.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = np.loadtxt(
                path, dtype=np.int64, delimiter="\t", comments=None, ndmin=2, encoding="ascii"
            )
    except (ValueError, UnicodeError, UserWarning):
        table = None
    if table is not None and table.shape[1] == 2 and (table[:, 1] >= 0).all():
        return np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])
    # Anything unusual: parse line by line, to name the first bad line exactly.
    return _read_idx_slow(path)


def _read_idx_slow(
    path: str | os.PathLike[str],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    keys: list[int] = []
    offsets: list[int] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line:
                continue
            fields = [field.strip() for field in line.split(b"\t")]
            problem = ""
            if len(fields) != 2:
                problem = f"found {len(fields)} tab-separated fields"
            elif not all(_INT.fullmatch(field.decode("latin-1")) for field in fields):
                problem = "key and offset must be integers"
            else:
                key, offset = int(fields[0]), int(fields[1])
                if not _INT64_MIN <= key <= _INT64_MAX:
                    problem = "key does not fit in int64"
                elif not 0 <= offset <= _INT64_MAX:
                    problem = "offset must be a non-negative int64"
            if problem:
                raise RecordIOFormatError(
                    f"{os.fspath(path)}:{lineno}: malformed .idx line {raw!r}: {problem}; "
                    "expected 'key<TAB>offset'"
                )
            keys.append(key)
            offsets.append(offset)
    return np.asarray(keys, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


REC_SUFFIX = ".rec"
IDX_SUFFIX = ".idx"


def find_recordio_pair(path: str | os.PathLike[str]) -> tuple[Path, Path | None] | None:
    """The ``.rec`` file (and its ``.idx``, if any) that `path` names, or None.

    `path` may be the ``.rec`` file, its ``.idx``, their common prefix (``data/train`` for
    ``data/train.rec``), or a directory holding exactly one ``.rec`` (an InsightFace dataset
    folder). A packed dataset directory (with ``meta.json``) is not a bare pair.
    """
    p = Path(path)

    def with_idx(rec: Path) -> tuple[Path, Path | None]:
        idx = rec.with_suffix(IDX_SUFFIX)
        return rec, idx if idx.is_file() else None

    if p.is_file():
        if p.suffix == REC_SUFFIX:
            return with_idx(p)
        if p.suffix == IDX_SUFFIX and p.with_suffix(REC_SUFFIX).is_file():
            return p.with_suffix(REC_SUFFIX), p
        return None
    if p.is_dir():
        if (p / META_NAME).exists():
            return None
        recs = sorted(q for q in p.glob(f"*{REC_SUFFIX}") if q.is_file())
        return with_idx(recs[0]) if len(recs) == 1 else None
    prefixed = Path(f"{p}{REC_SUFFIX}")
    if prefixed.is_file():
        return with_idx(prefixed)
    return None
