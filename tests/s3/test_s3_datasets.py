"""Datasets in S3 (moto's server on loopback): build OUT URL, verify, info, stage, read back.

Every command and reader takes the ``s3://`` URL; what they see equals the local build of the
same tree sample by sample.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from readers.formats.layout import META_NAME
from readers.remote import DatasetNotFoundError
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def _cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _crc(data: object) -> np.ndarray:
    """A transform: the CRC-32 of the stored bytes, a fixed-size array a batch can hold."""
    return np.array(zlib.crc32(bytes(data)), dtype=np.int64)  # type: ignore[call-overload]


def _samples(ds: Any) -> list[tuple[bytes, Any]]:
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def test_build_to_s3_then_every_reader_and_command(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, bucket: str, fmt: str, s3fs_client: Any
) -> None:
    from readers import LmdbDataset, RecordIODataset, open_dataset

    src, _ = tree
    url = f"{bucket}/out.{fmt}"
    done = _cli("build", str(src), url, "--format", fmt, "--workers", "1")
    assert done.exit_code == 0, done.output
    assert f"-> {url}" in done.stdout
    local = build_packed(src, tmp_path / f"local.{fmt}", fmt)

    meta = json.loads(s3fs_client.cat_file(f"{url}/{META_NAME}"))
    prefix = meta["data_prefix"]
    assert prefix.startswith("g-")
    listed = {p.split(f"/out.{fmt}/", 1)[1] for p in s3fs_client.find(url)}
    assert META_NAME in listed
    assert all(n == META_NAME or n.startswith(f"{prefix}/") for n in listed)
    local_files = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()} - {
        META_NAME
    }
    assert {n.split("/", 1)[1] for n in listed if n != META_NAME} == local_files

    verified = _cli("verify", "--deep", url)
    assert verified.exit_code == 0, verified.output
    assert f"{url}: OK (deep)" in verified.stdout

    info = _cli("info", "--json", url)
    assert info.exit_code == 0, info.output
    remote_info, local_info = (
        json.loads(info.stdout),
        json.loads(_cli("info", "--json", str(local)).stdout),
    )
    assert remote_info["path"] == url
    for key in ("num_samples", "num_shards", "payload_bytes", "classes", "format"):
        assert remote_info.get(key) == local_info.get(key), key

    cache = tmp_path / "cache"
    staged = _cli("stage", url, str(cache))
    assert staged.exit_code == 0, staged.output
    assert Path(staged.stdout.strip()).parent == cache

    expected = _samples(open_dataset(local, decode="bytes"))
    assert _samples(open_dataset(url, cache_dir=cache, decode="bytes")) == expected
    cls = LmdbDataset if fmt == "lmdb" else RecordIODataset
    assert _samples(cls(url, cache_dir=cache, decode="bytes")) == expected


def test_a_dataloader_with_workers_reads_one_staged_copy(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, bucket: str
) -> None:
    import paddle

    from readers import LmdbDataset

    src, files = tree
    url = f"{bucket}/out.lmdb"
    assert _cli("build", str(src), url, "--workers", "1").exit_code == 0
    ds = LmdbDataset(url, cache_dir=tmp_path / "cache", decode="bytes", transform=_crc)
    assert str(ds.root).startswith(str(tmp_path / "cache"))
    loader = paddle.io.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    got = sorted(int(c) for crcs, _ in loader for c in crcs.numpy().ravel())
    assert got == sorted(zlib.crc32(data) for data in files.values())
    assert len(list((tmp_path / "cache").glob("out.lmdb-*"))) == 1  # one staged copy


def test_a_url_without_cache_dir_is_staged_in_the_user_cache(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, bucket: str, monkeypatch: Any
) -> None:
    from readers import open_dataset

    src, files = tree
    url = f"{bucket}/out.lmdb"
    assert _cli("build", str(src), url, "--workers", "1").exit_code == 0
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "user-cache"))
    ds = open_dataset(url, decode="bytes")
    assert sorted(bytes(ds[i][0]) for i in range(len(ds))) == sorted(files.values())
    assert str(ds.root).startswith(str(tmp_path / "user-cache"))


def test_no_meta_json_means_no_dataset(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, bucket: str, s3fs_client: Any
) -> None:
    from readers import open_dataset

    src, _ = tree
    local = build_packed(src, tmp_path / "local.lmdb", "lmdb")
    url = f"{bucket}/half.lmdb"
    for path in local.rglob("*"):  # everything but meta.json: an upload cut short
        if path.is_file() and path.name != META_NAME:
            s3fs_client.put_file(str(path), f"{url}/{path.relative_to(local).as_posix()}")
    with pytest.raises(DatasetNotFoundError, match=r"half\.lmdb: no dataset there \(no meta"):
        open_dataset(url, cache_dir=tmp_path / "cache")
    verified = _cli("verify", url)
    assert verified.exit_code == 1
    assert "no dataset there" in verified.stdout
    for command in (("info", url), ("stage", url, str(tmp_path / "c2"))):
        result = _cli(*command)
        assert result.exit_code == 2
        assert "no dataset there" in result.stderr


def test_an_existing_dataset_is_not_replaced_without_overwrite(
    tree: tuple[Path, dict[str, bytes]], bucket: str
) -> None:
    src, _ = tree
    url = f"{bucket}/out.lmdb"
    assert _cli("build", str(src), url, "--workers", "1").exit_code == 0
    again = _cli("build", str(src), url, "--workers", "1")
    assert again.exit_code == 2
    assert "exists" in again.stderr


def test_overwrite_switches_meta_last_and_old_readers_keep_their_copy(
    tmp_path: Path, bucket: str, s3fs_client: Any
) -> None:
    from readers import open_dataset

    first = write_tree(tmp_path / "a", {"cat": 3, "dog": 2}, seed=1)
    second = write_tree(tmp_path / "b", {"eel": 4}, seed=2)
    url = f"{bucket}/out.lmdb"
    assert _cli("build", str(tmp_path / "a"), url, "--workers", "1").exit_code == 0
    old_prefix = json.loads(s3fs_client.cat_file(f"{url}/{META_NAME}"))["data_prefix"]
    old = open_dataset(url, cache_dir=tmp_path / "cache", decode="bytes")

    done = _cli("build", str(tmp_path / "b"), url, "--workers", "1", "--overwrite")
    assert done.exit_code == 0, done.output
    assert f"removed the replaced generation {old_prefix}/" in done.stdout
    new_prefix = json.loads(s3fs_client.cat_file(f"{url}/{META_NAME}"))["data_prefix"]
    assert new_prefix != old_prefix
    assert not s3fs_client.exists(f"{url}/{old_prefix}/index.jsonl")

    # a reader of the old version reads its staged copy, whole and unmixed
    assert sorted(bytes(old[i][0]) for i in range(len(old))) == sorted(first.values())
    new = open_dataset(url, cache_dir=tmp_path / "cache", decode="bytes")
    assert sorted(bytes(new[i][0]) for i in range(len(new))) == sorted(second.values())


def _upload_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env["PACKER_WORK_DIR"] = str(tmp_path / "packer-work")
    return env


def test_kill_9_mid_upload_leaves_no_meta_json_and_resume_sends_only_the_rest(
    tmp_path: Path, bucket: str, s3fs_client: Any
) -> None:
    from packer.publish import PAUSE_ENV
    from readers import open_dataset

    files = write_tree(tmp_path / "src", {"cat": 6, "dog": 6}, seed=3)
    url = f"{bucket}/out.recordio"
    args = [
        sys.executable,
        "-m",
        "packer.cli",
        "build",
        str(tmp_path / "src"),
        url,
        "--format",
        "recordio",
        "--shard-size",
        "3KB",
        "--workers",
        "1",
        "--no-progress",
    ]
    env = _upload_env(tmp_path) | {PAUSE_ENV: "3"}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until 3 objects are up, then kill -9
        if "upload paused" in line:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    uploaded = [p for p in s3fs_client.find(url) if not p.endswith(META_NAME)]
    assert len(uploaded) >= 3
    assert not s3fs_client.exists(f"{url}/{META_NAME}")
    with pytest.raises(DatasetNotFoundError):
        open_dataset(url, cache_dir=tmp_path / "cache")
    verified = _cli("verify", url)
    assert verified.exit_code == 1
    assert "no dataset there" in verified.stdout

    before = {p: s3fs_client.info(p)["LastModified"] for p in uploaded}
    from packer.publish import publish  # the Python API says what it sent and kept

    local = next((tmp_path / "packer-work").glob("out-*")) / "out.recordio"
    assert (local / META_NAME).exists()  # the local build finished before the upload
    result = publish(local, url, resume=True)
    kept = {f"{url.removeprefix('s3://')}/{result.prefix}/{rel}" for rel in result.kept}
    assert kept == set(before)
    assert set(result.sent).isdisjoint(result.kept)
    assert (
        len(result.sent) + len(result.kept) == len([p for p in local.rglob("*") if p.is_file()]) - 1
    )
    for path, stamp in before.items():  # kept objects were not sent again
        assert s3fs_client.info(path)["LastModified"] == stamp
    ds = open_dataset(url, cache_dir=tmp_path / "cache", decode="bytes")
    assert sorted(bytes(ds[i][0]) for i in range(len(ds))) == sorted(files.values())


def test_resume_through_the_cli_after_a_kill(tmp_path: Path, bucket: str) -> None:
    from packer.publish import PAUSE_ENV

    write_tree(tmp_path / "src", {"cat": 6, "dog": 6}, seed=4)
    url = f"{bucket}/out.lmdb"
    args = [
        sys.executable,
        "-m",
        "packer.cli",
        "build",
        str(tmp_path / "src"),
        url,
        "--shard-size",
        "3KB",
        "--workers",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(
        args, env=_upload_env(tmp_path) | {PAUSE_ENV: "2"}, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "upload paused" in line:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = subprocess.run(
        [*args, "--resume"], env=_upload_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "already uploaded, kept" in done.stderr
    assert _cli("verify", url).exit_code == 0


def test_a_reader_staging_a_version_that_is_replaced_meanwhile_is_told_so(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, bucket: str, s3fs_client: Any
) -> None:
    from readers.staging import Stager, StagingError

    src, _ = tree
    url = f"{bucket}/out.lmdb"
    assert _cli("build", str(src), url, "--workers", "1").exit_code == 0
    stager = Stager(url, tmp_path / "cache")  # meta.json read: this version's objects named
    prefix = json.loads(s3fs_client.cat_file(f"{url}/{META_NAME}"))["data_prefix"]
    s3fs_client.rm(f"{url}/{prefix}/shard-00000", recursive=True)  # as --overwrite does
    with pytest.raises(StagingError, match=r"shard-00000/data\.mdb: gone since meta\.json"):
        stager.run()
