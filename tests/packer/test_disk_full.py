"""A real full disk (a small tmpfs) during a build: a clear error, no OUT, then --resume."""

from __future__ import annotations

import os
import subprocess

import pytest

from packer.build import build, temp_dir_for
from packer.config import BuildConfig
from packer.errors import DiskFullError
from packer.verify import verify
from tests.conftest import write_tree


def mount_tmpfs(path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
    )
    return result.returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not mount_tmpfs(disk, "600k"):
        pytest.skip("needs root to mount a tmpfs; test_build_lmdb covers ENOSPC with a shim")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_full_disk_then_resume(tmp_path, small_disk, fmt):
    src = tmp_path / "src"
    write_tree(src, {"a": 150, "b": 150})
    out = small_disk / "out"
    with pytest.raises(DiskFullError, match="disk is full"):
        build(BuildConfig(src=src, out=out, format=fmt, shard_size=40_000))
    assert not out.exists()
    assert temp_dir_for(out).exists()
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    build(BuildConfig(src=src, out=out, format=fmt, shard_size=40_000, resume=True))
    assert verify(out, deep=True) == []
    assert not temp_dir_for(out).exists()
