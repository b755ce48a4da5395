"""merge and split hard-link a source shard that an output holds whole with unchanged bytes (the
same inode), and copy records where the bytes change (class ids remapped, RecordIO ids moved);
either way checked record by record and with ``packer verify``. Nothing writes a linked file in
place afterwards: append, ``--overwrite``, ``--resume``, a RecordIO renumbering, LMDB's lock."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from packer.append import append, append_config, read_dataset
from packer.errors import PackerError
from packer.regroup import merge_datasets, split_dataset
from packer.repack import KILL_AT_ENV
from packer.verify import verify
from packer.writers.recordio import renumber_shard
from readers import open_dataset
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.io import handles
from tests.conftest import build_packed, write_tree


def shard_files(root: Path) -> dict[str, Path]:
    """The data files of a dataset's shards (not LMDB's lock files), by shard name."""
    meta = json.loads((root / META_NAME).read_text())
    found = {}
    for shard in meta["shards"]:
        name = shard["name"]
        for path in sorted(root.glob(f"{name}*")):
            for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
                if file.is_file() and file.name != "lock.mdb":
                    found[file.relative_to(root).as_posix()] = file
    return found


def inodes(root: Path) -> dict[str, int]:
    return {name: path.stat().st_ino for name, path in shard_files(root).items()}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes (lock files too: nothing of the source may change)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def index_rows(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / INDEX_NAME).read_text().splitlines()]


def check_records(out: Path, expected: list[tuple[bytes, Any, str]]) -> None:
    """Record by record: bytes, label, path; and packer verify --deep."""
    ds = open_dataset(str(out), decode="bytes")
    rows = index_rows(out)
    assert len(ds) == len(rows) == len(expected)
    for i, (data, label, path) in enumerate(expected):
        got, got_label = ds[i]
        assert (bytes(got), got_label, rows[i]["path"]) == (data, label, path), i
    assert verify(out, deep=True) == []


def records(root: Path) -> list[tuple[bytes, Any, str]]:
    ds = open_dataset(str(root), decode="bytes")
    return [(bytes(ds[i][0]), ds[i][1], r["path"]) for i, r in enumerate(index_rows(root))]


@pytest.fixture
def two(tmp_path: Path, fmt: str) -> tuple[Path, Path]:
    """A (cat, dog) and B (ant, dog): B's ant gets a new id in a merge, its dog keeps its id."""
    write_tree(tmp_path / "a", {"cat": 3, "dog": 3})
    write_tree(tmp_path / "b", {"ant": 3, "dog": 4}, seed=4)
    a = build_packed(tmp_path / "a", tmp_path / "a.ds", fmt, workers=1, shard_size=1500)
    b = build_packed(tmp_path / "b", tmp_path / "b.ds", fmt, workers=1, shard_size=1500)
    return a, b


