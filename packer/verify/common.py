"""What ``packer verify`` checks the same way in every format.

What ``packer verify`` checks the same way in every format: the entries of OUT (only the
dataset's own, each a regular file), meta.json and its shard table, errors.jsonl, index.jsonl
line by line (ids, shard, SHA-256), and decoding (``--deep``): as readers decode, and through
the very check the build puts its inputs to (`packer.prepare.prepare_bytes`), so that
``verify --deep`` is at least as strict as ``packer build``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.prepare import prepare_bytes
from packer.problems import Problem
from packer.transform import Transform
from readers.columnar import COMPRESSIONS
from readers.decode import decode_sample, decompress
from readers.errors import DatasetFormatError
from readers.files import DATASET_FILES, describe_mode, open_regular
from readers.formats.base import ShardFormat
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME
from readers.staging.cache import STAGING

Report = Callable[[str], None]
"""Called once per problem found, with the line ``packer verify`` prints."""

Rows = Iterator[tuple[int, dict[str, Any]]]
"""``(shard number, index row)`` for each well-formed index line, in id order."""

MAX_LISTED = 20
"""Problems of one kind listed one by one before they are counted instead."""


def read_index(root: Path, meta: dict[str, Any]) -> Iterator[str | dict[str, Any]]:
    """The index rows, or problem lines where a row is malformed."""
    path = root / INDEX_NAME
    digest = hashlib.sha256()
    count = 0
    try:
        f = open_regular(path)
    except OSError as exc:
        yield f"{INDEX_NAME}: cannot read ({exc})"
        return
    except DatasetFormatError as exc:  # a FIFO, a directory...: reading it would block or fail
        yield str(exc)
        return
    with f:
        for n, raw in enumerate(f):
            digest.update(raw)
            count += 1
            if not raw.endswith(b"\n"):
                yield f"{INDEX_NAME}:{n + 1}: the last line is cut short (torn write?)"
                continue
            try:
                row = json.loads(raw)
            except ValueError as exc:
                yield f"{INDEX_NAME}:{n + 1}: not JSON ({exc})"
                continue
            if not isinstance(row, dict) or row.get("id") != n:
                got = row.get("id") if isinstance(row, dict) else row
                yield f"{INDEX_NAME}:{n + 1}: id is {got}, expected {n}"
                continue
            yield row
    if count != meta.get("num_samples"):
        yield f"{INDEX_NAME}: {count} lines but {META_NAME} says {meta.get('num_samples')}"
    recorded = meta.get("index_sha256")
    if recorded and recorded != digest.hexdigest():
        yield f"{INDEX_NAME}: SHA-256 differs from the one recorded in {META_NAME} (edited?)"


HARMLESS = frozenset({"lock.mdb"})
"""Entries of a shard directory that are not the dataset's but do no harm (LMDB's lock file,
which the build leaves and any LMDB tool may create)."""


def _kind(path: Path) -> str:
    return describe_mode(os.lstat(path).st_mode)


def check_entries(root: Path, meta: dict[str, Any], fmt: ShardFormat, report: Report) -> bool:
    """Report foreign entries of OUT, and named ones that are not regular files.

    Report the entries of OUT the dataset does not name (``foreign entry: NAME (kind)``),
    and named ones that are links or not regular files.

    A staged copy (``readers.staging``) links its shards and keeps its state in ``.staging``:
    there links are expected. Returns False when a shard file or the index is not a regular
    file, so that the checks that would open it (and block on a FIFO) are skipped.
    """
    staged = (root / STAGING / "origin.json").is_file()
    files = {rel for s in meta["shards"] for rel in fmt.shard_files(str(s["name"]))}
    tops = {rel.split("/", 1)[0] for rel in files}
    shard_ok = True
    for entry in sorted(os.listdir(root)):
        path = root / entry
        if entry in DATASET_FILES or entry in files:
            problem = _regular_problem(path, entry, staged=staged)
            if problem:
                report(problem)
                if not path.is_file() and (entry in files or entry == INDEX_NAME):
                    shard_ok = False
        elif entry in tops:  # a shard directory: its named files and harmless ones only
            if not path.is_dir() or (path.is_symlink() and not staged):
                report(f"{entry}: is a {_kind(path)}, expected the shard's directory")
                shard_ok = False
                continue
            for inner in sorted(os.listdir(path)):
                rel = f"{entry}/{inner}"
                if rel in files:
                    problem = _regular_problem(path / inner, rel, staged=staged)
                    if problem:
                        report(problem)
                        shard_ok = shard_ok and (path / inner).is_file()
                elif inner not in HARMLESS:
                    report(f"foreign entry: {rel} ({_kind(path / inner)})")
        elif not (staged and entry == STAGING):
            report(f"foreign entry: {entry} ({_kind(path)})")
    return shard_ok


def _regular_problem(path: Path, rel: str, *, staged: bool) -> str | None:
    """What is wrong with the dataset file `path` (shown as `rel`), or None."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and not staged:
        return (
            f"{rel}: is a symbolic link (to {os.readlink(path)}), expected a regular file; "
            "packer stage copies no linked file"
        )
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{rel}: cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"{rel}: is a {describe_mode(st.st_mode)}, not a regular file"
    return None


