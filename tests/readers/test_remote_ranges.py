"""RecordIODataset(url) and ShardStream(url) read by byte range from a real S3 API on loopback.

The server is moto's standalone server (a subprocess); faults are injected by a proxy in front
of it (`tests/readers/s3_faults.py`), never by mocking the client.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest

from readers.errors import DatasetFormatError, RecordError
from readers.io import ranges
from readers.io.ranges import RemoteCredentialsError, RemoteObjectChangedError, RemoteReadError
from tests.conftest import build_packed, write_tree
from tests.readers.s3_faults import FaultProxy, moto_server, s3_options

pytest.importorskip("s3fs")
pytest.importorskip("moto")

BUCKET = "bucket"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """A moto S3 server on loopback for this module, with an empty bucket."""
    import s3fs

    with moto_server() as url:
        s3fs.S3FileSystem(**s3_options(url)).mkdir(BUCKET)
        yield url


@pytest.fixture
def proxy(endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the server."""
    p = FaultProxy(endpoint)
    yield p
    p.close()


@pytest.fixture(scope="module")
def uploaded(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A packed RecordIO dataset (2-3 shards, 40 images) on disk and uploaded: (dir, url)."""
    import s3fs

    tmp = tmp_path_factory.mktemp("remote")
    files = write_tree(tmp / "src", {"a": 15, "b": 15, "c": 10}, seed=3)
    size = sum(len(b) for b in files.values()) // 2 + 1
    out = build_packed(tmp / "src", tmp / "out", "recordio", shard_size=size)
    upload(s3fs.S3FileSystem(**s3_options(endpoint)), out, f"{BUCKET}/ds")
    return out, f"s3://{BUCKET}/ds"


def upload(fs: Any, local: Path, prefix: str) -> None:
    """Upload a dataset directory, meta.json last."""
    files = sorted(p for p in local.iterdir() if p.is_file())
    for p in sorted(files, key=lambda p: p.name == "meta.json"):
        fs.pipe_file(f"{prefix}/{p.name}", p.read_bytes())


def local_items(out: Path) -> list[tuple[bytes, Any]]:
    from readers import RecordIODataset

    ds = RecordIODataset(out, decode="bytes")
    return [ds[i] for i in range(len(ds))]


def open_remote(url: str, server: str, **kwargs: Any) -> Any:
    from readers import RecordIODataset

    kwargs.setdefault("storage_options", s3_options(server))
    return RecordIODataset(url, decode="bytes", **kwargs)


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our backoff shortened, so that the fault tests take little time."""
    monkeypatch.setattr(ranges, "BACKOFF_S", 0.01)


# --- reading in place -------------------------------------------------------------------------


def test_dataset_reads_by_range_equal_to_local(uploaded: tuple[Path, str], endpoint: str) -> None:
    out, url = uploaded
    ds = open_remote(url, endpoint)
    assert ds.url == url
    assert len(ds) == 40
    assert [ds[i] for i in range(len(ds))] == local_items(out)
    assert ds._shard_paths[1] == f"{url}/shard-00001.rec"


def test_prefetch_coalesces_a_chunk_into_one_get(uploaded: tuple[Path, str], endpoint: str) -> None:
    out, url = uploaded
    ds = open_remote(url, endpoint)
    cache = ds._remote.cache
    end = int(ds.shard_bounds[1])
    ds.prefetch(0, end)  # shard 0, some 10 KB: one ranged GET
    got = [ds[i] for i in range(end)]
    assert got == local_items(out)[:end]
    assert cache.gets == 1
    ds[end + 1]  # not hinted: one GET of that record alone
    assert cache.gets == 2


def test_dataloader_workers_read_by_range(uploaded: tuple[Path, str], endpoint: str) -> None:
    out, url = uploaded
    from readers import RecordIODataset

    ds = RecordIODataset(url, storage_options=s3_options(endpoint))
    loader = paddle.io.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b)
    labels = [label for batch in loader for _, label in batch]
    images = [img for batch in loader for img, _ in batch]
    local = RecordIODataset(out)
    assert labels == [local[i][1] for i in range(len(local))]
    assert all(np.array_equal(a, local[i][0]) for i, a in enumerate(images))


def test_shard_stream_reads_by_range(
    uploaded: tuple[Path, str], endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    from readers import ShardStream

    out, url = uploaded
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint),
    ):
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    remote = list(ShardStream(url, decode="bytes", chunk_size=8, shuffle_buffer=8, seed=1))
    local = list(ShardStream(out, decode="bytes", chunk_size=8, shuffle_buffer=8, seed=1))
    assert remote == local
    assert len(remote) == 40


