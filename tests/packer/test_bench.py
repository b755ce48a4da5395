"""packer bench: a real DataLoader over a small packed dataset, through the CLI (no timing
asserts), and the pure parts: recommendation, collate, warnings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from packer.bench import (
    MIN_ROUNDS,
    STABLE_SPREAD,
    BenchReport,
    BenchRow,
    Storage,
    collate,
    more_rounds,
    recommend,
    shm_warnings,
    spread,
    storage_warnings,
    system,
)
from packer.build import build
from packer.cli import app
from packer.config import BuildConfig, usable_cores
from tests.conftest import write_tree

runner = CliRunner()

FAST = ["--batch-size", "4", "--batches", "3", "--warmup", "1"]


def write_fixed(root: Path, classes: dict[str, int], *, size: int = 16) -> None:
    """Class folders of same-size PNG/JPEG images, so the default collate stacks them."""
    rng = np.random.default_rng(0)
    for cls, count in classes.items():
        (root / cls).mkdir(parents=True)
        for i in range(count):
            image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            ext = ".png" if i % 2 == 0 else ".jpg"
            ok, buf = cv2.imencode(ext, image)
            assert ok
            (root / cls / f"img_{i:03d}{ext}").write_bytes(buf.tobytes())


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    src, out = root / "src", root / "out.lmdb"
    write_fixed(src, {"a": 10, "b": 10})
    build(BuildConfig(src=src, out=out, workers=1, progress=False), log=lambda _m: None)
    return src, out


def table_rows(output: str, source: str = "packed") -> dict[int, list[str]]:
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == source and cells[1].isdigit():
            rows[int(cells[1])] = cells
    return rows


def test_table_has_a_row_per_worker_count_and_a_recommendation(packed):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0,1,2"])
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert sorted(rows) == [0, 1, 2]
    assert all(float(r[2].replace(",", "")) > 0 for r in rows.values())
    verdict = [
        line for line in result.stdout.splitlines() if line.startswith(("use ", "the machine"))
    ]
    assert len(verdict) == 1  # a choice, or (on a busy machine) a word that it cannot tell
    assert int(verdict[0].split("num_workers=")[-1].split(":")[0].rstrip(")")) in rows
    assert "20 samples" in result.stdout


@pytest.fixture(scope="module", params=["lmdb", "recordio"])
def packed_raw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`packer build --encode raw` (decoded pixels, not images) in each format."""
    root = tmp_path_factory.mktemp(f"bench-raw-{request.param}")
    src, out = root / "src", root / f"out.{request.param}"
    write_fixed(src, {"a": 10, "b": 10})
    args = ["build", str(src), str(out), "--format", request.param, "--encode", "raw"]
    result = runner.invoke(app, [*args, "--workers", "1", "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert {r["format"] for r in rows} == {"raw"}
    return out


@pytest.mark.parametrize(("decode", "channels"), [("rgb", 3), ("bgr", 3), ("gray", 1)])
def test_bench_reads_raw_pixels(packed_raw, decode, channels):
    fmt = packed_raw.suffix[1:]
    args = ["bench", str(packed_raw), *FAST, "--workers", "0,1", "--decode", decode]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["format"] == fmt
    assert report["num_samples"] == 20
    for r in report["results"]:
        assert r["samples"] == 12 * r["rounds"]  # each round: 3 batches of 4
        assert r["samples_per_s"] > 0
        assert r["stacked"]  # every sample came back as a 16x16 array, so the batch stacks
        assert r["batch_bytes"] == 4 * 16 * 16 * channels + 4 * 8
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert f"20 samples ({fmt}" in text.stdout
    assert sorted(table_rows(text.stdout)) == [0, 1]
    assert "the images differ in size" not in text.stdout


def corrupt_first_png(out: Path) -> None:
    """Overwrite the signature of the first PNG stored in the dataset's shard files."""
    signature = b"\x89PNG\r\n\x1a\n"
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.suffix != ".json"):
        data = bytearray(path.read_bytes())
        at = data.find(signature)
        if at >= 0:
            data[at : at + 16] = bytes(16)
            path.write_bytes(bytes(data))
            return
    raise AssertionError(f"no PNG stored under {out}")


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_a_sample_that_cannot_be_read_fails_the_bench_instead_of_hanging(tmp_path, fmt):
    # with num_workers=0 paddle reads in a thread that dies silently on an exception and
    # leaves the loader waiting forever; a subprocess with a timeout turns a hang into a failure
    src, out = tmp_path / "src", tmp_path / f"out.{fmt}"
    write_fixed(src, {"a": 4})
    build(BuildConfig(src=src, out=out, format=fmt, workers=1, progress=False), log=lambda _m: None)
    corrupt_first_png(out)
    for workers in ("0", "1"):
        args = ["bench", str(out), *FAST, "--workers", workers]
        run = subprocess.run(
            [sys.executable, "-m", "packer.cli", *args], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 2, (workers, run.stderr[-2000:])
        assert "packer: error:" in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr


def test_json_has_the_fields(packed):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0,1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_samples"] == 20
    assert report["format"] == "lmdb"
    assert [r["num_workers"] for r in report["results"]] == [0, 1]
    assert report["recommended_num_workers"] in (0, 1)
    for r in report["results"]:
        assert r["samples_per_s"] > 0
        assert MIN_ROUNDS <= r["rounds"] <= 3 * MIN_ROUNDS
        assert r["batches"] == 3 * r["rounds"]  # --batches is per timed round
        assert r["samples"] == 12 * r["rounds"]
        assert len(r["round_samples_per_s"]) == r["rounds"]
        assert r["spread"] == pytest.approx(spread(r["round_samples_per_s"]))
        assert r["spread"] <= STABLE_SPREAD or r["rounds"] == 3 * MIN_ROUNDS
        assert r["samples_per_s"] == pytest.approx(np.median(r["round_samples_per_s"]))
        assert r["mean_wait_ms"] >= 0
        assert r["batch_bytes"] == 4 * 16 * 16 * 3 + 4 * 8  # images and int64 labels
        assert r["cpu_cores"] is None or r["cpu_cores"] >= 0
    assert isinstance(report["warnings"], list)
    assert report["compare"] == []
    assert report["max_spread"] == max(r["spread"] for r in report["results"])
    assert report["stable"] == (report["max_spread"] <= STABLE_SPREAD)


def test_default_workers_are_zero_to_the_cores(packed):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *FAST, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["num_workers"] for r in report["results"]] == list(range(usable_cores() + 1))


def test_workers_above_the_cores_warn(packed):
    _, out = packed
    too_many = usable_cores() + 1
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", f"1,{too_many}"])
    assert result.exit_code == 0, result.output
    assert f"num_workers={too_many} is above the {usable_cores()} usable cores" in result.stdout


def test_compare_times_the_loose_files(packed):
    src, out = packed
    args = ["bench", str(out), *FAST, "--workers", "0,1", "--compare", str(src)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert sorted(table_rows(result.stdout, "loose")) == [0, 1]
    assert "vs loose" in result.stdout

    report = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert report["compare_src"] == str(src)
    assert [r["source"] for r in report["compare"]] == ["loose", "loose"]


def test_compare_refuses_another_tree(packed, tmp_path):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *FAST, "--compare", str(tmp_path)])
    assert result.exit_code == 2
    assert "does not exist; SRC must be the directory the dataset was built from" in (result.output)