def check_shard_table(root: Path, meta: dict[str, Any], report: Report) -> list[int]:
    """Check the shard table and errors.jsonl; return the shard bounds.

    Check the shard table against num_samples and that errors.jsonl exists; return the
    shard bounds (shard s holds ids ``bounds[s]..bounds[s+1]-1``).
    """
    bounds = [0]
    for n, info in enumerate(meta["shards"]):
        if int(info["first"]) != bounds[-1]:
            report(f"{META_NAME}: shard {n} starts at id {info['first']}, expected {bounds[-1]}")
        bounds.append(int(info["first"]) + int(info["count"]))
    if bounds[-1] != meta["num_samples"]:
        report(
            f"{META_NAME}: shards hold {bounds[-1]} samples, num_samples is {meta['num_samples']}"
        )
    if not (root / ERRORS_NAME).exists():
        report(f"{ERRORS_NAME}: missing")
    return bounds


def shard_rows(root: Path, meta: dict[str, Any], bounds: list[int], report: Report) -> Rows:
    """Return the well-formed index rows with the shard each belongs to.

    The well-formed index rows with the shard the shard table puts them in; malformed rows
    and rows in the wrong shard are reported and left out.
    """
    for row in read_index(root, meta):
        if isinstance(row, str):
            report(row)
            continue
        i = row["id"]
        shard = int(np.searchsorted(bounds, i, side="right")) - 1
        if shard != row.get("shard") or shard >= len(meta["shards"]):
            report(f"sample {i}: index says shard {row.get('shard')}, the shard table says {shard}")
            continue
        yield shard, row


def _compression_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with the row's ``compression`` (of raw pixels only), or None."""
    if "compression" not in row:
        return None
    compression = row["compression"]
    if compression not in COMPRESSIONS[1:]:
        return f"compression is {compression!r}, expected one of {', '.join(COMPRESSIONS[1:])}"
    if row.get("format") != "raw":
        return f"compression is {compression!r} on a {row.get('format')!r} record (raw only)"
    return None


