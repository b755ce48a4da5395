"""``packer verify`` checks of RecordIO shards.

``packer verify`` checks of RecordIO shards: each ``.rec`` walked record by record (strict
framing, header ids and labels, offsets in ``.idx`` and the index, trailing bytes), and a bare
MXNet ``.rec``/``.idx`` pair.
"""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import Any

import numpy as np

from packer.verify.common import (
    MAX_LISTED,
    Report,
    Rows,
    check_decode,
    check_stored,
    decode_problem,
)
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.formats.recordio import (
    FORMAT,
    IRHeader,
    RecordIOError,
    header_label,
    open_rec_readonly,
    read_idx,
    read_record_at,
    unpack_image_record,
)
from readers.meta import is_int


def _header_label_problem(
    header: IRHeader, label: float | np.ndarray, expected: float | list[float] | None
) -> str | None:
    """How the header's label differs from what the writer stores for the index label."""
    if expected is None:
        ok = header.flag == 0 and header.label == 0.0
        want = "flag 0, label 0.0 (a label kept in the index only)"
    elif isinstance(expected, float):
        ok = header.flag == 0 and header.label == np.float32(expected)
        want = f"flag 0, label {expected}"
    else:
        ok = header.flag == len(expected) and np.array_equal(
            np.asarray(label), np.asarray(expected, dtype=np.float32)
        )
        want = f"flag {len(expected)}, labels {expected}"
    if ok:
        return None
    got = np.asarray(label).tolist() if header.flag else header.label
    return f"header has flag {header.flag}, label {got}; the index label means {want}"


class _RecShardCheck:
    """Walks one RecordIO shard record by record, as the index rows of its samples arrive."""

    def __init__(self, root: Path, info: dict[str, Any], *, deep: bool, report: Report) -> None:
        self.name = str(info["name"])
        self.first = int(info["first"])
        self.count = int(info["count"])
        self.deep = deep
        self.report = report
        rec_name, idx_name = FORMAT.shard_files(self.name)
        self.rec, self.idx = root / rec_name, root / idx_name
        self.buf: Any = None
        self.keys: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        self.pos: int | None = 0  # where the next record must start; None once lost
        self.cut_short = False
        try:
            self.buf = open_rec_readonly(str(self.rec))
        except OSError as exc:
            report(f"{self.rec.name}: cannot open ({exc.strerror or exc})")
        try:
            self.keys, self.offsets = read_idx(self.idx)
        except (OSError, RecordIOError) as exc:
            report(f"{self.idx.name}: cannot read ({exc})")
        if self.keys is not None and len(self.keys) != self.count:
            report(
                f"{self.idx.name}: {len(self.keys)} lines, expected {self.count} "
                f"({META_NAME} shard count)"
            )
        if self.buf is not None and self.keys is not None:
            on_disk = len(self.buf) + self.idx.stat().st_size
            recorded = info.get("file_bytes")  # malformed: reported with meta.json's fields
            if is_int(recorded) and on_disk != recorded:
                report(
                    f"{self.name}: {self.rec.name} and {self.idx.name} hold {on_disk} bytes, "
                    f"{META_NAME} says {info['file_bytes']} (cut short or appended to?)"
                )

    def _start(self, i: int, where: str, row: dict[str, Any]) -> int | None:
        """Where the record of sample `i` starts (checked against ``.idx`` and the index)."""
        local = i - self.first
        idx_offset: int | None = None
        if self.keys is not None and self.offsets is not None and local < len(self.keys):
            idx_offset = int(self.offsets[local])
            if int(self.keys[local]) != i:
                self.report(
                    f"{where}: {self.idx.name} line {local + 1} has key "
                    f"{int(self.keys[local])}, expected {i}"
                )
        if self.buf is None or self.cut_short:
            return None
        start = self.pos if self.pos is not None else idx_offset
        if start is None:
            start = row.get("offset")
        if not isinstance(start, int):
            self.report(f"{where}: cannot locate the record (no offset)")
            return None
        if start >= len(self.buf):
            last = self.first + self.count - 1
            self.report(
                f"{where}: {self.rec.name} ends at byte {len(self.buf)}, before this "
                f"record; samples {i}..{last} are missing (the file is cut short)"
            )
            self.cut_short = True
            return None
        if idx_offset is not None and idx_offset != start:
            self.report(
                f"{where}: {self.idx.name} gives offset {idx_offset}, but the record "
                f"starts at {start}"
            )
        if row.get("offset") != start:
            self.report(
                f"{where}: {INDEX_NAME} gives offset {row.get('offset')}, but the "
                f"record starts at {start}"
            )
        return start

    def check(self, row: dict[str, Any]) -> None:
        i = int(row["id"])
        where = f"{self.name} sample {i} (key {i}, {row.get('path')})"
        if row.get("key") != str(i):
            self.report(f"{where}: index key is {row.get('key')!r}, expected '{i}'")
        start = self._start(i, where, row)
        if start is None:
            return
        try:
            payload, self.pos = read_record_at(self.buf, start, strict=True)
            header, label, image = unpack_image_record(payload)
        except RecordIOError as exc:
            self.report(f"{where}: {exc}")
            self.pos = None
            return
        data = bytes(image)
        if header.id != i:
            self.report(f"{where}: the record's header id is {header.id}")
        check_stored(where, data, row, self.report)
        problem = _header_label_problem(header, label, header_label(row.get("label")))
        if problem:
            self.report(f"{where}: {problem}")
        if self.deep:
            check_decode(where, data, row, self.report)

    def finish(self) -> None:
        if self.buf is not None and self.pos is not None and self.pos != len(self.buf):
            self.report(
                f"{self.rec.name}: {len(self.buf) - self.pos} bytes after the last "
                f"record (at {self.pos})"
            )
        with contextlib.suppress(Exception):
            self.buf.close()


