"""Node-local staging: real datasets built by packer, copied into a cache directory by several
processes at once, killed mid-copy, corrupted, evicted, and read through a DataLoader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paddle
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import ShardStream, open_dataset
from readers.formats import FORMATS, REGISTRY
from readers.formats.layout import META_NAME
from readers.io import handles
from readers.staging import Stager, StagingError, parse_size, release, stage
from readers.staging.files import TMP_MARK
from tests.conftest import encode, make_image, write_tree

REPO = Path(__file__).resolve().parents[2]


def packed(tmp_path: Path, fmt: str, *, name: str = "ds", seed: int = 0, shards: int = 3) -> Path:
    """A packed dataset of 24 small images in about `shards` shards."""
    src = tmp_path / f"src-{name}"
    files = write_tree(src, {"a": 12, "b": 12}, seed=seed)
    out = tmp_path / f"{name}.{fmt}"
    total = sum(len(b) for b in files.values())
    build(BuildConfig(src=src, out=out, format=fmt, shard_size=total // shards + 1))
    return out


def big_single_shard(tmp_path: Path, fmt: str) -> Path:
    """One shard of about 9 MB (random pixels do not compress): copies take several blocks."""
    src = tmp_path / "src-big" / "a"
    src.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(10):
        (src / f"{i}.png").write_bytes(encode(make_image(rng, 640, 480), ".png"))
    out = tmp_path / f"big.{fmt}"
    build(BuildConfig(src=src.parent, out=out, format=fmt))
    return out


def shard_files(root: Path) -> dict[str, bytes]:
    """Every shard file under `root` (links followed) by relative path."""
    meta = json.loads((root / META_NAME).read_text())
    names = {s["name"] for s in meta["shards"]}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for entry in root.iterdir()
        if entry.name.split(".", 1)[0] in names
        for p in ([entry] if entry.is_file() else sorted(entry.iterdir()))
        if p.name != "lock.mdb"
    }


def samples(root: Path) -> list[tuple[bytes, object]]:
    ds = open_dataset(root, decode="bytes", verify_crc=True)
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(autouse=True)
def _release_holds(tmp_path: Path) -> Iterator[None]:
    yield
    for root in (tmp_path / "cache").glob("*"):
        release(root)


@pytest.mark.parametrize("fmt", FORMATS)
def test_staged_copy_reads_like_the_origin(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    result = Stager(out, tmp_path / "cache").run()
    meta = json.loads((out / META_NAME).read_text())
    assert meta["num_shards"] >= 2
    assert result.copied == [s["name"] for s in meta["shards"]]
    assert result.origin == result.reused == []
    root = result.root
    for entry in root.iterdir():
        if entry.is_symlink():  # every shard now resolves inside the cache
            assert entry.resolve().is_relative_to((tmp_path / "cache").resolve())
    assert shard_files(root) == shard_files(out)
    assert samples(root) == samples(out)
    again = Stager(out, tmp_path / "cache").run()
    assert again.root == root
    assert again.copied == []
    assert again.reused == result.copied


def test_other_dataset_and_changed_origin_get_their_own_copy(tmp_path: Path) -> None:
    fmt = FORMATS[0]
    first = packed(tmp_path, fmt, name="one", seed=1)
    second = packed(tmp_path, fmt, name="two", seed=2)
    root1 = stage(first, tmp_path / "cache")
    root2 = stage(second, tmp_path / "cache")
    assert root1 != root2
    assert samples(root1) == samples(first)
    assert samples(root2) == samples(second)
    # rebuilt in place with other images: new meta.json, new identity, fresh copy
    build(
        BuildConfig(
            src=tmp_path / "src-two", out=first, format=fmt, shard_size=4000, overwrite=True
        )
    )
    handles.close_all()  # the old environment at this path is still open in this process
    root3 = stage(first, tmp_path / "cache")
    assert root3 not in (root1, root2)
    assert samples(root3) == samples(first) == samples(second)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_replaced_origin_shard_is_copied_again(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    stage(out, tmp_path / "cache", hold=False)
    victim = next(iter(shard_files(out)))
    os.utime(out / victim, ns=(1, 1))  # same bytes, other mtime: cannot be trusted as copied
    result = Stager(out, tmp_path / "cache").run()
    assert result.repaired == result.copied == [victim.split("/")[0].split(".")[0]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_processes_copy_each_shard_once(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt, shards=4)
    go = tmp_path / "go"
    code = """
        import json, sys, time
        from pathlib import Path
        from readers.staging import Stager
        go = Path(sys.argv[3])
        while not go.exists():
            time.sleep(0.005)
        # slow copies down so that the processes really meet at the locks
        r = Stager(sys.argv[1], sys.argv[2], progress=lambda n: time.sleep(0.2)).run()
        print(json.dumps({"root": str(r.root), "copied": r.copied, "reused": r.reused}))
    """
    procs = [run_python(code, str(out), str(tmp_path / "cache"), str(go)) for _ in range(4)]
    time.sleep(1.0)
    go.touch()
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        results.append(json.loads(stdout))
    shards = [s["name"] for s in json.loads((out / META_NAME).read_text())["shards"]]
    copied = sorted(name for r in results for name in r["copied"])
    assert copied == sorted(shards)  # each shard copied by exactly one process
    for r in results:
        assert sorted(r["copied"] + r["reused"]) == sorted(shards)
    assert len({r["root"] for r in results}) == 1
    assert samples(Path(results[0]["root"])) == samples(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_9_mid_copy_leaves_no_usable_half_copy(tmp_path: Path, fmt: str) -> None:
    out = big_single_shard(tmp_path, fmt)
    cache = tmp_path / "cache"
    marker = tmp_path / "copying"
    code = """
        import sys, time
        from pathlib import Path
        from readers.staging import stage
        from readers.staging.files import BLOCK
        done = 0
        def progress(n):  # stop inside the shard's big file, one block in
            global done
            done += n
            if done >= BLOCK:
                Path(sys.argv[3]).write_text(str(done))
                time.sleep(600)
        stage(sys.argv[1], sys.argv[2], progress=progress)
    """
    proc = run_python(code, str(out), str(cache), str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (root,) = (p for p in cache.iterdir() if p.is_dir())
    partial = [p for p in (root / ".staging" / "data").iterdir() if TMP_MARK in p.name]
    assert partial, "the process was not killed mid-copy"
    cut = [p for t in partial for p in ([t] if t.is_file() else t.iterdir())]
    big = max(len(data) for data in shard_files(out).values())
    assert any(0 < p.stat().st_size < big for p in cut), "no half-written file"
    assert not list((root / ".staging" / "shards").glob("*.json"))  # no manifest: not staged
    for entry in root.iterdir():  # the shard still resolves to the origin
        if entry.is_symlink():
            assert entry.resolve().is_relative_to(out.resolve())
    assert samples(root) == samples(out)

    result = Stager(out, cache).run()
    assert result.copied == ["shard-00000"]
    assert not [p for p in (root / ".staging" / "data").iterdir() if TMP_MARK in p.name]
    assert not list((root / ".staging" / "shards").glob("*.reserve"))
    assert shard_files(root) == shard_files(out)
    assert samples(root) == samples(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupted_or_truncated_copy_is_detected_and_replaced(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    cache = tmp_path / "cache"
    root = stage(out, cache, hold=False)
    copies = sorted(p for p in (root / ".staging" / "data").rglob("*") if p.is_file())
    flipped, cut = copies[0], copies[-1]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(bytes(data))  # same size: only the CRC tells
    cut.write_bytes(cut.read_bytes()[:-1])  # shorter: the size check tells
    plain = Stager(out, cache).run()
    assert len(plain.repaired) == 1  # the truncated one, from sizes alone
    release(root)
    checked = Stager(out, cache, check=True).run()
    assert len(checked.repaired) == 1  # the flipped one, from its CRC-32
    assert set(plain.repaired) != set(checked.repaired)
    assert shard_files(root) == shard_files(out)
    assert samples(root) == samples(out)


def test_origin_shard_that_disagrees_with_meta_is_refused(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[-1])
    victim = out / next(iter(shard_files(out)))
    with open(victim, "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(StagingError, match=r"records \d+ bytes of shard files, found .*changed"):
        stage(out, tmp_path / "cache")
    with pytest.raises(StagingError, match=r"no meta\.json"):
        stage(tmp_path / "src-ds", tmp_path / "cache")


def _shard_bytes(out: Path) -> int:
    return sum(int(s["file_bytes"]) for s in json.loads((out / META_NAME).read_text())["shards"])


def test_least_recently_used_shards_are_evicted_first_unless_in_use(tmp_path: Path) -> None:
    fmt = FORMATS[-1]
    cache = tmp_path / "cache"
    a, b, c, d = (packed(tmp_path, fmt, name=n, seed=i, shards=1) for i, n in enumerate("abcd"))
    one = max(_shard_bytes(x) for x in (a, b, c, d))
    # the copies of meta.json and the index of all four datasets count against the limit too
    small = sum(
        p.stat().st_size
        for x in (a, b, c, d)
        for p in x.iterdir()
        if p.is_file() and p.name not in shard_files(x)
    )
    limit = 2 * one + small + one // 2  # room for two shards, never three
    ra = Stager(a, cache, cache_limit=limit, hold=False).run()
    rb = Stager(b, cache, cache_limit=limit, hold=False).run()
    assert ra.copied == rb.copied == ["shard-00000"]
    time.sleep(0.05)
    Stager(a, cache, cache_limit=limit, hold=False).run()  # a used after b: b is now the LRU
    rc = Stager(c, cache, cache_limit=limit, hold=False).run()
    assert rc.copied == ["shard-00000"]
    assert rc.evicted == [f"{rb.root.name}/shard-00000"]
    assert samples(rb.root) == samples(b)  # an evicted shard resolves to its origin again
    assert (rb.root / next(iter(shard_files(b)))).resolve().is_relative_to(b.resolve())

    # a is now the LRU, but this process holds it (hold=True): c goes instead
    Stager(a, cache, cache_limit=limit, hold=True).run()
    time.sleep(0.05)
    Stager(c, cache, cache_limit=limit, hold=False).run()
    Stager(a, cache, cache_limit=limit, hold=True).run()
    rd = Stager(d, cache, cache_limit=limit, hold=False).run()
    assert rd.evicted == [f"{rc.root.name}/shard-00000"]
    release(ra.root)


def _small_bytes(out: Path) -> int:
    """The bytes of a dataset's files that staging copies besides its shards."""
    shards = shard_files(out)
    return sum(p.stat().st_size for p in out.iterdir() if p.is_file() and p.name not in shards)


