"""Opening an LMDB shard for reading: read-only and without locks.

A shard is never opened over a data file shorter than the pages its header says it has.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from readers import handles
from readers.errors import DatasetFormatError
from readers.formats.lmdb.keys import DATA_FILE


def open_lmdb_readonly(path: str) -> Any:
    """Open an LMDB environment for reading only: no lock file, no write access needed.

    LMDB maps the file and reads pages straight from the mapping, so a ``data.mdb`` cut short
    (an interrupted copy, a full disk) would kill the process with SIGBUS at the first read
    past its end.  The file's size is therefore checked against the last page the
    environment uses before the environment is handed out.

    Raises:
        DatasetFormatError: not an LMDB, or its data file is shorter than its pages.
    """
    import lmdb

    from readers.files import check_regular  # here: readers.files imports readers.formats

    data = os.path.join(path, DATA_FILE)
    with contextlib.suppress(FileNotFoundError):  # missing: lmdb.open says so
        check_regular(data)  # py-lmdb would block forever opening a FIFO
    try:
        env = lmdb.open(
            path,
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=2048,
            subdir=True,
            create=False,
        )
    except lmdb.Error as exc:
        raise DatasetFormatError(f"{data}: cannot open as an LMDB ({exc})") from exc
    try:
        page = int(env.stat()["psize"])
        last = int(env.info()["last_pgno"])
        size = os.path.getsize(data)
    except (lmdb.Error, OSError) as exc:
        env.close()
        raise DatasetFormatError(f"{data}: cannot read the LMDB header ({exc})") from exc
    needed = (last + 1) * page
    if size < needed:
        env.close()
        raise DatasetFormatError(
            f"{data}: {size} bytes, but its last page (number {last}, {page}-byte pages) ends at "
            f"byte {needed}: the file is cut short (an interrupted copy or a full disk?)"
        )
    return env


def shared_lmdb(path: str) -> Any:
    """The process's read-only LMDB environment for the shard directory `path`."""
    data = os.path.join(path, DATA_FILE)
    return handles.shared_handle("lmdb", path, open_lmdb_readonly, identity=data)