def test_merge_links_the_shards_whose_bytes_stay(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    fmt = json.loads((a / META_NAME).read_text())["format"]
    before_a, before_b = snapshot(a), snapshot(b)
    expected = records(a) + [
        (data, {0: 2, 1: 1}[label], path) for data, label, path in records(b)
    ]  # b's ant 0 -> 2, dog 1 -> 1
    out = tmp_path / "merged"
    merge_datasets(out, [a, b], log=lambda _: None)
    check_records(out, expected)
    meta = json.loads((out / META_NAME).read_text())
    a_meta, b_meta = (json.loads((p / META_NAME).read_text()) for p in (a, b))
    assert len(meta["shards"]) == len(a_meta["shards"]) + len(b_meta["shards"])  # kept
    out_files, a_files, b_files = shard_files(out), shard_files(a), shard_files(b)
    na = len(a_meta["shards"])
    # every shard of A is linked: its ids and labels stay
    for k in range(na):
        for suffix in [".rec", ".idx"] if fmt == "recordio" else ["/data.mdb"]:
            name = f"shard-{k:05d}{suffix}"
            assert out_files[name].stat().st_ino == a_files[name].stat().st_ino
            assert out_files[name].stat().st_nlink >= 2
    # B's shards: linked where every label maps to itself (only dogs) and, for RecordIO,
    # never (its records carry their ids, which move by len(A))
    rows_b = index_rows(b)
    for k, shard in enumerate(b_meta["shards"]):
        labels = {r["label"] for r in rows_b[shard["first"] : shard["first"] + shard["count"]]}
        same = labels == {1} and fmt != "recordio"
        for suffix in [".rec", ".idx"] if fmt == "recordio" else ["/data.mdb"]:
            mine = out_files[f"shard-{na + k:05d}{suffix}"].stat()
            theirs = b_files[f"shard-{k:05d}{suffix}"].stat()
            assert (mine.st_ino == theirs.st_ino) == same, (k, labels)
    if fmt == "lmdb":  # the lock file, which LMDB writes in place, is never shared
        assert (out / "shard-00000" / "lock.mdb").stat().st_ino != (
            a / "shard-00000" / "lock.mdb"
        ).stat().st_ino
        assert any(
            (out / f"shard-{na + k:05d}/data.mdb").stat().st_nlink >= 2
            for k in range(len(b_meta["shards"]))
        ), "some shard of B (dogs only) is linked"
    assert snapshot(a) == before_a
    assert snapshot(b) == before_b


def test_merge_with_shard_size_copies(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    out = tmp_path / "merged"
    merge_datasets(out, [a, b], shard_size=100_000, log=lambda _: None)
    assert len(json.loads((out / META_NAME).read_text())["shards"]) == 1
    assert all(p.stat().st_nlink == 1 for p in shard_files(out).values())
    expected = records(a) + [(d, {0: 2, 1: 1}[label], p) for d, label, p in records(b)]
    check_records(out, expected)


def test_split_links_whole_shards(tmp_path: Path, fmt: str) -> None:
    """One record per shard: every record a part holds is a whole shard. LMDB's are all linked
    (keys count within the shard); RecordIO's only where the part keeps the ids."""
    write_tree(tmp_path / "src", {"cat": 5, "dog": 5})
    src = build_packed(tmp_path / "src", tmp_path / "all", fmt, workers=1, shard_size=1)
    before = snapshot(src)
    everything = records(src)
    parts = split_dataset(src, tmp_path / "parts", {"train": 0.6, "val": 0.4}, seed=5)
    assert set(parts) == {"train", "val"}
    src_rows = index_rows(src)
    by_path = {path: i for i, (_, _, path) in enumerate(everything)}
    for name in ("train", "val"):
        out = tmp_path / "parts" / name
        rows = index_rows(out)
        ids = [by_path[r["path"]] for r in rows]
        check_records(out, [everything[i] for i in ids])
        files, theirs = shard_files(out), shard_files(src)
        for j, i in enumerate(ids):
            for suffix in [".rec", ".idx"] if fmt == "recordio" else ["/data.mdb"]:
                mine = files[f"shard-{j:05d}{suffix}"].stat()
                source = theirs[f"shard-{i:05d}{suffix}"].stat()
                expected = fmt == "lmdb" or i == j
                assert (mine.st_ino == source.st_ino) == expected, (name, j, i)
        assert rows[0]["path"] == src_rows[ids[0]]["path"]
    assert snapshot(src) == before


def test_where_links_are_refused_the_shards_are_copied(
    two: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two

    def refuse(src: Any, dst: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    said: list[str] = []
    out = tmp_path / "merged"
    merge_datasets(out, [a, b], log=said.append)
    assert all(p.stat().st_nlink == 1 for p in shard_files(out).values())
    assert any("copied" in line for line in said), said
    check_records(out, records(a) + [(d, {0: 2, 1: 1}[x], p) for d, x, p in records(b)])


def test_nothing_writes_a_linked_shard_afterwards(two: tuple[Path, Path], tmp_path: Path) -> None:
    """append to the merged dataset, merge --overwrite over it, merge --resume after a kill, a
    renumbering of a linked RecordIO shard, LMDB opened with its lock: A stays as it was."""
    a, b = two
    before = snapshot(a)
    out = tmp_path / "merged"
    merge_datasets(out, [a, b], log=lambda _: None)
    linked = [p for p in shard_files(out).values() if p.stat().st_nlink >= 2]
    assert linked
    # append new images to the merged dataset (its old shards are linked once more)
    more = tmp_path / "more"
    write_tree(more, {"cat": 2})
    for p in sorted(more.rglob("*.*")):
        p.rename(p.with_name("new_" + p.name))
    append(append_config(out, more, read_dataset(out)), log=lambda _: None)
    assert verify(out, deep=True) == []
    # merge again over it with --overwrite
    merge_datasets(out, [a, b], overwrite=True, log=lambda _: None)
    # a merge killed after its first shard, then resumed
    again = tmp_path / "again"
    env = {**os.environ, KILL_AT_ENV: "shard"}
    cmd = [sys.executable, "-m", "packer.cli", "merge", str(again), str(a), str(b)]
    assert subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == -9
    merge_datasets(again, [a, b], resume=True, log=lambda _: None)
    assert verify(again, deep=True) == []
    fmt = json.loads((a / META_NAME).read_text())["format"]
    if fmt == "recordio":  # renumbering breaks the link before it writes
        base = out / "shard-00000"
        offsets = [
            r["offset"]
            for r in index_rows(out)[
                : json.loads((out / META_NAME).read_text())["shards"][0]["count"]
            ]
        ]
        assert (out / "shard-00000.rec").stat().st_nlink >= 2
        renumber_shard(base, 0, 1000, offsets)
        assert (out / "shard-00000.rec").stat().st_nlink == 1
    else:  # an LMDB client that takes locks writes the lock file: the output's own
        handles.close_all()  # (py-lmdb opens a data file once per process)
        env_ = lmdb.open(str(out / "shard-00000"), readonly=True, lock=True)
        with env_.begin() as txn:
            assert txn.get(b"num-samples") is not None
        env_.close()
    assert snapshot(a) == before


def test_split_into_one_part_links_every_shard(tmp_path: Path, fmt: str) -> None:
    write_tree(tmp_path / "src", {"cat": 4, "dog": 4})
    src = build_packed(tmp_path / "src", tmp_path / "all", fmt, workers=1, shard_size=1500)
    split_dataset(src, tmp_path / "parts", {"all": 1.0})
    out = tmp_path / "parts" / "all"
    check_records(out, records(src))
    mine, theirs = shard_files(out), shard_files(src)
    assert mine.keys() == theirs.keys()
    assert all(mine[n].stat().st_ino == theirs[n].stat().st_ino for n in mine)


def test_recordio_shards_that_move_are_cloned_and_renumbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's RecordIO shards keep their bytes but for the ids: a clone with the ids rewritten
    (B untouched); a shard with a multi-part record, which cannot be renumbered in place, is
    written record by record instead."""
    import cv2
    import numpy as np

    from packer.transform import Transform
    from packer.writers.recordio import RecordIOShardWriter
    from readers.formats.recordio import MAGIC_BYTES

    write_tree(tmp_path / "a", {"magic": 2, "noise": 2})
    b_src = tmp_path / "b"
    for k in range(3):  # grey pixels that hold the magic word at every alignment: multi-part
        flat = np.frombuffer(MAGIC_BYTES * 40, np.uint8)[k : k + 144].reshape(12, 12)
        (b_src / "magic").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(b_src / "magic" / f"m{k}.png"), flat)
    rng = np.random.default_rng(1)
    (b_src / "noise").mkdir()
    for k in range(4):
        cv2.imwrite(str(b_src / "noise" / f"n{k}.png"), rng.integers(0, 200, (12, 12), np.uint8))
    a = build_packed(tmp_path / "a", tmp_path / "a.rec", "recordio", workers=1, shard_size=1500)
    raw = Transform(encode="raw")
    b = build_packed(
        b_src, tmp_path / "b.rec", "recordio", workers=1, shard_size=300, transform=raw
    )
    b_meta = json.loads((b / META_NAME).read_text())
    before = snapshot(b)
    calls: list[tuple[int, bool]] = []  # (old first id, renumbered)
    real = RecordIOShardWriter.renumber.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, base: Path, old: int, new: int, offsets: list[Any]) -> Any:
        try:
            size = real(cls, base, old, new, offsets)
        except PackerError:
            calls.append((old, False))
            raise
        calls.append((old, True))
        return size

    monkeypatch.setattr(RecordIOShardWriter, "renumber", classmethod(spy))
    out = tmp_path / "merged"
    merge_datasets(out, [a, b], log=lambda _: None)
    check_records(out, records(a) + records(b))
    assert snapshot(b) == before
    assert sorted(c[0] for c in calls) == [s["first"] for s in b_meta["shards"]]
    assert {c[1] for c in calls} == {True, False}  # cloned and renumbered; or written anew
    na = len(json.loads((a / META_NAME).read_text())["shards"])
    files, theirs = shard_files(out), shard_files(b)
    for k in range(len(b_meta["shards"])):
        mine = files[f"shard-{na + k:05d}.rec"]
        assert mine.stat().st_ino != theirs[f"shard-{k:05d}.rec"].stat().st_ino
        assert mine.stat().st_nlink == 1
