"""``packer split`` puts its parts in place together; merge and split pair class names with
the index of the same build.

A ``kill -9`` while the parts are written leaves the old parts of the old split, a later
part's bad destination is found before anything is written, and an append between reading a
source's meta.json and its index cannot pair old class names with new labels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import packer.regroup
import readers.index
from packer.append import append, append_config, read_dataset
from packer.cli import app
from packer.packed import PackedRecords
from packer.regroup import merge_datasets, split_dataset
from packer.splitting import KILL_AT_ENV, STAGING_NAME
from readers import open_dataset
from readers.formats.layout import INDEX_NAME, META_NAME
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def paths_of(root: Path) -> list[str]:
    return [json.loads(x)["path"] for x in (root / INDEX_NAME).read_text().splitlines()]


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "lock.mdb"
    }


def check_parts(parts: Path, source: Path, seed: int) -> None:
    """DIR/train and DIR/val verify, are disjoint, cover the source, and are of `seed`."""
    train, val = paths_of(parts / "train"), paths_of(parts / "val")
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(paths_of(source))
    for name in ("train", "val"):
        verified = runner.invoke(app, ["verify", str(parts / name)])
        assert verified.exit_code == 0, verified.output
        meta = json.loads((parts / name / META_NAME).read_text())
        assert meta["options"]["split"]["seed"] == seed
        assert list(meta["options"]["split"]["fractions"]) == ["train", "val"]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", {"cat": 6, "dog": 5, "eel": 3})
    return build_packed(tmp_path / "src", tmp_path / "all", "lmdb", workers=1, shard_size=3000)


def split_args(source: Path, parts: Path, seed: int) -> list[str]:
    return ["split", str(source), str(parts), "--into", "train=0.5,val=0.5", "--seed", str(seed)]


def test_kill_9_between_parts_leaves_the_old_split(source: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    first = runner.invoke(app, split_args(source, parts, 1))
    assert first.exit_code == 0, first.output
    before = snapshot(parts)
    # a re-split with another seed, killed once train is written and before val is
    cmd = [sys.executable, "-m", "packer.cli", *split_args(source, parts, 2), "--overwrite"]
    env = {**os.environ, KILL_AT_ENV: "part"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert (parts / STAGING_NAME / "train" / META_NAME).exists()  # train was written, aside
    assert {k: v for k, v in snapshot(parts).items() if not k.startswith(".")} == before
    check_parts(parts, source, seed=1)
    # the next split clears what the killed one left and puts both new parts in place
    again = runner.invoke(app, [*split_args(source, parts, 2), "--overwrite"])
    assert again.exit_code == 0, again.output
    assert "left by an interrupted split" in again.output
    assert sorted(p.name for p in parts.iterdir()) == ["train", "val"]
    check_parts(parts, source, seed=2)


def test_kill_9_amid_putting_parts_in_place_is_seen_by_verify(source: Path, tmp_path: Path) -> None:
    """The one moment a kill can leave two splits' parts: verify names the mismatch."""
    parts = tmp_path / "parts"
    assert runner.invoke(app, split_args(source, parts, 1)).exit_code == 0
    cmd = [sys.executable, "-m", "packer.cli", *split_args(source, parts, 2), "--overwrite"]
    env = {**os.environ, KILL_AT_ENV: "published"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    for name, other in (("train", "val"), ("val", "train")):
        result = runner.invoke(app, ["verify", str(parts / name)])
        assert result.exit_code == 1, result.output
        assert f"split part '{other}' beside it, {parts / other}, is of another split" in (
            result.output
        )
        assert "seed 1, here 2" in result.output or "seed 2, here 1" in result.output
    assert runner.invoke(app, [*split_args(source, parts, 2), "--overwrite"]).exit_code == 0
    check_parts(parts, source, seed=2)  # verify agrees again


def test_a_bad_later_destination_is_found_before_anything_is_written(
    source: Path, tmp_path: Path
) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "val").write_text("not a dataset")
    result = runner.invoke(app, split_args(source, parts, 1))
    assert result.exit_code == 2
    assert f"packer: error: {parts / 'val'} already exists" in result.output
    assert sorted(p.name for p in parts.iterdir()) == ["val"]  # no train, no leftovers
    # with --overwrite, a val that is not a dataset is refused, and the old train stays
    (parts / "val").unlink()
    assert runner.invoke(app, split_args(source, parts, 1)).exit_code == 0
    before = snapshot(parts / "train")
    (parts / "val" / META_NAME).unlink()
    (parts / "val" / "notes.txt").write_text("mine")
    result = runner.invoke(app, [*split_args(source, parts, 2), "--overwrite"])
    assert result.exit_code == 2
    assert "val holds no meta.json, so it is not a packer dataset" in result.output
    assert snapshot(parts / "train") == before
    assert not (parts / STAGING_NAME).exists()


