"""Re-read a packed dataset through readers.formats: counts, keys, checksums, decodability."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from readers.errors import DatasetFormatError
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME
from readers.formats.lmdb_layout import (
    DATA_FILE,
    NUM_SAMPLES_KEY,
    encode_label,
    image_key,
    label_key,
)
from readers.handles import shared_lmdb
from readers.index import load_meta


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
        f = open(path, "rb")
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
            except Exception as exc:  # noqa: BLE001 - reported, the check goes on
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
    if meta["format"] != "lmdb":
        report(f"{META_NAME}: format {meta['format']!r} cannot be verified by this version")
        return
    bounds = [0]
    for n, info in enumerate(meta["shards"]):
        if int(info["first"]) != bounds[-1]:
            report(f"{META_NAME}: shard {n} starts at id {info['first']}, expected {bounds[-1]}")
        bounds.append(int(info["first"]) + int(info["count"]))
    if bounds[-1] != meta["num_samples"]:
        report(f"{META_NAME}: shards hold {bounds[-1]} samples, num_samples is "
               f"{meta['num_samples']}")
    errors_path = root / ERRORS_NAME
    if not errors_path.exists():
        report(f"{ERRORS_NAME}: missing")

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
        report(f"{where}: CRC-32 of the stored bytes is {crc:08x}, the index says "
               f"{int(row.get('crc32') or 0):08x}")
    stored_label = txn.get(label_key(local))
    if stored_label is None:
        report(f"{where}: the label key {label_key(local).decode()} is missing")
    elif bytes(stored_label) != encode_label(row.get("label")):
        report(f"{where}: stored label {bytes(stored_label)[:60]!r} differs from the index "
               f"label {row.get('label')!r}")
    if deep:
        dims = _decode_dims(data)
        if dims is None:
            report(f"{where}: does not decode")
        elif dims != (row.get("width"), row.get("height"), row.get("channels")):
            report(f"{where}: decodes to {dims[0]}x{dims[1]}x{dims[2]}, the index says "
                   f"{row.get('width')}x{row.get('height')}x{row.get('channels')}")


def verify_bare_lmdb(root: Path, *, deep: bool, report: Callable[[str], None]) -> None:
    """Check a bare LMDB in the PaddleOCR layout: num-samples, every key, decodability."""
    try:
        env = shared_lmdb(str(root))
    except Exception as exc:  # noqa: BLE001 - reported
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
            report(f"{root}: holds {env.stat()['entries']} keys, more than num-samples "
                   f"{count} accounts for")


def verify(path: str | Path, *, deep: bool = False) -> list[str]:
    """All problems found in the dataset at `path` (an empty list when it is intact)."""
    root = Path(path)
    found: list[str] = []
    if (root / META_NAME).exists():
        verify_packed(root, deep=deep, report=found.append)
    elif (root / DATA_FILE).exists():
        verify_bare_lmdb(root, deep=deep, report=found.append)
    elif not root.exists():
        found.append(f"{root}: does not exist")
    else:
        found.append(f"{root}: neither a packed dataset ({META_NAME}) nor an LMDB ({DATA_FILE})")
    return found