def verify_packed(
    root: Path,
    meta: dict[str, Any],
    rows: Rows,
    *,
    deep: bool,
    report: Report,
    note: Report | None = None,
) -> None:
    """Check the RecordIO shards of a packed dataset against its index rows (no notes)."""
    del note
    current: _RecShardCheck | None = None
    number = -1
    try:
        for shard, row in rows:
            if shard != number:
                if current is not None:
                    current.finish()
                number = shard
                current = _RecShardCheck(root, meta["shards"][shard], deep=deep, report=report)
            assert current is not None
            current.check(row)
    finally:
        if current is not None:
            current.finish()


def verify_bare(pair: tuple[Path, Path | None], *, deep: bool, report: Report) -> None:
    """Check a bare MXNet ``.rec`` and its ``.idx``.

    Check a bare MXNet ``.rec`` (and its ``.idx``): every record parses, strictly; every
    ``.idx`` offset is a record start; with `deep`, every image record decodes.
    """
    rec, idx = pair
    try:
        buf = open_rec_readonly(str(rec))
    except OSError as exc:
        report(f"{rec}: cannot open ({exc.strerror or exc})")
        return
    try:
        keys = offsets = None
        if idx is not None:
            try:
                keys, offsets = read_idx(idx)
            except (OSError, RecordIOError) as exc:
                report(f"{idx.name}: cannot read ({exc})")
        key_at = (
            {}
            if keys is None or offsets is None
            else dict(zip(offsets.tolist(), keys.tolist(), strict=True))
        )
        starts: set[int] = set()
        offset, n = 0, 0
        while offset < len(buf):
            key = key_at.get(offset)
            where = f"{rec.name} record {n} (offset {offset}" + (
                f", key {key})" if key is not None else ")"
            )
            starts.add(offset)
            try:
                payload, next_offset = read_record_at(buf, offset, strict=True)
            except RecordIOError as exc:
                report(f"{where}: {exc}; the records after it cannot be located")
                break
            try:
                header, _, image = unpack_image_record(payload)
            except RecordIOError as exc:
                report(f"{where}: {exc}")
            else:
                problem = decode_problem(bytes(image)) if deep and len(image) else None
                if problem is not None:
                    report(f"{where}: {problem}")
                elif deep and not len(image) and header.flag == 0:
                    report(f"{where}: holds no image bytes")
            offset, n = next_offset, n + 1
        if keys is not None and offsets is not None and idx is not None:
            stray = [
                (int(k), int(o)) for k, o in zip(keys, offsets, strict=True) if int(o) not in starts
            ]
            for k, o in stray[:MAX_LISTED]:
                if o >= len(buf):
                    report(
                        f"{idx.name}: key {k} gives offset {o}, past the end of {rec.name} "
                        f"({len(buf)} bytes)"
                    )
                else:
                    report(
                        f"{idx.name}: key {k} gives offset {o}, which is not the start of a "
                        f"record in {rec.name}"
                    )
            if len(stray) > MAX_LISTED:
                report(
                    f"{idx.name}: {len(stray) - MAX_LISTED} more keys give offsets that are "
                    "not record starts"
                )
            unlisted = len(starts - set(key_at))
            if unlisted:
                report(
                    f"{idx.name}: {unlisted} of the {len(starts)} records of {rec.name} have "
                    "no line"
                )
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
