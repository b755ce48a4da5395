"""Several shards with several workers: each pool process writes whole shards (the shard
task), and the dataset is the same byte for byte as a one-process build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packer.build import build, temp_dir_for
from packer.config import BuildConfig
from packer.errors import InputError
from packer.verify import verify
from tests.conftest import write_tree


def dataset_files(out: Path) -> dict[str, bytes]:
    """Every file of a dataset but the lock file, meta.json without its build-time fields."""
    files = {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("lock.mdb", "meta.json")
    }
    meta = json.loads((out / "meta.json").read_text())
    for name in ("created", "options", "source"):
        meta.pop(name)
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_tree(root, {"a": 40, "b": 30, "c": 20})
    # bad inputs early on, so every later shard gets another first id than it was written with
    (root / "a" / "aaa_bad.png").write_bytes(b"not a png")
    (root / "b" / "aaa_bad.jpg").write_bytes(b"\xff\xd8 cut")
    return root


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_shards_in_a_pool_give_the_same_dataset(tmp_path: Path, src: Path, fmt: str) -> None:
    outs = {}
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}"
        cfg = BuildConfig(src=src, out=out, format=fmt, shard_size=2500, workers=workers)
        summary = build(cfg)
        assert summary.shards > 3
        assert summary.skipped == 2
        outs[workers] = dataset_files(out)
    assert outs[2] == outs[1]
    assert outs[3] == outs[1]
    assert verify(tmp_path / "out3", deep=True) == []


def test_on_error_fail_stops_at_the_first_bad_input_in_entry_order(
    tmp_path: Path, src: Path
) -> None:
    (src / "c" / "zzz_bad.png").write_bytes(b"also bad")  # a later bad input, in another shard
    out = tmp_path / "out"
    cfg = BuildConfig(src=src, out=out, shard_size=2500, workers=2, on_error="fail")
    with pytest.raises(InputError, match=r"a/aaa_bad\.png"):
        build(cfg)
    assert not out.exists()
    assert not temp_dir_for(out).exists()