def test_a_dataset_left_without_shards_is_removed_unless_in_use(tmp_path: Path) -> None:
    fmt = FORMATS[0]
    cache = tmp_path / "cache"
    a, b = (packed(tmp_path, fmt, name=n, seed=i, shards=1) for i, n in enumerate("ab"))
    limit = _small_bytes(b) + _shard_bytes(b) + _small_bytes(a) // 2  # b fits only without a

    # a is staged, but its shard does not fit; this process keeps using it (hold=True)
    ra = Stager(a, cache, cache_limit=_small_bytes(a) + 1, hold=True).run()
    assert ra.origin == ["shard-00000"]
    rb = Stager(b, cache, cache_limit=limit, hold=False).run()
    assert rb.origin == ["shard-00000"]  # a's directory is in use: not removed
    assert ra.root.is_dir()

    release(ra.root)
    rb = Stager(b, cache, cache_limit=limit, hold=False).run()
    assert rb.copied == ["shard-00000"]
    assert not ra.root.exists()
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [rb.root.name]
    assert samples(rb.root) == samples(b)


def test_a_shard_that_does_not_fit_is_read_from_the_origin(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[0])
    result = Stager(out, tmp_path / "cache", cache_limit=parse_size("1KiB")).run()
    assert result.copied == []
    assert len(result.origin) == json.loads((out / META_NAME).read_text())["num_shards"]
    assert samples(result.root) == samples(out)


