"""RecordIODataset(url) and ShardStream(url) read by byte range from a real S3 API on loopback.

The server is moto's standalone server (a subprocess); faults are injected by a proxy in front
of it (`tests/s3/fault_proxy.py`), never by mocking the client. The datasets are published by
``packer build SRC s3://...`` (data under meta.json's ``data_prefix``).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from typer.testing import CliRunner

from packer.cli import app
from readers.errors import RecordError
from readers.formats.recordio.images import unpack_image_record
from readers.formats.recordio.records import read_record_at
from readers.io import ranges
from readers.io.ranges import RemoteCredentialsError, RemoteObjectChangedError, RemoteReadError
from readers.remote import DatasetNotFoundError
from tests.conftest import build_packed, write_tree
from tests.s3.fault_proxy import FaultProxy, s3_options

BUCKET = "ranges"


@pytest.fixture(scope="module")
def endpoint(s3_endpoint: str) -> str:
    """The loopback S3 server (tests/s3/conftest.py), with this module's bucket."""
    import s3fs

    s3fs.S3FileSystem(**s3_options(s3_endpoint)).mkdir(BUCKET)
    return s3_endpoint


@pytest.fixture(scope="module")
def uploaded(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A RecordIO dataset (2-3 shards, 40 images) built locally and published: (dir, url)."""
    tmp = tmp_path_factory.mktemp("remote")
    files = write_tree(tmp / "src", {"a": 15, "b": 15, "c": 10}, seed=3)
    size = str(sum(len(b) for b in files.values()) // 2 + 1)
    out = build_packed(tmp / "src", tmp / "out", "recordio", shard_size=int(size))
    url = f"s3://{BUCKET}/ds"
    publish(tmp / "src", url, "--shard-size", size)
    return out, url


def publish(src: Path, url: str, *options: str) -> None:
    """``packer build SRC URL --format recordio``: the data first, meta.json last."""
    result = CliRunner().invoke(
        app, ["build", str(src), url, "--format", "recordio", "--workers", "1", *options]
    )
    assert result.exit_code == 0, result.output


def upload(fs: Any, local: Path, prefix: str) -> None:
    """Copy a dataset directory by hand, meta.json last (no data_prefix)."""
    files = sorted(p for p in local.iterdir() if p.is_file())
    for p in sorted(files, key=lambda p: p.name == "meta.json"):
        fs.pipe_file(f"{prefix}/{p.name}", p.read_bytes())


def ds_meta(endpoint: str, url: str) -> bytes:
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    return bytes(fs.cat_file(url.removeprefix("s3://") + "/meta.json"))


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
    prefix = ds._remote.url + "/" + json.loads(ds_meta(endpoint, url))["data_prefix"]
    assert ds._shard_paths[1] == f"{prefix}/shard-00001.rec"


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


def test_shard_stream_reads_by_range(uploaded: tuple[Path, str], endpoint: str) -> None:
    """``ShardStream(url)``: credentials and endpoint from the AWS variables, no local copy."""
    from readers import ShardStream

    out, url = uploaded
    remote = list(ShardStream(url, decode="bytes", chunk_size=8, shuffle_buffer=8, seed=1))
    local = list(ShardStream(out, decode="bytes", chunk_size=8, shuffle_buffer=8, seed=1))
    assert remote == local
    assert len(remote) == 40


def test_queued_neighbours_are_one_get_and_far_ranges_their_own(
    uploaded: tuple[Path, str], endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, url = uploaded
    want = local_items(out)
    for gap, gets in ((ranges.GAP_BYTES, 1), (-1, 6)):  # -1: not even touching ranges merge
        monkeypatch.setattr(ranges, "GAP_BYTES", gap)
        ds = open_remote(url, endpoint)
        cache = ds._remote.cache
        records = [(0, int(ds.offsets[i]), int(ds._ends[i])) for i in range(6)]
        cache.prefetch(records)  # six ranges in one call: all queued before a GET starts
        got = [cache.read(*r) for r in records]  # (ds[i] would hint the records after them)
        assert cache.gets == gets
        images = [bytes(unpack_image_record(read_record_at(b, 0)[0])[2]) for b in got]
        assert images == [image for image, _ in want[:6]]


def test_the_first_gets_ramp_up_and_records_across_their_cuts_are_joined(
    uploaded: tuple[Path, str], endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold cache fetches 100, 200, 400, ... bytes: cuts fall inside records, none is lost.

    What a cut would leave over, less than twice the next step, is fetched with the last part.
    """
    monkeypatch.setattr(ranges, "FIRST_BYTES", 100)
    out, url = uploaded
    ds = open_remote(url, endpoint)
    cache = ds._remote.cache
    n = int(ds.shard_bounds[1])
    records = [(0, int(ds.offsets[i]), int(ds._ends[i])) for i in range(n)]
    cache.prefetch([(0, records[0][1], records[-1][2])])  # shard 0 as one hinted range
    got = [cache.read(*r) for r in records]
    images = [bytes(unpack_image_record(read_record_at(b, 0)[0])[2]) for b in got]
    assert images == [image for image, _ in local_items(out)[:n]]
    size, cuts, step = records[-1][2], 0, 100
    while size > 2 * step:  # 100 + 200 + 400 + ... then the rest: one GET each, none alone
        size, cuts, step = size - step, cuts + 1, step * 2
    assert cuts >= 3
    assert step < size <= 2 * step  # the last GET: more than a step, not a small leftover
    assert cache.gets == cuts + 1


def test_a_shuffled_share_fetches_only_the_bytes_it_reads(
    uploaded: tuple[Path, str], endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a rank's share lie all over the shards: none is fetched with bytes around it."""
    from readers import ShardStream

    monkeypatch.setattr(ranges, "GAP_BYTES", 0)  # no gaps bridged: bytes fetched = bytes read
    out, url = uploaded
    stream = ShardStream(url, decode="bytes", chunk_size=3, seed=2, rank=1, world_size=4)
    got = list(stream)
    ds = stream.dataset
    ids = stream.worker_order()  # what the main process yields, in order
    want = local_items(out)
    assert got == [want[i] for i in ids]
    assert len(want) == 40
    assert len(got) == 10
    used = sum(int(ds._ends[i] - ds.offsets[i]) for i in ids)
    assert ds._remote.cache.fetched == used < int(ds._remote.sizes.sum()) // 3


def test_a_dataset_read_by_range_asks_for_larger_chunks(
    uploaded: tuple[Path, str], endpoint: str
) -> None:
    from readers import RecordIODataset
    from readers.datasets.recordio import REMOTE_CHUNK_BYTES
    from readers.io.hints import CHUNK_BYTES, DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, resolve_chunk_size

    out, url = uploaded
    remote, local = open_remote(url, endpoint), RecordIODataset(out)
    assert (remote.chunk_bytes, local.chunk_bytes) == (REMOTE_CHUNK_BYTES, CHUNK_BYTES)
    total = int(local.index.nbytes.sum())
    for ds, per in ((remote, REMOTE_CHUNK_BYTES), (local, CHUNK_BYTES)):
        want = min(MAX_CHUNK_SIZE, max(DEFAULT_CHUNK_SIZE, per * len(ds) // total))
        assert resolve_chunk_size(ds, None, None) == want
    assert resolve_chunk_size(remote, None, None) > resolve_chunk_size(local, None, None)


def test_no_meta_json_is_no_dataset(endpoint: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    fs.pipe_file(f"{BUCKET}/half/shard-00000.rec", b"x" * 64)
    with pytest.raises(DatasetNotFoundError, match=rf"s3://{BUCKET}/half: no dataset there"):
        open_remote(f"s3://{BUCKET}/half", endpoint)


def test_cache_dir_stages_a_recordio_url_instead(
    uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    from readers import RecordIODataset, open_dataset

    out, url = uploaded
    for ds in (
        RecordIODataset(url, decode="bytes", cache_dir=tmp_path / "c"),
        open_dataset(url, decode="bytes", cache_dir=tmp_path / "c"),
    ):
        assert ds.url is None
        assert str(ds.root).startswith(str(tmp_path / "c"))
        assert [ds[i] for i in range(len(ds))] == local_items(out)


def test_open_dataset_reads_recordio_in_place(uploaded: tuple[Path, str]) -> None:
    from readers import open_dataset

    out, url = uploaded
    ds = open_dataset(url, decode="bytes")
    assert ds.url == url
    assert [ds[i] for i in range(len(ds))] == local_items(out)


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
    with pytest.raises(RemoteReadError, match=rf"{url}/.*shard-00000.rec: bytes .* in 4 attempts"):
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
    # one direct GET, refused: then s3fs's 5 attempts (botocore's 2 each), none of ours
    assert proxy.requests <= 11


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
    with pytest.raises(RecordError, match=rf"{url}/.*shard-00000.rec .*sample 2.*re-upload"):
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


# --- faults while staging a whole copy (readers.staging, cache_dir=) ----------------------------


@pytest.mark.parametrize(
    ("mode", "count", "error"),
    [
        ("drop", 2, None),
        ("slowdown", 2, None),
        ("truncate", 2, None),
        ("truncate", 1000, r"/.*shard-00000.rec: bytes .* in 4 attempts.*stage again"),
        ("alter", 1, r"/.*shard-00000.rec: the bytes received do not match.*CRC-32.*re-upload"),
        ("expired", 1000, r"/.*shard-00000.rec: .*refresh AWS credentials"),
    ],
)
def test_staging_faults(
    uploaded: tuple[Path, str],
    proxy: FaultProxy,
    tmp_path: Path,
    mode: str,
    count: int,
    error: str | None,
    fast_retries: None,
) -> None:
    """A staged copy: retried, or an error naming the object; never wrong bytes.

    A changed byte is caught by the object's full-object CRC-32 (kept by S3 for objects
    uploaded with one, as botocore uploads them).
    """
    from readers import RecordIODataset

    out, url = uploaded
    proxy.arm(mode, count=count)
    options = {"cache_dir": tmp_path / "c", "storage_options": s3_options(proxy.url)}
    if error is None:
        ds = RecordIODataset(url, decode="bytes", **options)
        assert [ds[i] for i in range(len(ds))] == local_items(out)
        assert proxy.injected == count
        return
    with pytest.raises(Exception, match=url + error) as caught:
        RecordIODataset(url, decode="bytes", **options)
    assert caught.type.__name__ in ("StagingError", "RemoteCredentialsError")
