"""Sources are read where the scan found them: a folder swapped for a symlink to outside SRC
between the scan and the read is ``outside_src``, and nothing outside SRC is packed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import packer.build
from packer.build import build
from packer.config import BuildConfig
from tests.conftest import write_tree


def swap_after_scan(monkeypatch: pytest.MonkeyPatch, folder: Path, target: Path) -> None:
    """Once the build has scanned and planned (it sizes the sources next), replace `folder`
    by a symlink to `target`."""
    real = packer.build.source_sizes

    def sizes_then_swap(entries: Any) -> list[int]:
        sizes = real(entries)
        folder.rename(folder.with_name(".moved-away"))
        folder.symlink_to(target, target_is_directory=True)
        return sizes

    monkeypatch.setattr(packer.build, "source_sizes", sizes_then_swap)


@pytest.mark.parametrize(
    ("engine", "workers", "shard_size"),
    [("local", 1, 1 << 30), ("local", 2, 1 << 30), ("local", 2, 2000), ("ray", 2, 2000)],
    ids=["local-1", "local-2-one-shard", "local-2-shards", "ray"],
)
def test_a_folder_swapped_for_a_link_outside_src_is_not_read(
    tmp_path, monkeypatch, engine, workers, shard_size
):
    if engine == "ray":
        pytest.importorskip("ray")
    src = tmp_path / "src"
    inside = write_tree(src, {"cat": 40, "dog": 40}, seed=1)
    outside = write_tree(tmp_path / "elsewhere", {"cat": 40}, seed=2)  # same names, other bytes
    assert all(inside[rel] != outside[rel] for rel in outside)
    swap_after_scan(monkeypatch, src / "cat", tmp_path / "elsewhere" / "cat")
    out = tmp_path / "out"
    cfg = BuildConfig(
        src=src, out=out, workers=workers, shard_size=shard_size, engine=engine, progress=False
    )
    build(cfg, log=lambda _: None)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    cats = sorted(rel for rel in inside if rel.startswith("cat/"))
    assert sorted(e["path"] for e in errors) == cats
    assert {e["reason"] for e in errors} == {"outside_src"}
    assert "replaced by a link after the scan" in errors[0]["message"]
    rows = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert sorted(r["path"] for r in rows) == sorted(
        rel for rel in inside if rel.startswith("dog/")
    )


def test_links_that_stay_inside_src_are_read(tmp_path):
    from packer.source import read_source

    src = tmp_path / "src"
    files = write_tree(src, {"cat": 2})
    (src / "alias").symlink_to(src / "cat", target_is_directory=True)
    root = os.path.realpath(src)
    for rel, data in files.items():
        assert read_source(str(src / "alias" / Path(rel).name), rel, root=root) == data
    found = read_source(
        str(src / "cat" / "img_000.png"), "cat/img_000.png", root=str(tmp_path / "x")
    )
    assert not isinstance(found, bytes)
    assert found.reason == "outside_src"
