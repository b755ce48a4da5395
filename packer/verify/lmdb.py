"""``packer verify`` checks of LMDB shards.

``packer verify`` checks of LMDB shards: every page a lookup can touch (walked with
bounds-checked reads before LMDB opens the shard, so damage ends as problem lines, never as a
SIGBUS), num-samples, keys, labels as stored, and a bare LMDB in the PaddleOCR layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb

from packer.verify.common import Report, Rows, check_decode, check_stored, decode_problem
from readers.errors import DatasetRebuiltError
from readers.formats.layout import META_NAME
from readers.formats.lmdb import (
    DATA_FILE,
    NUM_SAMPLES_KEY,
    check_tree,
    encode_label,
    image_key,
    label_key,
    shared_lmdb,
)
from readers.io.identity import identify_dataset


class _Shards:
    """Open one LMDB shard at a time for the check.

    Opens one LMDB shard at a time for the check (a dataset of many shards would otherwise
    hold a descriptor per shard: readers.io.handles closes the least recently used ones).
    """

    def __init__(self, root: Path, meta: dict[str, Any], report: Report) -> None:
        self.root = root
        self.meta = meta
        self.report = report
        self.identity = identify_dataset(root)
        self.current = -1
        self.env: Any = None
        self._txn: Any = None
        self.failed: set[int] = set()
        self.walked: set[int] = set()  # shards whose pages check_tree has walked

    def txn(self, shard: int) -> Any:
        if shard in self.failed:
            return None
        if shard != self.current:
            self.close()
            name = self.meta["shards"][shard]["name"]
            path = self.root / name
            try:
                if not (path / DATA_FILE).exists():
                    raise FileNotFoundError(f"{path / DATA_FILE} is missing")
                damage = [] if shard in self.walked else check_tree(str(path / DATA_FILE))
                self.walked.add(shard)
                if damage:
                    for line in damage:
                        self.report(f"{name}: {DATA_FILE}: {line}")
                    self.report(f"{name}: not read further (its pages are damaged)")
                    self.failed.add(shard)
                    return None
                env = shared_lmdb(str(path))
                self.identity.check_shard(str(path))
            except DatasetRebuiltError:
                raise
            except Exception as exc:
                self.report(f"{name}: cannot open ({exc})")
                self.failed.add(shard)
                return None
            self.current, self.env, self._txn = shard, env, env.begin(buffers=True)
        return self._txn

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
        self.current, self.env, self._txn = -1, None, None


def _check_shard_counts(shards: _Shards, report: Report) -> None:
    for number, info in enumerate(shards.meta["shards"]):
        txn = shards.txn(number)
        if txn is None:
            continue
        try:
            _check_shard_count(txn, shards.env, info, report)
        except lmdb.Error as exc:
            report(f"{info['name']}: cannot read num-samples ({exc})")


def _check_shard_count(txn: Any, env: Any, info: dict[str, Any], report: Report) -> None:
    """num-samples and the number of keys of one shard."""
    raw = txn.get(NUM_SAMPLES_KEY)
    if raw is None:
        report(f"{info['name']}: the num-samples key is missing")
    elif bytes(raw) != str(info["count"]).encode():
        report(
            f"{info['name']}: num-samples is {bytes(raw).decode(errors='replace')!r}, "
            f"expected {info['count']} ({META_NAME})"
        )
    entries = env.stat()["entries"]
    if entries != 2 * int(info["count"]) + 1:
        report(
            f"{info['name']}: holds {entries} keys, expected {2 * int(info['count']) + 1} "
            "(an image and a label per sample, and num-samples)"
        )


def verify_packed(
    root: Path, meta: dict[str, Any], rows: Rows, *, deep: bool, report: Report
) -> None:
    """Check the LMDB shards of a packed dataset against its index rows."""
    shards = _Shards(root, meta, report)
    try:
        _check_shard_counts(shards, report)
        for shard, row in rows:
            _check_row(shard, row, meta, shards, deep=deep, report=report)
    finally:
        shards.close()


def _check_row(
    shard: int,
    row: dict[str, Any],
    meta: dict[str, Any],
    shards: _Shards,
    *,
    deep: bool,
    report: Report,
) -> None:
    i = row["id"]
    name = meta["shards"][shard]["name"]
    local = i - int(meta["shards"][shard]["first"]) + 1
    key = image_key(local)
    where = f"{name} sample {i} ({key.decode()}, {row.get('path')})"
    if row.get("key") != key.decode():
        report(f"{where}: index key is {row.get('key')!r}")
    txn = shards.txn(shard)
    if txn is None:
        return
    try:
        _check_stored_row(txn, where, local, row, deep=deep, report=report)
    except lmdb.Error as exc:
        report(f"{where}: read failed ({exc})")


def _check_stored_row(
    txn: Any, where: str, local: int, row: dict[str, Any], *, deep: bool, report: Report
) -> None:
    key = image_key(local)
    data = txn.get(key)
    if data is None:
        report(f"{where}: the image key is missing")
        return
    data = bytes(data)
    check_stored(where, data, row, report)
    stored_label = txn.get(label_key(local))
    if stored_label is None:
        report(f"{where}: the label key {label_key(local).decode()} is missing")
    elif bytes(stored_label) != encode_label(row.get("label")):
        report(
            f"{where}: stored label {bytes(stored_label)[:60]!r} differs from the index "
            f"label {row.get('label')!r}"
        )
    if deep:
        check_decode(where, data, row, report)


def verify_bare(root: Path, *, deep: bool, report: Report) -> None:
    """Check a bare LMDB in the PaddleOCR layout: num-samples, every key, decodability."""
    try:
        damage = check_tree(str(root / DATA_FILE))
        if damage:
            for line in damage:
                report(f"{root}: {DATA_FILE}: {line}")
            return
        env = shared_lmdb(str(root))
    except Exception as exc:
        report(f"{root}: cannot open as LMDB ({exc})")
        return
    try:
        _check_bare(env, root, deep=deep, report=report)
    except lmdb.Error as exc:
        report(f"{root}: read failed ({exc})")


def _check_bare(env: Any, root: Path, *, deep: bool, report: Report) -> None:
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
            problem = decode_problem(bytes(data)) if deep else None
            if problem is not None:
                report(f"{where}: {problem}")
        if env.stat()["entries"] > 2 * count + 1:
            report(
                f"{root}: holds {env.stat()['entries']} keys, more than num-samples "
                f"{count} accounts for"
            )
