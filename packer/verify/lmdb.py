"""``packer verify`` checks of LMDB shards.

``packer verify`` checks of LMDB shards: every page a lookup can touch (walked with
bounds-checked reads before LMDB opens the shard, so damage ends as problem lines, never as a
SIGBUS), num-samples, keys, labels as stored, ``wh-%09d`` sizes against the index, and a bare
LMDB in the PaddleOCR layout.

A shard with no ``wh-`` key at all was built by a packer older than those keys: that is a note
(``verify(..., notes=)``), not a problem; a shard with any ``wh-`` key must have one per record,
each equal to the index's width and height.
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
    WH_PREFIX,
    check_tree,
    encode_label,
    encode_wh,
    image_key,
    label_key,
    parse_wh,
    shared_lmdb,
    wh_key,
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
        self.without_wh: set[int] = set()  # shards with no wh- key (built by an older packer)

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
            if int(info["count"]) and not _has_wh_keys(txn):
                shards.without_wh.add(number)
            keys = 2 if number in shards.without_wh else 3
            _check_shard_count(txn, shards.env, info, keys, report)
        except lmdb.Error as exc:
            report(f"{info['name']}: cannot read num-samples ({exc})")


def _has_wh_keys(txn: Any) -> bool:
    """Whether the shard holds any ``wh-`` key (the last keys in LMDB's order)."""
    with txn.cursor() as cursor:
        return bool(cursor.set_range(WH_PREFIX)) and bytes(cursor.key()).startswith(WH_PREFIX)


def _check_shard_count(txn: Any, env: Any, info: dict[str, Any], keys: int, report: Report) -> None:
    """num-samples and the number of keys of one shard (`keys` per record)."""
    raw = txn.get(NUM_SAMPLES_KEY)
    if raw is None:
        report(f"{info['name']}: the num-samples key is missing")
    elif bytes(raw) != str(info["count"]).encode():
        report(
            f"{info['name']}: num-samples is {bytes(raw).decode(errors='replace')!r}, "
            f"expected {info['count']} ({META_NAME})"
        )
    entries = env.stat()["entries"]
    expected = keys * int(info["count"]) + 1
    if entries != expected:
        what = "an image, a label and a wh- size" if keys == 3 else "an image and a label"
        report(
            f"{info['name']}: holds {entries} keys, expected {expected} "
            f"({what} per sample, and num-samples)"
        )


def verify_packed(
    root: Path,
    meta: dict[str, Any],
    rows: Rows,
    *,
    deep: bool,
    report: Report,
    note: Report | None = None,
) -> None:
    """Check the LMDB shards of a packed dataset against its index rows.

    Shards without ``wh-`` keys (built by an older packer) are named once to `note`.
    """
    shards = _Shards(root, meta, report)
    try:
        _check_shard_counts(shards, report)
        for shard, row in rows:
            _check_row(shard, row, meta, shards, deep=deep, report=report)
    finally:
        shards.close()
    if shards.without_wh and note is not None:
        names = [meta["shards"][n]["name"] for n in sorted(shards.without_wh)]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        note(
            f"{shown}: no wh- keys (built by an older packer); PaddleOCR's RatioDataSet "
            "decodes every image of such a shard at start-up to learn its size (a "
            "`packer convert` of the dataset writes them)"
        )


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
        if shard not in shards.without_wh:
            _check_wh(txn, where, local, row, report)
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


def _check_wh(txn: Any, where: str, local: int, row: dict[str, Any], report: Report) -> None:
    """The ``wh-%09d`` key of a record says the index's width and height."""
    raw = txn.get(wh_key(local))
    name = wh_key(local).decode()
    if raw is None:
        report(f"{where}: the size key {name} is missing")
        return
    try:
        expected = encode_wh(int(row["width"]), int(row["height"]))
    except (KeyError, TypeError, ValueError):
        return  # a row without sizes is reported by the index checks
    if bytes(raw) != expected:
        report(
            f"{where}: {name} is {bytes(raw)[:40]!r}, the index says "
            f"{expected.decode()} (width_height)"
        )


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
        sizes = 0  # wh- keys among the records
        for local in range(1, count + 1):
            data = txn.get(image_key(local))
            where = f"{root.name} sample {local - 1} ({image_key(local).decode()})"
            raw = txn.get(wh_key(local))
            if raw is not None:
                sizes += 1
                if parse_wh(bytes(raw)) is None:
                    report(f"{where}: {wh_key(local).decode()} is {bytes(raw)[:40]!r}, not W_H")
            if data is None:
                report(f"{where}: the image key is missing")
                continue
            if txn.get(label_key(local)) is None:
                report(f"{where}: the label key {label_key(local).decode()} is missing")
            problem = decode_problem(bytes(data)) if deep else None
            if problem is not None:
                report(f"{where}: {problem}")
        if env.stat()["entries"] > 2 * count + 1 + sizes:
            report(
                f"{root}: holds {env.stat()['entries']} keys, more than num-samples "
                f"{count} accounts for"
            )
