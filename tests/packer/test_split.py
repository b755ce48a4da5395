"""``packer split``: parts disjoint and complete, deterministic for a seed, stratified
proportions, records equal to the source's, each part verified."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.errors import ConfigError
from packer.regroup import assign_splits, parse_fractions, split_counts
from readers import open_dataset
from readers.formats.layout import INDEX_NAME
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def test_parse_fractions() -> None:
    assert parse_fractions("train=0.9,val=0.1") == {"train": 0.9, "val": 0.1}
    for bad in ("train=0.9", "train=0.5,train=0.5", "a=x,b=1", "a/b=1", "a=0,b=1"):
        with pytest.raises(ConfigError, match="--into"):
            parse_fractions(bad)


def test_split_counts_largest_remainder() -> None:
    assert split_counts(10, [0.9, 0.1]) == [9, 1]
    assert split_counts(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5, 1.75, 1.75
    for total in range(0, 40):
        for fr in ([0.9, 0.1], [1 / 3] * 3, [0.7, 0.2, 0.1]):
            counts = split_counts(total, fr)
            assert sum(counts) == total
            assert all(abs(c - total * f) < 1 for c, f in zip(counts, fr, strict=True))


def test_assign_splits_invariants() -> None:
    rng = np.random.default_rng(0)
    labels = [int(x) for x in rng.integers(0, 4, 203)]
    fractions = {"train": 0.8, "val": 0.15, "test": 0.05}
    for seed in range(5):
        for stratify in (False, True):
            parts = assign_splits(labels, fractions, seed=seed, stratify=stratify)
            every = np.concatenate(list(parts.values()))
            assert sorted(every.tolist()) == list(range(203))  # disjoint and complete
            again = assign_splits(labels, fractions, seed=seed, stratify=stratify)
            assert all(np.array_equal(parts[k], again[k]) for k in parts)
            if stratify:
                for label, total in Counter(labels).items():
                    got = [sum(labels[i] == label for i in parts[k]) for k in fractions]
                    assert got == split_counts(total, list(fractions.values()))
    one = assign_splits(labels, fractions, seed=1, stratify=False)
    two = assign_splits(labels, fractions, seed=2, stratify=False)
    assert not np.array_equal(one["val"], two["val"])


def test_split_writes_parts_record_by_record(tmp_path: Path, fmt: str) -> None:
    files = write_tree(tmp_path / "src", {"cat": 10, "dog": 6, "eel": 4})
    out = build_packed(tmp_path / "src", tmp_path / "all", fmt, workers=1, shard_size=3000)
    parts = tmp_path / "parts"
    args = ["split", str(out), str(parts), "--into", "train=0.5,val=0.5", "--seed", "3"]
    result = runner.invoke(app, [*args, "--stratify"])
    assert result.exit_code == 0, result.output
    src_rows = [json.loads(line) for line in (out / INDEX_NAME).read_text().splitlines()]
    seen: list[str] = []
    for name in ("train", "val"):
        assert runner.invoke(app, ["verify", str(parts / name), "--deep"]).exit_code == 0
        ds = open_dataset(str(parts / name), decode="bytes")
        part_rows = [json.loads(x) for x in (parts / name / INDEX_NAME).read_text().splitlines()]
        meta = json.loads((parts / name / "meta.json").read_text())
        assert meta["classes"] == ["cat", "dog", "eel"]
        for i, row in enumerate(part_rows):
            data, label = ds[i]
            assert bytes(data) == files[row["path"]]
            assert meta["classes"][label] == row["path"].split("/")[0]
        seen += [r["path"] for r in part_rows]
        counts = Counter(r["path"].split("/")[0] for r in part_rows)
        assert counts == {"cat": 5, "dog": 3, "eel": 2}  # stratified: half of each class
    assert sorted(seen) == sorted(r["path"] for r in src_rows)  # disjoint and complete
    # the same seed again gives the same parts
    first = (parts / "val" / INDEX_NAME).read_bytes()
    again = runner.invoke(app, [*args, "--stratify", "--overwrite"])
    assert again.exit_code == 0, again.output
    assert (parts / "val" / INDEX_NAME).read_bytes() == first


def test_parts_are_given_with_into_only(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"cat": 2, "dog": 2})
    out = build_packed(tmp_path / "src", tmp_path / "all", "lmdb", workers=1)
    parts = tmp_path / "parts"
    result = runner.invoke(app, ["split", str(out), str(parts), "train=0.5,val=0.5"])
    assert result.exit_code == 2
    assert result.output.startswith("packer: error: split takes OUT and DIR only")
    assert "give the parts with --into, e.g. packer split OUT DIR --into train=0.9" in (
        result.output
    )
    assert not parts.exists()
    both = ["split", str(out), str(parts), "a=0.5,b=0.5", "--into", "train=0.5,val=0.5"]
    assert runner.invoke(app, both).exit_code == 2
    assert not parts.exists()
