"""``packer build s3://bucket/images/ OUT``: the same dataset as from the local tree; and the
error that names the s3 extra when fsspec/s3fs are missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from packer.cli import app
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("meta.json", "lock.mdb")
    }


def test_a_source_in_s3_builds_the_dataset_of_the_same_local_tree(
    tmp_path: Path, bucket: str, s3fs_client: Any
) -> None:
    write_tree(tmp_path / "src", {"cat": 5, "dog": 4, "eel": 3}, seed=5)
    (tmp_path / "src" / "dog" / "broken.jpg").write_bytes(b"not an image")
    s3fs_client.put(str(tmp_path / "src") + "/", f"{bucket}/images/", recursive=True)
    local = build_packed(tmp_path / "src", tmp_path / "local.recordio", "recordio")

    out = tmp_path / "remote.recordio"
    done = runner.invoke(
        app, ["build", f"{bucket}/images/", str(out), "-f", "recordio", "--workers", "1"]
    )
    assert done.exit_code == 0, done.output
    assert "downloaded 13 object(s)" in done.stderr
    assert _shard_bytes(out) == _shard_bytes(local)  # index, shards, errors.jsonl alike


def test_a_source_and_an_output_in_s3(tmp_path: Path, bucket: str, s3fs_client: Any) -> None:
    files = write_tree(tmp_path / "src", {"cat": 3, "dog": 3}, seed=6)
    s3fs_client.put(str(tmp_path / "src") + "/", f"{bucket}/images/", recursive=True)
    url = f"{bucket}/out.lmdb"
    done = runner.invoke(app, ["build", f"{bucket}/images", url, "--workers", "1"])
    assert done.exit_code == 0, done.output
    from readers import open_dataset

    ds = open_dataset(url, cache_dir=tmp_path / "cache", decode="bytes")
    assert sorted(bytes(ds[i][0]) for i in range(len(ds))) == sorted(files.values())
    assert ds.index is not None
    assert ds.index.meta["source"] == f"{bucket}/images"  # not the local mirror


def test_an_empty_source_prefix_is_an_error(tmp_path: Path, bucket: str) -> None:
    done = runner.invoke(app, ["build", f"{bucket}/nothing/", str(tmp_path / "o.lmdb")])
    assert done.exit_code == 2
    assert "no objects under that prefix" in done.stderr


BLOCK = "import sys; sys.modules['{mod}'] = None\n"


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    for mod in ("fsspec", "s3fs"):
        code = BLOCK.format(mod=mod) + (
            "from packer.cli import main; sys.argv = ['packer', 'info', 's3://b/x.lmdb']; main()"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2, done.stderr
        assert f"needs the package {mod}" in done.stderr
        assert "pip install fsspec s3fs" in done.stderr
    code = BLOCK.format(mod="s3fs") + (
        "from readers.remote import filesystem\n"
        "try:\n    filesystem('s3://b/x')\n"
        "except ModuleNotFoundError as e:\n    print(type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
    )
    assert "StorageExtraMissingError" in done.stdout