def test_a_failure_while_parts_are_put_in_place_puts_them_back(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = tmp_path / "parts"
    split_dataset(source, parts, {"train": 0.5, "val": 0.5}, seed=1, log=lambda _: None)
    before = snapshot(parts)
    import packer.splitting

    real_swap = packer.splitting._swap
    calls = []

    def failing_swap(final: Path, staged: Path) -> None:
        calls.append(final.name)
        if len(calls) == 2:  # val: after train was exchanged
            raise OSError(5, "injected")
        real_swap(final, staged)

    monkeypatch.setattr(packer.splitting, "_swap", failing_swap)
    with pytest.raises(OSError, match="injected"):
        split_dataset(
            source, parts, {"train": 0.5, "val": 0.5}, seed=2, overwrite=True, log=lambda _: None
        )
    assert snapshot(parts) == before  # train put back: both parts of seed 1
    check_parts(parts, source, seed=1)


def grow(dataset: Path, tmp_path: Path) -> None:
    """Append a new class ``fox`` (and more cats) to `dataset`, growing its class list."""
    more = tmp_path / "more"
    for rel, data in write_tree(more, {"fox": 2, "cat": 1}, seed=9).items():
        cls, name = rel.split("/")
        (more / rel).rename(more / cls / f"new_{name}")
        assert data
    cfg = append_config(dataset, more, read_dataset(dataset))
    append(cfg, class_map="grow", log=lambda _: None)


def check_labels(root: Path) -> None:
    """Every record's label names its class folder, through the part's class list."""
    meta = json.loads((root / META_NAME).read_text())
    ds = open_dataset(str(root), decode="bytes")
    for i, path in enumerate(paths_of(root)):
        _, label = ds[i]
        assert meta["classes"][label] == path.split("/")[0], (path, label, meta["classes"])


def append_before_the_index_is_read(monkeypatch: pytest.MonkeyPatch, grown: Path, tmp: Path):
    """Make the first `PackedRecords` of `grown` run an append to it first."""
    real = PackedRecords
    done: list[Path] = []

    def records(root: Path) -> Any:
        if root == grown and not done:
            done.append(root)
            grow(root, tmp)
        return real(root)

    monkeypatch.setattr(packer.regroup, "PackedRecords", records)
    return done


def test_split_takes_class_names_from_the_build_it_reads(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = append_before_the_index_is_read(monkeypatch, source, tmp_path)
    parts = tmp_path / "parts"
    split_dataset(source, parts, {"train": 0.5, "val": 0.5}, seed=0, log=lambda _: None)
    assert done
    assert sorted(paths_of(parts / "train") + paths_of(parts / "val")) == sorted(paths_of(source))
    for name in ("train", "val"):
        assert json.loads((parts / name / META_NAME).read_text())["classes"][-1] == "fox"
        check_labels(parts / name)


def test_merge_takes_class_names_from_the_build_it_reads(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path / "b", {"dog": 2, "ant": 2}, seed=3)
    other = build_packed(tmp_path / "b", tmp_path / "b.lmdb", "lmdb", workers=1)
    done = append_before_the_index_is_read(monkeypatch, source, tmp_path)
    merged = tmp_path / "merged"
    merge_datasets(merged, [other, source], log=lambda _: None)
    assert done
    assert json.loads((merged / META_NAME).read_text())["classes"] == [
        "ant",
        "dog",
        "cat",
        "eel",
        "fox",
    ]
    check_labels(merged)


def test_an_append_amid_loading_the_index_is_loaded_again(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """meta.json read, then the dataset appended to, then the index read: loaded again."""
    real = readers.index.load_meta
    done: list[bool] = []

    def load_meta_then_append(root: Any) -> Any:
        meta = real(root)
        if Path(root) == source and not done:
            done.append(True)
            grow(source, tmp_path)
        return meta

    monkeypatch.setattr(readers.index, "load_meta", load_meta_then_append)
    records = PackedRecords(source)
    assert done
    now = json.loads((source / META_NAME).read_text())
    assert records.meta["classes"] == now["classes"] == ["cat", "dog", "eel", "fox"]
    assert records.n == now["num_samples"] == 14 + 3