def test_no_meta_json_is_no_dataset(endpoint: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    fs.pipe_file(f"{BUCKET}/half/shard-00000.rec", b"x" * 64)
    with pytest.raises(DatasetFormatError, match=r"s3://bucket/half: no meta.json.*publish it"):
        open_remote(f"s3://{BUCKET}/half", endpoint)


def test_lmdb_in_object_storage_needs_cache_dir(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, endpoint: str
) -> None:
    import s3fs

    from readers import LmdbDataset

    out = build_packed(tree[0], tmp_path / "lmdb", "lmdb")
    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    fs.pipe_file(f"{BUCKET}/lmdb/meta.json", (out / "meta.json").read_bytes())
    with pytest.raises(DatasetFormatError, match="pass cache_dir="):
        LmdbDataset(f"s3://{BUCKET}/lmdb", storage_options=s3_options(endpoint))


# --- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["drop", "slowdown", "truncate"])
def test_transient_faults_are_retried(
    uploaded: tuple[Path, str], proxy: FaultProxy, mode: str, fast_retries: None
) -> None:
    out, url = uploaded
    ds = open_remote(url, proxy.url)
    want = local_items(out)
    proxy.arm(mode, count=2)
    assert ds[3] == want[3]  # one record alone
    assert proxy.injected == 2
    proxy.arm(mode, count=2)
    ds.prefetch(20, 40)
    assert [ds[i] for i in range(20, 40)] == want[20:]  # one coalesced range
    assert proxy.injected == 2


def test_retries_are_bounded_and_name_the_object(
    uploaded: tuple[Path, str], proxy: FaultProxy, fast_retries: None
) -> None:
    _, url = uploaded
    ds = open_remote(url, proxy.url)
    proxy.arm("truncate", count=1000)
    with pytest.raises(RemoteReadError, match=rf"{url}/shard-00000.rec: bytes .* in 4 attempts"):
        ds[1]
    assert proxy.requests == ranges.ATTEMPTS


def test_lasting_slowdown_is_left_to_the_client_then_named(
    uploaded: tuple[Path, str], proxy: FaultProxy
) -> None:
    """A lasting 503 SlowDown: the client backs off, we add no attempts; then a clear error."""
    _, url = uploaded
    fast = {"config_kwargs": {"retries": {"max_attempts": 1}}}  # botocore: no retries
    ds = open_remote(url, proxy.url, storage_options={**s3_options(proxy.url), **fast})
    proxy.arm("slowdown", count=10_000)
    with pytest.raises(RemoteReadError, match=r"shard-00000.rec: bytes .*SlowDown.*fewer"):
        ds[0]
    assert proxy.requests <= 10  # s3fs's 5 attempts (botocore's 2 each), none of ours


def test_expired_credentials_say_refresh(uploaded: tuple[Path, str], proxy: FaultProxy) -> None:
    _, url = uploaded
    ds = open_remote(url, proxy.url)
    proxy.arm("expired", count=1000)
    with pytest.raises(RemoteCredentialsError, match=r"shard-00000.rec.*refresh AWS credentials"):
        ds[0]
    ds.prefetch(0, 5)
    with pytest.raises(RemoteCredentialsError, match=r"refresh AWS credentials"):
        ds[0]
    assert proxy.requests <= 4  # no retries: they cannot help


def test_expired_credentials_at_open(uploaded: tuple[Path, str], proxy: FaultProxy) -> None:
    _, url = uploaded
    proxy.arm("expired", count=1000, match="meta.json")
    with pytest.raises(RemoteCredentialsError, match=r"meta.json.*refresh AWS credentials"):
        open_remote(url, proxy.url)


def test_altered_bytes_fail_the_crc_and_name_the_object(
    uploaded: tuple[Path, str], proxy: FaultProxy
) -> None:
    """Bytes that differ from the index, from an object that did not change: never returned."""
    _, url = uploaded
    ds = open_remote(url, proxy.url, on_error="raise")
    proxy.arm("alter", count=1000)
    with pytest.raises(RecordError, match=rf"{url}/shard-00000.rec .*sample 2.*re-upload"):
        ds[2]


def test_changed_object_says_reopen(endpoint: str, tmp_path: Path) -> None:
    import s3fs

    write_tree(tmp_path / "src", {"a": 6}, seed=5)
    out = build_packed(tmp_path / "src", tmp_path / "out", "recordio")
    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    upload(fs, out, f"{BUCKET}/changing")
    url = f"s3://{BUCKET}/changing"
    ds = open_remote(url, endpoint, on_error="skip")
    rec = (out / "shard-00000.rec").read_bytes()
    offset = int(ds.offsets[1])
    altered = bytearray(rec)
    altered[offset + 40] ^= 0xFF  # inside sample 1's image bytes: same size, new ETag
    fs.pipe_file(f"{BUCKET}/changing/shard-00000.rec", bytes(altered))
    assert zlib.crc32(ds[0][0]) == int(ds.index.crc32[0])  # untouched record still reads
    with pytest.raises(RemoteObjectChangedError, match=rf"{url}/shard-00000.rec: .*reopen"):
        ds[1]
    fs.pipe_file(f"{BUCKET}/changing/shard-00000.rec", rec[: len(rec) // 2])  # cut short
    with pytest.raises(RemoteObjectChangedError, match=r"size \d+ -> \d+.*reopen the dataset"):
        ds[len(ds) - 1]
