"""Re-read a packed dataset (LMDB or RecordIO) or a bare LMDB / .rec through readers.formats:
counts, keys, offsets, checksums, labels, decodability."""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.writers.recordio import IDX_SUFFIX, REC_SUFFIX, header_label
from readers.errors import DatasetFormatError
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME
from readers.formats.lmdb import (
    DATA_FILE,
    NUM_SAMPLES_KEY,
    encode_label,
    image_key,
    label_key,
)
from readers.formats.recordio import (
    IRHeader,
    RecordIOError,
    read_idx,
    read_record_at,
    unpack_image_record,
)
from readers.formats.lmdb import shared_lmdb
from readers.handles import open_mmap_readonly
from readers.index import load_meta

_MAX_LISTED = 20


def _decode_dims(data: bytes) -> tuple[int, int, int] | None:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        return None
    return int(image.shape[1]), int(image.shape[0]), 1 if image.ndim == 2 else image.shape[2]


def _read_index(root: Path, meta: dict[str, Any]) -> Iterator[str | dict[str, Any]]:
    """The index rows, or problem lines where a row is malformed."""
    path = root / INDEX_NAME
    digest = hashlib.sha256()
    count = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        yield f"{INDEX_NAME}: cannot read ({exc})"
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
            if row.get("id") != n:
                yield f"{INDEX_NAME}:{n + 1}: id is {row.get('id')}, expected {n}"
                continue
            yield row
    if count != meta.get("num_samples"):
        yield f"{INDEX_NAME}: {count} lines but {META_NAME} says {meta.get('num_samples')}"
    recorded = meta.get("index_sha256")
    if recorded and recorded != digest.hexdigest():
        yield f"{INDEX_NAME}: SHA-256 differs from the one recorded in {META_NAME} (edited?)"


class _Shards:
    """Opens each LMDB shard once for the check."""

    def __init__(self, root: Path, meta: dict[str, Any], report: Callable[[str], None]) -> None:
        self.root = root
        self.meta = meta
        self.report = report
        self.envs: dict[int, Any] = {}
        self.txns: dict[int, Any] = {}

    def txn(self, shard: int) -> Any:
        if shard not in self.txns:
            name = self.meta["shards"][shard]["name"]
            path = self.root / name
            try:
                if not (path / DATA_FILE).exists():
                    raise FileNotFoundError(f"{path / DATA_FILE} is missing")
                env = shared_lmdb(str(path))
            except Exception as exc:
                self.report(f"{name}: cannot open ({exc})")
                self.txns[shard] = None
                return None
            self.envs[shard] = env
            self.txns[shard] = env.begin(buffers=True)
        return self.txns[shard]

    def close(self) -> None:
        for txn in self.txns.values():
            if txn is not None:
                txn.abort()


def _check_shard_counts(shards: _Shards, report: Callable[[str], None]) -> None:
    for number, info in enumerate(shards.meta["shards"]):
        txn = shards.txn(number)
        if txn is None:
            continue
        raw = txn.get(NUM_SAMPLES_KEY)
        if raw is None:
            report(f"{info['name']}: the num-samples key is missing")
        elif bytes(raw) != str(info["count"]).encode():
            report(
                f"{info['name']}: num-samples is {bytes(raw).decode(errors='replace')!r}, "
                f"expected {info['count']} ({META_NAME})"
            )
        entries = shards.envs[number].stat()["entries"]
        if entries != 2 * int(info["count"]) + 1:
            report(
                f"{info['name']}: holds {entries} keys, expected {2 * int(info['count']) + 1} "
                "(an image and a label per sample, and num-samples)"
            )


def verify_packed(root: Path, *, deep: bool, report: Callable[[str], None]) -> None:
    """Check a dataset written by ``packer build``; call `report` once per problem."""
    try:
        meta = load_meta(root)
    except DatasetFormatError as exc:
        report(str(exc))
        return
    if meta["format"] not in ("lmdb", "recordio"):
        report(f"{META_NAME}: format {meta['format']!r} cannot be verified by this version")
        return
    bounds = [0]
    for n, info in enumerate(meta["shards"]):
        if int(info["first"]) != bounds[-1]:
            report(f"{META_NAME}: shard {n} starts at id {info['first']}, expected {bounds[-1]}")
        bounds.append(int(info["first"]) + int(info["count"]))
    if bounds[-1] != meta["num_samples"]:
        report(
            f"{META_NAME}: shards hold {bounds[-1]} samples, num_samples is {meta['num_samples']}"
        )
    errors_path = root / ERRORS_NAME
    if not errors_path.exists():
        report(f"{ERRORS_NAME}: missing")

    if meta["format"] == "recordio":
        _verify_packed_recordio(root, meta, bounds, deep=deep, report=report)
        return
    shards = _Shards(root, meta, report)
    try:
        _check_shard_counts(shards, report)
        for row in _read_index(root, meta):
            if isinstance(row, str):
                report(row)
                continue
            _check_row(row, bounds, meta, shards, deep=deep, report=report)
    finally:
        shards.close()