def check_stored(where: str, data: bytes, row: dict[str, Any], report: Report) -> None:
    """Check a sample's stored size, CRC-32 and compression against its index row.

    The stored bytes of a sample have the size and CRC-32 its index row gives, and its
    ``compression``, if any, is one readers undo.
    """
    problem = _compression_problem(row)
    if problem is not None:
        report(f"{where}: {problem}")
    if len(data) != row.get("nbytes"):
        report(f"{where}: {len(data)} bytes stored, the index says {row.get('nbytes')}")
    crc = zlib.crc32(data)
    if crc != row.get("crc32"):
        report(
            f"{where}: CRC-32 of the stored bytes is {crc:08x}, the index says "
            f"{int(row.get('crc32') or 0):08x}"
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_AS_BUILT = Transform(max_pixels=None)
"""The build's checks of stored bytes, without a pixel limit (OUT may have been built with a
higher ``--max-pixels``; its images are no bombs to refuse now)."""


def _reader_dims(data: bytes, mode: str, row: dict[str, Any]) -> tuple[int, int, int] | None:
    """``(width, height, channels)`` of the bytes decoded as a reader does in `mode`, or None."""
    try:
        image = decode_sample(
            data,
            mode,
            stored=str(row.get("format") or ""),
            height=_int(row.get("height")),
            width=_int(row.get("width")),
            channels=_int(row.get("channels")),
        )
    except (ValueError, cv2.error):
        return None
    return int(image.shape[1]), int(image.shape[0]), int(image.shape[2])


def _decode_failure(data: bytes, row: dict[str, Any]) -> str | tuple[int, int, int]:
    """Decode the stored bytes as readers do, and check them as the build does.

    Returns ``(width, height, channels)`` of the stored image as ``decode="unchanged"`` gives
    them, or why it fails: it does not decode with the default ``decode="rgb"`` that a reader
    uses unless told otherwise (nor as stored), or the build's decode check refuses it.
    That check is the very function the build runs on each input
    (`packer.prepare.prepare_bytes` with ``decode_check=True``): it hears libjpeg's
    corrupt-data warnings, which a reader's decode does not (OpenCV returns made-up pixels),
    refuses cut-short files, and measures the image as ``IMREAD_UNCHANGED`` does, at a fraction
    of a decode's cost. Raw pixels, made by the build itself, are reshaped instead; compressed
    ones are decompressed first, to the size the row's dimensions give.
    """
    if "compression" in row:
        problem = _compression_problem(row)
        if problem is not None:
            return problem
        size = _int(row.get("height")) * _int(row.get("width")) * _int(row.get("channels"))
        try:
            data = decompress(data, row["compression"], size)
        except ValueError as exc:
            return str(exc)  # cannot decompress <codec> to <size> bytes (why)
    if _reader_dims(data, "rgb", row) is None:
        if _reader_dims(data, "unchanged", row) is None:
            return "does not decode"
        return 'does not decode as readers decode by default (decode="rgb")'
    if row.get("format") == "raw":
        return _reader_dims(data, "unchanged", row) or "does not decode"
    found = prepare_bytes(str(row.get("path") or ""), data, None, transform=_AS_BUILT)
    if isinstance(found, Problem):
        return f"the build's decode check refuses it ({found.reason}): {found.message}"
    return found.width, found.height, found.channels


def decode_problem(data: bytes, row: dict[str, Any] | None = None) -> str | None:
    """Why the stored bytes fail ``--deep`` (`_decode_failure`), or None when they pass.

    They decode the way readers decode them (raw pixels by the index row's dimensions), as
    stored and with the default ``decode="rgb"``, and pass the build's decode check.
    """
    found = _decode_failure(data, row or {})
    return found if isinstance(found, str) else None


def check_decode(where: str, data: bytes, row: dict[str, Any], report: Report) -> None:
    """Check that the stored bytes pass ``--deep`` (`_decode_failure`) at the index's size.

    The stored bytes decode as readers decode them (stored, and with the default
    ``decode="rgb"``), to the size the index row gives, and pass the build's decode check.
    """
    dims = _decode_failure(data, row)
    if isinstance(dims, str):
        report(f"{where}: {dims}")
    elif dims != (row.get("width"), row.get("height"), row.get("channels")):
        report(
            f"{where}: decodes to {dims[0]}x{dims[1]}x{dims[2]}, the index says "
            f"{row.get('width')}x{row.get('height')}x{row.get('channels')}"
        )