def test_parse_size() -> None:
    assert parse_size("20GiB") == 20 << 30
    assert parse_size("500MB") == 500_000_000
    assert parse_size("1.5k") == 1500
    assert parse_size(4096) == 4096
    assert parse_size(None) is None
    with pytest.raises(StagingError, match="expected bytes or a size"):
        parse_size("lots")


def crc_of(data: object) -> np.ndarray:
    """A transform: the CRC-32 of the stored bytes, a fixed-size array a batch can hold."""
    return np.array(zlib.crc32(bytes(data)), dtype=np.int64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dataloader_workers_read_a_staged_dataset(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    dataset_class = REGISTRY[fmt].dataset_class()  # LmdbDataset, RecordIODataset
    cache = tmp_path / "cache"
    ds = dataset_class(out, decode="bytes", transform=crc_of, cache_dir=cache, cache_limit="1GiB")
    assert ds.root.parent == cache
    staged = [e for e in ds.root.iterdir() if e.is_symlink()]
    assert staged
    assert all(e.resolve().is_relative_to(cache.resolve()) for e in staged)
    ds[0]  # opened in the parent first: workers must open their own handles
    loader = paddle.io.DataLoader(
        ds, batch_size=4, num_workers=2, shuffle=False, use_shared_memory=True
    )
    got = [
        (int(crc), int(label))
        for crcs, labels in loader
        for crc, label in zip(crcs.numpy().ravel(), labels.numpy().ravel(), strict=True)
    ]
    want = [(zlib.crc32(data), label) for data, label in samples(out)]
    assert got == want
    assert len(got) == 24


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_stream_reads_a_staged_copy_through_workers(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    cache = tmp_path / "cache"
    stream = ShardStream(
        out,
        decode="bytes",
        transform=crc_of,
        shuffle=False,
        rank=0,
        world_size=1,
        cache_dir=cache,
        cache_limit="1GiB",
    )
    assert stream.dataset.root.parent == cache
    loader = paddle.io.DataLoader(stream, batch_size=4, num_workers=2)
    got = sorted(
        (int(crc), int(label))
        for crcs, labels in loader
        for crc, label in zip(crcs.numpy().ravel(), labels.numpy().ravel(), strict=True)
    )
    assert got == sorted((zlib.crc32(data), label) for data, label in samples(out))
    with pytest.raises(ValueError, match="cache_dir= needs a dataset path"):
        ShardStream(open_dataset(out), cache_dir=cache)
