"""packer build --format lmdb: round trip, index, meta, sharding, atomicity, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import cv2
import lmdb
import numpy as np
import pytest

from packer.build import build, temp_dir_for
from packer.config import BuildConfig, parse_size
from packer.errors import (
    ConfigError,
    DiskFullError,
    InputError,
    NotADatasetError,
    OutputExistsError,
    PackerError,
)
from packer.writers.lmdb import LmdbShardWriter
from readers.formats.lmdb import NUM_SAMPLES_KEY, image_key, label_key
from tests.conftest import write_tree


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def read_shard(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


def test_round_trip_bytes_labels_and_index(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    summary = build(BuildConfig(src=src, out=out))
    assert summary.packed == len(files)
    assert summary.skipped == 0

    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "lmdb"
    assert meta["version"] == 1
    assert meta["classes"] == ["cat", "dog", "eel"]
    assert meta["num_samples"] == len(files) == meta["shards"][0]["count"]
    assert meta["label_source"] == "dirname"
    assert meta["source"] == str(src)
    assert meta["writer"]["lmdb"].startswith("0.9")
    for field in ("options", "created", "tool_version", "num_shards"):
        assert field in meta

    index = rows(out)
    assert [r["path"] for r in index] == sorted(files)
    kv = read_shard(out / "shard-00000")
    assert kv[NUM_SAMPLES_KEY] == str(len(files)).encode()
    for n, row in enumerate(index):
        data = files[row["path"]]
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        expected_label = ["cat", "dog", "eel"].index(row["path"].split("/")[0])
        assert row["id"] == n
        assert row["label"] == expected_label
        assert row["shard"] == 0
        assert row["key"] == f"image-{n + 1:09d}"
        assert row["nbytes"] == len(data)
        assert row["crc32"] == zlib.crc32(data)
        assert (row["width"], row["height"]) == (image.shape[1], image.shape[0])
        assert row["channels"] == (1 if image.ndim == 2 else image.shape[2])
        assert row["format"] == ("png" if row["path"].endswith(".png") else "jpeg")
        assert kv[image_key(n + 1)] == data
        assert kv[label_key(n + 1)] == str(expected_label).encode()
    assert (out / "errors.jsonl").read_text() == ""
    assert not temp_dir_for(out).exists()


def test_no_decode_check_measures_from_headers(tree, tmp_path):
    src, _ = tree
    a, b = tmp_path / "a", tmp_path / "b"
    build(BuildConfig(src=src, out=a))
    build(BuildConfig(src=src, out=b, decode_check=False))
    strip = [dict(r.items()) for r in rows(a)]
    assert strip == rows(b)


def test_shards_roll_over_by_size(tmp_path):
    src = tmp_path / "src"
    files = write_tree(src, {"a": 12, "b": 12})
    out = tmp_path / "out"
    shard_size = sum(len(v) for v in files.values()) // 5
    build(BuildConfig(src=src, out=out, shard_size=shard_size))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_shards"] >= 5
    first = 0
    for n, shard in enumerate(meta["shards"]):
        assert shard["name"] == f"shard-{n:05d}"
        assert shard["first"] == first
        assert shard["bytes"] <= shard_size or shard["count"] == 1
        kv = read_shard(out / shard["name"])
        assert kv[NUM_SAMPLES_KEY] == str(shard["count"]).encode()
        first += shard["count"]
    assert first == len(files)
    for row in rows(out):
        shard = meta["shards"][row["shard"]]
        local = row["id"] - shard["first"] + 1
        assert row["key"] == f"image-{local:09d}"
        assert read_shard(out / shard["name"])[image_key(local)] == files[row["path"]]


def test_map_grows_on_demand_and_file_is_not_sparse(tmp_path, monkeypatch):
    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    (src / "x").mkdir(parents=True)
    for i in range(6):  # ~190 KB of incompressible PNG each
        image = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
        _ok, buf = cv2.imencode(".png", image)
        (src / "x" / f"{i}.png").write_bytes(buf.tobytes())
    monkeypatch.setattr(LmdbShardWriter, "initial_map_size", 64 * 1024)
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out))
    data = out / "shard-00000" / "data.mdb"
    st = data.stat()
    assert st.st_blocks * 512 >= st.st_size * 0.9  # not sparse
    assert st.st_size < 4 * 1024 * 1024
    assert len(read_shard(out / "shard-00000")) == 6 * 3 + 1  # image, label, wh; num-samples


def test_bad_inputs_are_skipped_and_reported(tree, tmp_path):
    src, files = tree
    (src / "cat" / "empty.png").write_bytes(b"")
    (src / "cat" / "garbage.jpg").write_bytes(b"this is not a jpeg at all")
    (src / "dog" / "notes.bin").write_bytes(b"\x00\x01binary")
    good = files["cat/img_001.jpg"]
    (src / "dog" / "cut.jpg").write_bytes(good[: len(good) // 2])
    png = files["cat/img_000.png"]
    (src / "dog" / "broken.png").write_bytes(png[:20] + b"\x00" * 40 + png[-12:])
    (src / "dog" / "labels.txt").write_text("ignored metadata")
    (src / ".hidden.png").write_bytes(png)
    (src / "cat" / ".DS_Store").write_bytes(b"junk")
    (src / "loose.png").write_bytes(png)
    (src / "index.theme").write_text("[Icon Theme]")
    os.mkfifo(src / "eel" / "pipe.png")
    os.symlink(src, src / "eel" / "loop")
    os.symlink(tmp_path, src / "eel" / "escape")
    out = tmp_path / "out"
    summary = build(BuildConfig(src=src, out=out))
    reasons = {
        e["path"]: e["reason"]
        for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    }
    assert reasons == {
        "cat/empty.png": "empty",
        "cat/garbage.jpg": "not_image",
        "dog/notes.bin": "not_image",
        "dog/cut.jpg": "truncated",
        "dog/broken.png": "undecodable",
        "loose.png": "no_label",
        "index.theme": "not_image",
        "eel/pipe.png": "not_regular",
        "eel/loop": "symlink_loop",
        "eel/escape": "outside_src",
    }
    assert summary.packed == len(files)
    assert summary.skipped == len(reasons)
    assert sorted(r["path"] for r in rows(out)) == sorted(files)


def test_on_error_fail_stops_and_leaves_nothing(tree, tmp_path):
    src, _ = tree
    (src / "dog" / "zz_garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50 + b"IEND")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"dog/zz_garbage\.png: .*\[undecodable\]"):
        build(BuildConfig(src=src, out=out, on_error="fail"))
    assert not out.exists()
    assert not temp_dir_for(out).exists()


def test_existing_out_is_refused_unless_overwrite(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious").write_text("keep")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        build(BuildConfig(src=src, out=out))
    assert (out / "precious").read_text() == "keep"
    # issue 21: --overwrite replaces only a packer dataset, never a directory of other files
    with pytest.raises(NotADatasetError, match=r"holds no meta\.json"):
        build(BuildConfig(src=src, out=out, overwrite=True))
    assert (out / "precious").read_text() == "keep"
    (out / "precious").unlink()
    build(BuildConfig(src=src, out=out, overwrite=True))  # an empty directory may go
    (out / "stale").write_text("from the old build")
    build(BuildConfig(src=src, out=out, overwrite=True))
    assert not (out / "stale").exists()
    assert len(rows(out)) == len(files)
    assert not any(p.name.startswith(".out.") for p in tmp_path.iterdir())


def shard_files(out: Path) -> dict[str, bytes]:
    """Every data file of a dataset by relative path (lock.mdb holds no data)."""
    skip = ("lock.mdb", "meta.json", "index.parquet")
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def test_disk_full_keeps_finished_shards_and_resume_is_identical(tmp_path, monkeypatch):
    src = tmp_path / "src"
    write_tree(src, {"a": 30, "b": 30})
    (src / "a" / "bad.png").write_bytes(b"junk")
    ref = tmp_path / "ref"
    build(BuildConfig(src=src, out=ref, shard_size=3000))
    out = tmp_path / "out"
    calls = {"n": 0, "fail_at": 25}
    original = LmdbShardWriter.write

    def failing(self, local, sample_id, record):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise OSError(28, "No space left on device")
        return original(self, local, sample_id, record)

    monkeypatch.setattr(LmdbShardWriter, "write", failing)
    with pytest.raises(DiskFullError, match=r"disk is full .* run the same command with --resume"):
        build(BuildConfig(src=src, out=out, shard_size=3000))
    assert not out.exists()
    tmp = temp_dir_for(out)
    finished = sorted(p.name for p in tmp.glob("*.done.json"))
    assert finished
    calls.update(n=0, fail_at=-1)
    messages = []
    build(BuildConfig(src=src, out=out, shard_size=3000, resume=True), log=messages.append)
    assert any(f"{len(finished)} finished shard(s) kept" in m for m in messages)
    assert calls["n"] < 60  # the kept shards were not written again
    assert shard_files(out) == shard_files(ref)
    assert not tmp.exists()


def test_failure_that_is_our_bug_leaves_nothing(tree, tmp_path, monkeypatch):
    src, _ = tree
    out = tmp_path / "out"

    def broken(self, local, sample_id, record):
        raise RuntimeError("a bug")

    monkeypatch.setattr(LmdbShardWriter, "write", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        build(BuildConfig(src=src, out=out))
    assert not out.exists()
    assert not temp_dir_for(out).exists()


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_kill_9_then_resume_is_identical(tmp_path, fmt):
    src = tmp_path / "src"
    write_tree(src, {"a": 300, "b": 300})
    ref = tmp_path / "ref"
    build(BuildConfig(src=src, out=ref, format=fmt, shard_size=20_000))
    out = tmp_path / "out.lmdb"
    args = [
        sys.executable,
        "-m",
        "packer.cli",
        "build",
        str(src),
        str(out),
        "--workers",
        "1",
        "--shard-size",
        "20KB",
        "--format",
        fmt,
    ]
    for attempt in range(3):  # killed at a few different moments, resumed each time
        proc = subprocess.Popen(
            args + (["--resume"] if attempt else []),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        target = 2 + 3 * attempt
        while len(list(temp_dir_for(out).glob("*.done.json"))) < target:
            assert proc.poll() is None, "the build finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not out.exists()
    build(BuildConfig(src=src, out=out, format=fmt, shard_size=20_000, resume=True))
    assert shard_files(out) == shard_files(ref)
    assert json.loads((out / "meta.json").read_text())["num_samples"] == 600


def test_resume_with_other_options_starts_over(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out"
    tmp = temp_dir_for(out)
    tmp.mkdir()
    (tmp / "plan.json").write_text('{"digest": "something else", "shards": []}')
    (tmp / "shard-00000.done.json").write_text("{}")
    messages = []
    build(BuildConfig(src=src, out=out, resume=True), log=messages.append)
    assert any("cannot resume" in m for m in messages)
    assert len(rows(out)) == len(files)


def test_list_file_labels_and_refusals(tree, tmp_path):
    src, _files = tree
    listing = tmp_path / "train.txt"
    listing.write_text(
        "cat/img_000.png\thello world\n"
        "dog/img_001.jpg 7\n"
        "eel/img_000.png\t3\n"
        "/etc/passwd\t1\n"
        "../outside.png\t1\n"
        "cat/missing.png\t2\n"
        "cat/img_000.png\tagain\n"
        "just-one-field\n"
    )
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(listing)))
    assert [(r["path"], r["label"]) for r in rows(out)] == [
        ("cat/img_000.png", "hello world"),
        ("dog/img_001.jpg", 7),
        ("eel/img_000.png", 3),
    ]
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["reason"] for e in errors) == sorted(
        ["outside_src", "outside_src", "missing", "duplicate", "bad_line"]
    )
    kv = read_shard(out / "shard-00000")
    assert kv[label_key(1)] == b"hello world"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["label_source"] == f"list:{listing}"
    assert meta["classes"] is None


def test_labels_none_and_auto_without_folders(tmp_path):
    src = tmp_path / "flat"
    files = write_tree(src, {"x": 3})
    for rel in list(files):
        os.rename(src / rel, src / rel.split("/")[1])
    (src / "x").rmdir()
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out))
    assert [r["label"] for r in rows(out)] == [None, None, None]
    assert read_shard(out / "shard-00000")[label_key(1)] == b""


def test_nothing_packable_is_an_error(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.png").write_bytes(b"")
    with pytest.raises(PackerError, match=r"no image .* could be packed"):
        build(BuildConfig(src=src, out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_parse_size_and_config_errors(tmp_path):
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("500MB") == 500_000_000
    assert parse_size("4096") == 4096
    assert parse_size("1.5k") == 1500
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("lots")
    with pytest.raises(ConfigError, match="--format"):
        BuildConfig(src=tmp_path, out=tmp_path / "o", format="zip")
    with pytest.raises(ConfigError, match="does not exist"):
        BuildConfig(src=tmp_path / "nope", out=tmp_path / "o")


def test_parallel_build_is_identical(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a": 60, "b": 50})
    (src / "a" / "bad.png").write_bytes(b"nope")
    one, two = tmp_path / "one", tmp_path / "two"
    build(BuildConfig(src=src, out=one, workers=1))
    build(BuildConfig(src=src, out=two, workers=2))
    for name in ("index.jsonl", "errors.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes()
    assert read_shard(one / "shard-00000") == read_shard(two / "shard-00000")


def test_bytes_reread_after_a_parallel_check_must_match_it(tmp_path):
    from packer.prepare import restore_bytes as _restore
    from packer.records import Record

    path = tmp_path / "a.png"
    path.write_bytes(b"new content")
    stale = Record("a.png", 0, b"", "png", 1, 1, 3, zlib.crc32(b"checked content"))
    problem = _restore(stale, str(path))
    assert problem.reason == "changed"
    fresh = Record("a.png", 0, b"", "png", 1, 1, 3, zlib.crc32(b"new content"))
    assert _restore(fresh, str(path)).data == b"new content"
    path.unlink()
    assert _restore(fresh, str(path)).reason == "changed"


def test_a_second_build_of_the_same_out_fails_at_once(tree, tmp_path):
    import fcntl

    from packer.errors import BuildLockedError

    src, files = tree
    out = tmp_path / "out"
    with open(tmp_path / ".out.lock", "w") as held:  # as a running build holds it
        held.write("pid 12345")
        held.flush()
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(BuildLockedError, match=r"out is being built by pid 12345"):
            build(BuildConfig(src=src, out=out))
    assert not out.exists()
    build(BuildConfig(src=src, out=out))
    assert len(rows(out)) == len(files)
    assert not (tmp_path / ".out.lock").exists()