def _check_row(
    row: dict[str, Any],
    bounds: list[int],
    meta: dict[str, Any],
    shards: _Shards,
    *,
    deep: bool,
    report: Callable[[str], None],
) -> None:
    i = row["id"]
    shard = int(np.searchsorted(bounds, i, side="right")) - 1
    if shard != row.get("shard") or shard >= len(meta["shards"]):
        report(f"sample {i}: index says shard {row.get('shard')}, the shard table says {shard}")
        return
    name = meta["shards"][shard]["name"]
    local = i - bounds[shard] + 1
    key = image_key(local)
    where = f"{name} sample {i} ({key.decode()}, {row.get('path')})"
    if row.get("key") != key.decode():
        report(f"{where}: index key is {row.get('key')!r}")
    txn = shards.txn(shard)
    if txn is None:
        return
    data = txn.get(key)
    if data is None:
        report(f"{where}: the image key is missing")
        return
    data = bytes(data)
    if len(data) != row.get("nbytes"):
        report(f"{where}: {len(data)} bytes stored, the index says {row.get('nbytes')}")
    crc = zlib.crc32(data)
    if crc != row.get("crc32"):
        report(
            f"{where}: CRC-32 of the stored bytes is {crc:08x}, the index says "
            f"{int(row.get('crc32') or 0):08x}"
        )
    stored_label = txn.get(label_key(local))
    if stored_label is None:
        report(f"{where}: the label key {label_key(local).decode()} is missing")
    elif bytes(stored_label) != encode_label(row.get("label")):
        report(
            f"{where}: stored label {bytes(stored_label)[:60]!r} differs from the index "
            f"label {row.get('label')!r}"
        )
    if deep:
        _check_decode(where, data, row, report)


def verify_bare_lmdb(root: Path, *, deep: bool, report: Callable[[str], None]) -> None:
    """Check a bare LMDB in the PaddleOCR layout: num-samples, every key, decodability."""
    try:
        env = shared_lmdb(str(root))
    except Exception as exc:
        report(f"{root}: cannot open as LMDB ({exc})")
        return
    with env.begin(buffers=True) as txn:
        raw = txn.get(NUM_SAMPLES_KEY)
        if raw is None:
            report(f"{root}: no num-samples key (not the PaddleOCR layout)")
            return
        try:
            count = int(bytes(raw))
        except ValueError:
            report(f"{root}: num-samples is {bytes(raw)[:40]!r}, not a number")
            return
        for local in range(1, count + 1):
            data = txn.get(image_key(local))
            where = f"{root.name} sample {local - 1} ({image_key(local).decode()})"
            if data is None:
                report(f"{where}: the image key is missing")
                continue
            if txn.get(label_key(local)) is None:
                report(f"{where}: the label key {label_key(local).decode()} is missing")
            if deep and _decode_dims(bytes(data)) is None:
                report(f"{where}: does not decode")
        if env.stat()["entries"] > 2 * count + 1:
            report(
                f"{root}: holds {env.stat()['entries']} keys, more than num-samples "
                f"{count} accounts for"
            )


def _check_decode(
    where: str, data: bytes, row: dict[str, Any], report: Callable[[str], None]
) -> None:
    dims = _decode_dims(data)
    if dims is None:
        report(f"{where}: does not decode")
    elif dims != (row.get("width"), row.get("height"), row.get("channels")):
        report(
            f"{where}: decodes to {dims[0]}x{dims[1]}x{dims[2]}, the index says "
            f"{row.get('width')}x{row.get('height')}x{row.get('channels')}"
        )


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

    def __init__(
        self, root: Path, info: dict[str, Any], *, deep: bool, report: Callable[[str], None]
    ) -> None:
        self.name = str(info["name"])
        self.first = int(info["first"])
        self.count = int(info["count"])
        self.deep = deep
        self.report = report
        self.rec = root / f"{self.name}{REC_SUFFIX}"
        self.idx = root / f"{self.name}{IDX_SUFFIX}"
        self.buf: Any = None
        self.keys: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        self.pos: int | None = 0  # where the next record must start; None once lost
        self.cut_short = False
        try:
            self.buf = open_mmap_readonly(str(self.rec))
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
            if "file_bytes" in info and on_disk != int(info["file_bytes"]):
                report(
                    f"{self.name}: {self.rec.name} and {self.idx.name} hold {on_disk} bytes, "
                    f"{META_NAME} says {info['file_bytes']} (cut short or appended to?)"
                )

    def check(self, row: dict[str, Any]) -> None:
        i = int(row["id"])
        local = i - self.first
        where = f"{self.name} sample {i} (key {i}, {row.get('path')})"
        if row.get("key") != str(i):
            self.report(f"{where}: index key is {row.get('key')!r}, expected '{i}'")
        idx_offset: int | None = None
        if self.keys is not None and self.offsets is not None and local < len(self.keys):
            idx_offset = int(self.offsets[local])
            if int(self.keys[local]) != i:
                self.report(
                    f"{where}: {self.idx.name} line {local + 1} has key "
                    f"{int(self.keys[local])}, expected {i}"
                )
        if self.buf is None or self.cut_short:
            return
        start = self.pos if self.pos is not None else idx_offset
        if start is None:
            start = row.get("offset")
        if not isinstance(start, int):
            self.report(f"{where}: cannot locate the record (no offset)")
            return
        if start >= len(self.buf):
            last = self.first + self.count - 1
            self.report(
                f"{where}: {self.rec.name} ends at byte {len(self.buf)}, before this "
                f"record; samples {i}..{last} are missing (the file is cut short)"
            )
            self.cut_short = True
            return
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
        if len(data) != row.get("nbytes"):
            self.report(f"{where}: {len(data)} bytes stored, the index says {row.get('nbytes')}")
        crc = zlib.crc32(data)
        if crc != row.get("crc32"):
            self.report(
                f"{where}: CRC-32 of the stored bytes is {crc:08x}, the index says "
                f"{int(row.get('crc32') or 0):08x}"
            )
        problem = _header_label_problem(header, label, header_label(row.get("label")))
        if problem:
            self.report(f"{where}: {problem}")
        if self.deep:
            _check_decode(where, data, row, self.report)

    def finish(self) -> None:
        if self.buf is not None and self.pos is not None and self.pos != len(self.buf):
            self.report(
                f"{self.rec.name}: {len(self.buf) - self.pos} bytes after the last "
                f"record (at {self.pos})"
            )
        with contextlib.suppress(Exception):
            self.buf.close()


