"""``packer convert`` killed with ``kill -9`` at each step (amid a shard, after a shard, amid the
index merge, after it, just before publishing): no OUT appears under its final name, and
``packer convert --resume`` (or a plain rerun) then writes exactly the bytes of an uninterrupted
convert, which ``packer verify --deep`` passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.convert import ConvertConfig, convert
from packer.repack import KILL_AT_ENV, STEPS
from packer.verify import verify
from tests.conftest import build_packed

runner = CliRunner()
SHARD_SIZE = "1500"  # several output shards from the 11 images of the `tree` fixture


def dataset_files(root: Path) -> dict[str, Any]:
    """Every file of a dataset, meta.json parsed without its time and tool version."""
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "lock.mdb":
            continue
        name = path.relative_to(root).as_posix()
        if name == "meta.json":
            meta = json.loads(path.read_text(encoding="utf-8"))
            meta.pop("created"), meta.pop("tool_version")
            found[name] = meta
        else:
            found[name] = path.read_bytes()
    return found


def killed_convert(src: Path, out: Path, fmt: str, step: str) -> None:
    """``packer convert`` in a subprocess that kills itself at `step`."""
    cmd = [sys.executable, "-m", "packer.cli", "convert", str(src), str(out)]
    cmd += ["--format", fmt, "--shard-size", SHARD_SIZE]
    env = {**os.environ, KILL_AT_ENV: step}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stdout + proc.stderr


@pytest.fixture
def source(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> Path:
    src, _ = tree
    return build_packed(src, tmp_path / "in.lmdb", "lmdb")


@pytest.mark.parametrize("to_format", ["lmdb", "recordio"])
@pytest.mark.parametrize("step", STEPS)
def test_kill_9_then_resume_gives_the_bytes_of_an_uninterrupted_convert(
    source: Path, tmp_path: Path, step: str, to_format: str
) -> None:
    whole = tmp_path / "whole"
    convert(ConvertConfig(source, whole, format=to_format, shard_size=int(SHARD_SIZE)))
    expected = dataset_files(whole)
    assert len(json.loads((whole / "meta.json").read_text())["shards"]) >= 3
    out = tmp_path / "out"
    killed_convert(source, out, to_format, step)
    assert not out.exists()  # never a half-written OUT under its final name
    partial = tmp_path / ".out.partial"
    assert partial.is_dir()
    first = ("shard-00000", "shard-00000.rec", "shard-00000.idx")  # the first shard's files
    kept = {
        p.relative_to(partial).as_posix(): p.stat().st_ino
        for p in partial.rglob("*")
        if p.is_file() and p.relative_to(partial).parts[0] in first and p.name != "lock.mdb"
    }
    args = ["convert", str(source), str(out), "--format", to_format, "--shard-size", SHARD_SIZE]
    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert not partial.exists()
    assert dataset_files(out) == expected
    assert verify(out, deep=True) == []
    if step in ("writing", "shard"):  # the finished first shard was kept, not written again
        assert "1 finished shard(s) kept" in result.output
        assert kept
        assert {n: (out / n).stat().st_ino for n in kept} == kept


@pytest.mark.parametrize("step", ["writing", "merging", "meta"])
def test_kill_9_then_a_plain_rerun_starts_over(source: Path, tmp_path: Path, step: str) -> None:
    whole = tmp_path / "whole"
    convert(ConvertConfig(source, whole, format="recordio", shard_size=int(SHARD_SIZE)))
    out = tmp_path / "out"
    killed_convert(source, out, "recordio", step)
    assert not out.exists()
    args = ["convert", str(source), str(out), "--format", "recordio", "--shard-size", SHARD_SIZE]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "removing the unfinished build" in result.output
    assert dataset_files(out) == dataset_files(whole)
    assert verify(out, deep=True) == []
