"""The client side of reads by range: direct GETs over s3fs's session, bodies kept as received.

Ranges are sent as GETs of URLs presigned by s3fs's own client over its own HTTP session
(`readers.remote.direct`); any other answer than the range makes that request through s3fs.
Bodies are kept as the chunks received (`readers.io.pieces.Piece`), records are views of them
(`view_record_at`), checked with zlib's CRC-32 (`readers.fastzlib`). The server is moto on
loopback, with the fault proxy in front where the requests are counted.
"""

from __future__ import annotations

import itertools
import os
import random
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from readers import fastzlib as crc
from readers.formats.recordio.images import unpack_image_record
from readers.formats.recordio.records import encode_record, read_record_at, view_record_at
from readers.io import ranges
from readers.io.pieces import Piece
from readers.remote import direct
from tests.conftest import build_packed, write_tree
from tests.s3.fault_proxy import FaultProxy, s3_options
from tests.s3.test_s3_ranges import local_items, open_remote, publish

BUCKET = "client"


@pytest.fixture(scope="module")
def uploaded(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A RecordIO dataset of 30 images in two shards, built locally and published."""
    import s3fs

    s3fs.S3FileSystem(**s3_options(s3_endpoint)).mkdir(BUCKET)
    tmp = tmp_path_factory.mktemp("client")
    files = write_tree(tmp / "src", {"a": 15, "b": 15}, seed=11)
    size = str(sum(len(b) for b in files.values()) // 2 + 1)
    out = build_packed(tmp / "src", tmp / "out", "recordio", shard_size=int(size))
    url = f"s3://{BUCKET}/ds"
    publish(tmp / "src", url, "--shard-size", size)
    return out, url


def read_all(ds: Any) -> list[Any]:
    """Every item, each shard hinted first (one GET per shard)."""
    bounds = [int(b) for b in ds.shard_bounds]
    for lo, hi in itertools.pairwise(bounds):
        ds.prefetch(lo, hi)
    return [ds[i] for i in range(len(ds))]


# --- direct GETs ------------------------------------------------------------------------------


def test_ranges_are_direct_gets_through_the_endpoint_given(
    uploaded: tuple[Path, str], proxy: FaultProxy
) -> None:
    """Every range is one direct GET, sent where storage_options say (the proxy), none via s3fs."""
    out, url = uploaded
    ds = open_remote(url, proxy.url)
    objects, cache = ds._remote.objects, ds._remote.cache
    assert objects.direct is not None
    proxy.arm(None)
    assert read_all(ds) == local_items(out)
    assert cache.gets == 2  # one per shard
    assert objects.direct.sent == cache.gets == proxy.requests
    assert set(proxy.methods) == {"GET"}


def test_a_refused_direct_get_is_made_through_s3fs_then_direct_again(
    uploaded: tuple[Path, str], proxy: FaultProxy
) -> None:
    out, url = uploaded
    want = local_items(out)
    ds = open_remote(url, proxy.url)
    objects = ds._remote.objects
    proxy.arm("slowdown", count=1)  # the direct GET gets 503: s3fs makes it, and succeeds
    assert ds[3] == want[3]
    assert (proxy.injected, proxy.requests, objects.direct.sent) == (1, 2, 1)
    assert not objects._through_client  # s3fs succeeded: the next GET is direct again
    assert ds[5] == want[5]
    assert (proxy.requests, objects.direct.sent) == (3, 2)


def test_a_refused_url_is_presigned_again(uploaded: tuple[Path, str], proxy: FaultProxy) -> None:
    """403 ExpiredToken for a URL (its credentials expired): s3fs signs anew, a new URL follows."""
    out, url = uploaded
    want = local_items(out)
    ds = open_remote(url, proxy.url)
    objects = ds._remote.objects
    assert ds[0] == want[0]
    path = objects.objects[0].path
    first = objects.direct._urls[path][0]
    time.sleep(1.1)  # a URL signed now differs (X-Amz-Date has seconds)
    proxy.arm("expired", count=1)
    assert ds[1] == want[1]
    assert (proxy.injected, proxy.requests) == (1, 2)  # the URL refused, then s3fs's GET
    assert path not in objects.direct._urls  # forgotten: presigned again on the next GET
    assert ds[2] == want[2]
    assert (proxy.requests, objects.direct.sent) == (3, 3)
    assert objects.direct._urls[path][0] != first


def test_filesystems_with_request_parameters_are_left_to_s3fs(s3_endpoint: str) -> None:
    import s3fs

    for options in ({"requester_pays": True}, {"version_aware": True}):
        fs = s3fs.S3FileSystem(**s3_options(s3_endpoint), **options)
        assert direct.DirectGets.for_fs(fs) is None
    assert direct.DirectGets.for_fs(s3fs.S3FileSystem(**s3_options(s3_endpoint))) is not None


def test_direct_gets_can_be_turned_off(
    uploaded: tuple[Path, str], proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, url = uploaded
    monkeypatch.setenv("PACKER_S3_DIRECT", "0")
    ds = open_remote(url, proxy.url)
    assert ds._remote.objects.direct is None
    assert read_all(ds) == local_items(out)


@pytest.mark.parametrize("mode", ["drop", "truncate"])
def test_broken_direct_bodies_are_retried_directly(
    uploaded: tuple[Path, str], proxy: FaultProxy, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body cut short is a transfer fault: our next attempt is a direct GET again."""
    monkeypatch.setattr(ranges, "BACKOFF_S", 0.01)
    out, url = uploaded
    ds = open_remote(url, proxy.url)
    proxy.arm(mode, count=2)
    assert read_all(ds) == local_items(out)
    objects = ds._remote.objects
    assert proxy.injected == 2
    assert objects.retries == 2
    assert objects.direct.sent == proxy.requests == 4  # 2 shards + 2 retries, all direct


# --- bodies as received -----------------------------------------------------------------------


def test_a_piece_serves_every_range_as_the_joined_bytes() -> None:
    rng = random.Random(4)
    data = os.urandom(3000)
    cuts = sorted(rng.sample(range(1, len(data)), 25))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    piece = Piece(1000, [*chunks[:3], b"", *chunks[3:]])  # an empty chunk is skipped
    assert (piece.begin, piece.end, len(piece)) == (1000, 4000, 3000)
    inside = 0
    for _ in range(2000):
        a = rng.randrange(0, len(data))
        b = rng.randrange(a + 1, len(data) + 1)
        buf, at = piece.locate(1000 + a, 1000 + b)
        assert bytes(memoryview(buf)[at : at + b - a]) == data[a:b]
        inside += buf in chunks  # served from a chunk received, not a copy
        assert piece.bytes(1000 + a, 1000 + b) == data[a:b]
    assert inside > 100
    assert piece.bytes(0, 10**6) == data  # clipped to the piece


def test_view_record_at_is_read_record_at_without_the_copy() -> None:
    small, large = os.urandom(300), os.urandom(5000)
    large = large.replace(b"\x0a\x23\xd7\xce", b"xxxx")  # no accidental magic
    large = large[:1000] + (0xCED7230A).to_bytes(4, "little") + large[1000:]  # split in parts
    buf = b"".join(encode_record(p) for p in (small, large))
    second = len(encode_record(small))
    for offset, payload in ((0, small), (second, large)):
        view, end = view_record_at(buf, offset)
        assert (bytes(view), end) == (payload, read_record_at(buf, offset)[1])
        assert read_record_at(buf, offset)[0] == payload
    assert isinstance(view_record_at(buf, 0)[0], memoryview)  # one part: a view of buf
    assert isinstance(view_record_at(buf, second)[0], bytes)  # several parts: joined


def test_crc32_is_zlibs() -> None:
    data = os.urandom(70_000)
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(memoryview(data)[5:9000]) == zlib.crc32(data[5:9000])
    assert crc.crc32(data[40_000:], crc.crc32(data[:40_000])) == zlib.crc32(data)
    try:
        import zlib_ng  # noqa: F401
    except ImportError:
        assert not crc.ACCELERATED
    else:
        assert crc.ACCELERATED


# --- staging: ranged GETs in flight -----------------------------------------------------------


def test_staging_keeps_several_gets_in_flight(
    uploaded: tuple[Path, str], proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from readers import RecordIODataset
    from readers.staging import download

    monkeypatch.setattr(download, "PIECE_BYTES", 1024)  # a shard of ~20 KB: ~20 GETs
    out, url = uploaded
    proxy.arm(None)
    options = {"cache_dir": tmp_path / "c", "storage_options": s3_options(proxy.url)}
    ds = RecordIODataset(url, decode="bytes", **options)
    assert [ds[i] for i in range(len(ds))] == local_items(out)
    staged = sorted(p for p in (tmp_path / "c").rglob("shard-*.rec") if not p.is_symlink())
    sizes = [p.stat().st_size for p in staged]
    assert len(sizes) == 2
    assert proxy.requests == sum(-(-size // 1024) for size in sizes)  # one GET per piece
    assert proxy.most_in_flight > 1


def test_staging_checks_packers_sha256_without_a_crc(
    s3_endpoint: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects uploaded without a checksum: the SHA-256 packer stores in their metadata."""
    import hashlib

    import boto3
    import urllib3

    from readers import RecordIODataset
    from readers.staging.files import StagingError

    write_tree(tmp_path / "src", {"a": 5, "b": 5}, seed=12)
    url = f"s3://{BUCKET}/nocrc"
    publish(tmp_path / "src", url)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="nocrc/")["Contents"]]
    key = next(k for k in keys if k.endswith(".rec"))
    data = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    # the same bytes PUT again by a plain HTTP client: no checksum, packer's metadata only
    link = s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": key})
    sha = hashlib.sha256(data).hexdigest()
    put = urllib3.PoolManager().request(
        "PUT", link, body=data, headers={"x-amz-meta-packer-sha256": sha}
    )
    assert put.status == 200
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert "ChecksumCRC32" not in head
    assert head["Metadata"]["packer-sha256"] == sha
    options = {"storage_options": s3_options(proxy.url)}
    proxy.arm("alter", count=1)
    with pytest.raises(StagingError, match=r"nocrc/.*shard-00000.rec: .* do not match .*SHA-256"):
        RecordIODataset(url, decode="bytes", cache_dir=tmp_path / "c", **options)
    ds = RecordIODataset(url, decode="bytes", cache_dir=tmp_path / "c2", **options)
    assert len(ds) == 10
    assert all(zlib.crc32(ds[i][0]) == int(ds.index.crc32[i]) for i in range(len(ds)))


# --- one client per process, made from the models parsed before fork ---------------------------


def _child_session(endpoint: str, url: str) -> tuple[bool, bool, int, int]:
    import readers.remote as remote

    cached = len(remote._LOADER._cache)  # models the parent parsed, inherited
    fs, path = remote.filesystem(url, s3_options(endpoint))
    size = fs.info(f"{path}/meta.json")["size"]
    session = remote._SESSION
    assert session is not None
    own = session[0] == os.getpid() and fs.session is session[1]
    shared = session[1].get_component("data_loader") is remote._LOADER
    return own, shared, cached, int(size)


def test_a_forked_process_makes_its_client_from_the_models_parsed_before(
    uploaded: tuple[Path, str], s3_endpoint: str
) -> None:
    import multiprocessing

    import readers.remote as remote

    _, url = uploaded
    fs, path = remote.filesystem(url, s3_options(s3_endpoint))
    size = fs.info(f"{path}/meta.json")["size"]  # the client made here: models parsed
    assert fs.session is remote.s3_session()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        own, shared, cached, child_size = pool.apply(_child_session, (s3_endpoint, url))
    assert own  # a session and client of its own (not fork-safe to share)
    assert shared  # built with the parent's data loader ...
    assert cached > 0  # ... which holds the models parsed before the fork
    assert child_size == size


# --- a stream longer than what is kept --------------------------------------------------------


@pytest.fixture(scope="module")
def uploaded_120(uploaded: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A RecordIO dataset of 120 images in one shard, published (in `uploaded`'s bucket)."""
    tmp = tmp_path_factory.mktemp("client120")
    write_tree(tmp / "src", {"a": 60, "b": 60}, seed=3)
    url = f"s3://{BUCKET}/ds120"
    publish(tmp / "src", url)
    return url


def test_runs_announced_ahead_are_not_hinted_again_by_the_detector(
    uploaded_120: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 8 runs a stream announces ahead stay the stream's: no detector hint past a run's end.

    (With 4 of them remembered, this stream fetched 2.7x its bytes; a 20 MB one 200x.)
    """
    from readers import ShardStream

    monkeypatch.setattr(ranges, "GAP_BYTES", 0)
    stream = ShardStream(uploaded_120, decode="bytes", chunk_size=4, seed=3)
    ds = stream.dataset
    assert len(list(stream)) == len(ds) == 120
    assert ds._ahead.hints == 0
    assert ds._remote.cache.fetched == int((ds._ends - ds.offsets).sum())  # each byte once


def test_ranges_read_are_dropped_before_ranges_hinted(
    uploaded: tuple[Path, str], s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over `kept_bytes`, a range read goes before one hinted and not read yet (then refetched)."""
    monkeypatch.setattr(ranges, "GAP_BYTES", -1)  # each record its own GET
    out, url = uploaded
    ds = open_remote(url, s3_endpoint)
    cache = ds._remote.cache
    a, b, c, d = [(0, int(ds.offsets[i]), int(ds._ends[i])) for i in range(4)]
    size = [r[2] - r[1] for r in (a, b, c, d)]
    cache.kept_bytes = sum(size) - 1  # the four do not fit: one goes when d is hinted
    cache.prefetch([a, b, c])
    assert cache.read(*a)  # a is read; b and c are what the reads want next
    for key in (b, c):
        cache._pieces[key].result()  # fetched (not merely queued: a queued one is just dropped)
    cache.prefetch([d])
    got = [cache.read(*r) for r in (b, c, d)]
    assert cache.gets == 4  # none fetched again: a was dropped, not b
    images = [bytes(unpack_image_record(read_record_at(g, 0)[0])[2]) for g in got]
    assert images == [image for image, _ in local_items(out)[1:4]]
