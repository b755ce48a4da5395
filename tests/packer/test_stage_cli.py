"""``packer stage OUT DIR``: exit codes, what it prints, and the staged directory it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from readers.formats import FORMATS, REGISTRY
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


def test_staging_a_rebuilt_dataset_removes_the_older_copy(
    packed: Path, tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = runner.invoke(app, ["stage", str(packed), str(cache)])
    assert first.exit_code == 0, first.output
    old = Path(first.stdout.strip())
    src, _ = tree
    (src / "cat" / "img_000.png").unlink()  # another build: another meta.json
    rebuilt = runner.invoke(app, ["build", str(src), str(packed), "--overwrite"])
    assert rebuilt.exit_code == 0, rebuilt.output
    second = runner.invoke(app, ["stage", str(packed), str(cache)])
    assert second.exit_code == 0, second.output
    new = Path(second.stdout.strip())
    assert new != old
    assert not old.exists()
    assert f"removed 1 staged copy(ies) of older builds of {packed}: {old.name}" in second.stderr
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [new.name]


def test_a_planted_link_is_not_staged_and_a_linked_shard_is_refused(
    packed: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOP SECRET")
    secret.chmod(0o600)
    os.symlink(secret, packed / "evil")
    result = runner.invoke(app, ["stage", str(packed), str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert not (Path(result.stdout.strip()) / "evil").exists()

    meta = json.loads((packed / META_NAME).read_text())
    rel = REGISTRY[meta["format"]].shard_files(meta["shards"][-1]["name"])[0]
    os.rename(packed / rel, tmp_path / "moved")
    os.symlink(tmp_path / "moved", packed / rel)
    result = runner.invoke(app, ["stage", str(packed), str(tmp_path / "cache2")])
    assert result.exit_code == 2
    assert f"{packed / rel}: is a symbolic link, not a regular file" in result.stderr
    assert result.stdout == ""
