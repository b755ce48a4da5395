"""``packer stage OUT DIR``: exit codes, what it prints, and the staged directory it leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from readers.formats import FORMATS
from readers.formats.layout import META_NAME

runner = CliRunner()


@pytest.fixture
def packed(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> Path:
    src, files = tree
    out = tmp_path / "out"
    total = sum(len(b) for b in files.values())
    result = runner.invoke(
        app,
        ["build", str(src), str(out), "--format", FORMATS[-1], "--shard-size", str(total // 3)],
    )
    assert result.exit_code == 0, result.output
    return out


def _num_shards(out: Path) -> int:
    return int(json.loads((out / META_NAME).read_text())["num_shards"])


def test_stage_prints_the_staged_directory_and_what_it_did(packed: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    n = _num_shards(packed)
    assert n >= 2
    result = runner.invoke(app, ["stage", str(packed), str(cache)])
    assert result.exit_code == 0, result.output
    root = Path(result.stdout.strip())
    assert root.parent == cache
    assert (root / META_NAME).read_bytes() == (packed / META_NAME).read_bytes()
    assert f"{n} of {n} shards staged in {root} (copied {n}," in result.stderr
    assert "already there 0" in result.stderr

    again = runner.invoke(app, ["stage", str(packed), str(cache), "--check"])
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == str(root)
    assert f"(copied 0, 0.0 MB; already there {n})" in again.stderr


def test_shards_over_the_limit_are_named_and_left_at_the_origin(
    packed: Path, tmp_path: Path
) -> None:
    result = runner.invoke(app, ["stage", str(packed), str(tmp_path / "cache"), "--limit", "1KB"])
    assert result.exit_code == 0, result.output
    n = _num_shards(packed)
    assert f"0 of {n} shards staged" in result.stderr
    assert f"{n} shard(s) did not fit under --limit 1KB and will be read from {packed}" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "lots"], "expected bytes or a size such as 20GiB"),
        (["--limit", "-5"], "expected bytes or a size"),
    ],
)
def test_bad_limit_exits_2(packed: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["stage", str(packed), str(tmp_path / "cache"), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_not_a_packed_dataset_exits_2(tree: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    src, _ = tree
    result = runner.invoke(app, ["stage", str(src), str(tmp_path / "cache")])
    assert result.exit_code == 2
    assert result.stderr.startswith("packer: error: ")
    assert "no meta.json; only a packed dataset (packer build) can be staged" in result.stderr
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_console_script_shows_a_progress_bar(packed: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "packer.cli",
            "stage",
            str(packed),
            str(tmp_path / "c"),
            "--progress",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "staging out: 100%" in proc.stderr
    assert Path(proc.stdout.strip()).is_dir()
