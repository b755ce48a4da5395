"""--workers is bounded by what can be used: a build forks at most the usable cores, bench times
at most twice them; a negative count is refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from packer.bench import BenchConfig
from packer.build import build
from packer.cli import app
from packer.config import BuildConfig, usable_cores
from packer.errors import ConfigError

runner = CliRunner()


def test_build_caps_workers_at_the_usable_cores(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", str(src), str(out), "--workers", "1000000"])
    assert result.exit_code == 0, result.output
    assert f"--workers 1000000: using {usable_cores()}, the cores" in result.stderr
    assert f"packed {len(files)} images" in result.stdout
    # the pool is started with the config's count, which meta.json records
    assert json.loads((out / "meta.json").read_text())["options"]["workers"] == usable_cores()


def test_python_build_caps_workers_too(tree, tmp_path):
    src, files = tree
    cfg = BuildConfig(src=src, out=tmp_path / "out", workers=10**6, progress=False)
    assert cfg.workers == usable_cores()
    summary = build(cfg)
    assert summary.packed == len(files)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["options"]["workers"] == usable_cores()


def test_negative_build_workers_are_refused(tree, tmp_path):
    src, _ = tree
    result = runner.invoke(app, ["build", str(src), str(tmp_path / "out"), "--workers", "-3"])
    assert result.exit_code == 2
    assert "packer: error: --workers -3: must be at least 1" in result.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"--workers -3: must be at least 1"):
        BuildConfig(src=src, out=tmp_path / "out", workers=-3)


def test_bench_times_at_most_twice_the_cores(tmp_path):
    cap = 2 * usable_cores()
    cfg = BenchConfig(path=tmp_path, workers=(0, 1, 10**6, cap + 1))
    assert cfg.worker_cap == cap
    assert cfg.worker_counts == (0, 1, cap)
    assert BenchConfig(path=tmp_path, workers=(cap, 1)).worker_counts == (cap, 1)
    with pytest.raises(ConfigError, match=r"must be >= 0"):
        BenchConfig(path=tmp_path, workers=(1, -1))