def test_transform_presets_and_bytes(packed):
    _, out = packed
    for extra in (["--transform", "resize224"], ["--transform", "imagenet"], ["--decode", "bytes"]):
        result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "1", *extra])
        assert result.exit_code == 0, (extra, result.output)
        assert sorted(table_rows(result.stdout)) == [1]


def test_images_of_different_sizes_are_timed_as_lists(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    write_tree(src, {"cat": 6, "dog": 6})
    build(BuildConfig(src=src, out=out, workers=1, progress=False), log=lambda _m: None)
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "0,1"])
    assert result.exit_code == 0, result.output
    assert "the images differ in size" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "a,b"], "expected comma-separated counts"),
        (["--workers", "-1"], "must be >= 0"),
        (["--transform", "blur"], "--transform 'blur'"),
        (["--decode", "bytes", "--transform", "resize224"], "use --transform none"),
        (["--decode", "cmyk"], "--decode"),
        (["--batch-size", "0"], "--batch-size 0"),
    ],
)
def test_bad_options_exit_2(packed, args, message):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_not_a_dataset_exits_2(tmp_path):
    result = runner.invoke(app, ["bench", str(tmp_path)])
    assert result.exit_code == 2
    assert "packer: error:" in result.output


def row(workers: int, rate: float, spread: float = 0.0) -> BenchRow:
    return BenchRow("packed", workers, 10, 640, 1.0, rate, 1.0, 1.0, 1000, spread=spread)


def test_recommend_the_smallest_within_95_percent():
    assert recommend([row(0, 50), row(1, 96), row(2, 100), row(3, 99)]).num_workers == 1
    assert recommend([row(0, 50), row(1, 94), row(2, 100)]).num_workers == 2
    assert recommend([row(0, 100), row(1, 60)]).num_workers == 0


def test_recommend_the_smallest_within_the_noise_of_the_best():
    # the best's rounds disagree by 8%: 93/s is as fast as 100/s within that noise
    assert recommend([row(0, 50), row(1, 93), row(2, 100, spread=0.08)]).num_workers == 1
    assert recommend([row(0, 50), row(1, 91), row(2, 100, spread=0.08)]).num_workers == 2