def _verify_packed_recordio(
    root: Path,
    meta: dict[str, Any],
    bounds: list[int],
    *,
    deep: bool,
    report: Callable[[str], None],
) -> None:
    shards = meta["shards"]
    current: _RecShardCheck | None = None
    number = -1
    try:
        for row in _read_index(root, meta):
            if isinstance(row, str):
                report(row)
                continue
            i = row["id"]
            shard = int(np.searchsorted(bounds, i, side="right")) - 1
            if shard != row.get("shard") or shard >= len(shards):
                report(
                    f"sample {i}: index says shard {row.get('shard')}, the shard table says {shard}"
                )
                continue
            if shard != number:
                if current is not None:
                    current.finish()
                number = shard
                current = _RecShardCheck(root, shards[shard], deep=deep, report=report)
            assert current is not None
            current.check(row)
    finally:
        if current is not None:
            current.finish()


def verify_bare_recordio(
    rec: Path, idx: Path | None, *, deep: bool, report: Callable[[str], None]
) -> None:
    """Check a bare MXNet ``.rec`` (and its ``.idx``): every record parses, strictly; every
    ``.idx`` offset is a record start; with `deep`, every image record decodes."""
    try:
        buf = open_mmap_readonly(str(rec))
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
                if deep and len(image) and _decode_dims(bytes(image)) is None:
                    report(f"{where}: does not decode")
                elif deep and not len(image) and header.flag == 0:
                    report(f"{where}: holds no image bytes")
            offset, n = next_offset, n + 1
        if keys is not None and offsets is not None and idx is not None:
            stray = [
                (int(k), int(o)) for k, o in zip(keys, offsets, strict=True) if int(o) not in starts
            ]
            for k, o in stray[:_MAX_LISTED]:
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
            if len(stray) > _MAX_LISTED:
                report(
                    f"{idx.name}: {len(stray) - _MAX_LISTED} more keys give offsets that are "
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


def verify(path: str | Path, *, deep: bool = False) -> list[str]:
    """All problems found in the dataset at `path` (an empty list when it is intact)."""
    root = Path(path)
    found: list[str] = []
    if (root / META_NAME).exists():
        verify_packed(root, deep=deep, report=found.append)
    elif (root / DATA_FILE).exists():
        verify_bare_lmdb(root, deep=deep, report=found.append)
    elif (pair := _recordio_pair(root)) is not None:
        verify_bare_recordio(*pair, deep=deep, report=found.append)
    elif not root.exists():
        found.append(f"{root}: does not exist")
    else:
        found.append(
            f"{root}: neither a packed dataset ({META_NAME}), an LMDB ({DATA_FILE}) "
            f"nor a RecordIO file ({REC_SUFFIX} with its {IDX_SUFFIX})"
        )
    return found


def _recordio_pair(path: Path) -> tuple[Path, Path | None] | None:
    """The bare ``.rec`` (and ``.idx``) that `path` names: the ``.rec``, the ``.idx``, or
    their prefix. (readers.datasets has the same rule; it is not imported to keep paddle out.)"""

    def with_idx(rec: Path) -> tuple[Path, Path | None]:
        idx = rec.with_suffix(IDX_SUFFIX)
        return rec, idx if idx.is_file() else None

    if path.is_file():
        if path.suffix == REC_SUFFIX:
            return with_idx(path)
        if path.suffix == IDX_SUFFIX and path.with_suffix(REC_SUFFIX).is_file():
            return path.with_suffix(REC_SUFFIX), path
        return None
    if path.is_dir():
        recs = sorted(q for q in path.glob(f"*{REC_SUFFIX}") if q.is_file())
        return with_idx(recs[0]) if len(recs) == 1 else None
    prefixed = Path(f"{path}{REC_SUFFIX}")
    return with_idx(prefixed) if prefixed.is_file() else None
