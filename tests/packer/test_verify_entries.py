"""packer verify reports what OUT holds besides the dataset (foreign entries, links), and passes a
fresh build and a staged copy, whose own extra files (lock.mdb, the staging state) do no harm."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from packer.cli import app
from packer.verify import verify
from readers.formats import REGISTRY
from readers.formats.layout import INDEX_NAME
from readers.staging import Stager, release
from tests.conftest import Packed, build_packed

runner = CliRunner()


def test_foreign_entries_are_reported_with_their_kind(packed: Packed, tmp_path: Path) -> None:
    out = packed.path
    secret = tmp_path / "secret"
    secret.write_text("not the dataset's")
    os.symlink(secret, out / "evil")
    (out / "notes.txt").write_text("a note")
    (out / "extra").mkdir()
    assert verify(out) == [
        "foreign entry: evil (symbolic link)",
        "foreign entry: extra (directory)",
        "foreign entry: notes.txt (regular file)",
    ]
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert "foreign entry: evil (symbolic link)" in result.stdout


def test_a_linked_dataset_file_is_reported(packed: Packed, tmp_path: Path) -> None:
    out = packed.path
    rel = REGISTRY[packed.format].shard_files("shard-00000")[0]
    os.rename(out / rel, tmp_path / "moved")
    os.symlink(tmp_path / "moved", out / rel)
    os.rename(out / INDEX_NAME, tmp_path / INDEX_NAME)
    os.symlink(tmp_path / INDEX_NAME, out / INDEX_NAME)
    problems = verify(out)
    assert (
        f"{INDEX_NAME}: is a symbolic link (to {tmp_path / INDEX_NAME}), expected a " in problems[0]
    )
    assert any(
        p.startswith(f"{rel}: is a symbolic link (to {tmp_path / 'moved'})") for p in problems
    )


def test_a_stray_file_in_a_shard_directory_is_foreign_but_lock_mdb_is_not(
    tmp_path: Path, tree: tuple[Path, dict[str, bytes]]
) -> None:
    src, _ = tree
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    assert (out / "shard-00000" / "lock.mdb").is_file()  # left by the build: harmless
    assert verify(out) == []
    (out / "shard-00000" / "stray.mdb").write_bytes(b"x")
    assert verify(out) == ["foreign entry: shard-00000/stray.mdb (regular file)"]


def test_a_staged_copy_verifies(packed: Packed, tmp_path: Path) -> None:
    """Its shards are links (into .staging, or to the origin when over the limit)."""
    for limit in (None, 1):
        cache = tmp_path / f"cache-{limit}"
        root = Stager(packed.path, cache, cache_limit=limit, hold=False).run().root
        assert verify(root) == []
        release(root)