def test_spread_and_when_to_time_another_round():
    assert spread([100.0, 110.0, 90.0]) == pytest.approx(0.2)
    assert spread([100.0]) == 0.0
    assert more_rounds([])
    assert more_rounds([100.0, 100.0])
    assert not more_rounds([100.0, 101.0, 99.0])  # 2% apart: done
    assert more_rounds([100.0, 130.0, 90.0])  # 40% apart: once more
    assert not more_rounds([100.0, 130.0, 90.0] * 3)  # but 9 rounds at most
    assert more_rounds([100.0, 101.0], least=5)


def report_of(rows: list[BenchRow]) -> BenchReport:
    return BenchReport("d", "lmdb", 640, 1, 4, 64, "rgb", "none", "3 rounds", rows=rows)


def test_a_busy_machine_is_reported_instead_of_a_choice():
    quiet = report_of([row(0, 50, 0.02), row(1, 98, 0.03), row(2, 100, 0.04)])
    assert quiet.verdict().startswith("use num_workers=1: 98 samples/s")
    assert quiet.as_dict()["stable"] is True
    busy = report_of([row(0, 50, 0.02), row(1, 70, 0.35), row(2, 100, 0.04)])
    line = busy.verdict()
    assert line.startswith("the machine was too busy to tell: spread 35% at num_workers=1")
    assert "run again on a quiet machine" in line
    assert not any(x.startswith("use ") for x in busy.text().splitlines())
    assert busy.as_dict()["stable"] is False
    assert busy.as_dict()["max_spread"] == 0.35
    assert "spread" in busy.text().splitlines()[2]  # the table's header


def test_collate_stacks_same_shapes_and_keeps_lists_otherwise():
    a, b = np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)
    images, labels = collate([(a, 1), (b, 2)])
    assert images.shape == (2, 4, 4, 3)
    assert labels.dtype == np.int64
    images, labels = collate([(a, "x"), (np.zeros((5, 4, 3), np.uint8), None)])
    assert isinstance(images, list)
    assert labels == ["x", None]
    images, _ = collate([(b"abc", 0), (b"de", 1)])
    assert images == [b"abc", b"de"]


def test_shm_warnings(monkeypatch):
    monkeypatch.setattr(system, "shm_free", lambda: 64 * 2**20)  # docker's default 64 MiB
    big = 64 * 224 * 224 * 3 * 4  # a batch of 64 float32 224x224 images: 38.5 MB
    (warning,) = shm_warnings(shared_memory=True, batch_bytes=big, workers=4, prefetch_factor=2)
    assert "/dev/shm has 67 MB free" in warning
    assert "--shm-size" in warning
    assert shm_warnings(shared_memory=True, batch_bytes=1000, workers=4, prefetch_factor=2) == []
    assert shm_warnings(shared_memory=True, batch_bytes=big, workers=0, prefetch_factor=2) == []
    (off,) = shm_warnings(shared_memory=False, batch_bytes=1, workers=2, prefetch_factor=2)
    assert "shared memory is off" in off
    monkeypatch.setattr(system, "shm_free", lambda: None)
    (missing,) = shm_warnings(shared_memory=True, batch_bytes=1, workers=2, prefetch_factor=2)
    assert "/dev/shm is missing" in missing


def test_no_shared_memory_warns(packed):
    _, out = packed
    result = runner.invoke(app, ["bench", str(out), *FAST, "--workers", "1", "--no-shared-memory"])
    assert result.exit_code == 0, result.output
    assert "warning: shared memory is off" in result.stdout


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        (Storage("/mnt/data", "nfs4", "server:/export"), "network or userspace filesystem (nfs4"),
        (Storage("/mnt/s3", "fuse.s3fs", "s3fs"), "network or userspace filesystem"),
        (Storage("/", "ext4", "/dev/sda1", "sda", "8:0", True), "on sda, which reports itself"),
        (Storage("/", "ext4", "/dev/nvme0n1p1", "nvme0n1", "259:0", False), None),
        (Storage("/dev/shm", "tmpfs", "tmpfs"), None),
    ],
)
def test_storage_warnings(monkeypatch, tmp_path, storage, expected):
    monkeypatch.setattr(system, "storage_of", lambda _path: storage)
    warnings = storage_warnings(tmp_path, 1000)
    if expected is None:
        assert warnings == []
    else:
        (warning,) = warnings
        assert expected in warning
        assert "/dev/shm or a local SSD" in warning


def test_storage_of_finds_the_mount_of_a_real_path(tmp_path):
    where = system.storage_of(tmp_path)
    assert where is not None
    assert str(tmp_path).startswith(where.mountpoint)
    assert where.fstype
