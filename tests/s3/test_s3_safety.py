"""Object storage: no credentials in any text, shard digests, one-line store errors, URLs refused.

Against moto's standalone server on loopback (tests/s3/conftest.py); faults come from the proxy in
tests/s3/fault_proxy.py, an unreachable store is a closed port, a store that is not S3 is a plain
``http.server`` on 127.0.0.1, never a mock.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import traceback
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from packer.cli import app
from readers.io import ranges
from readers.io.ranges import RemoteReadError
from readers.remote.errors import StorageUnreachableError, redact
from readers.staging import StagingError
from tests.conftest import write_tree
from tests.s3.fault_proxy import FaultProxy, s3_options

BUCKET = "safety"
# credentials no text may carry: passed to the client explicitly (moto takes any)
KEY, SECRET, TOKEN = "AKIDSAFETYKEY0000001", "safetySecretKey/0000+Xyz", "SafetySessionToken0001"
LEAKS = (KEY, SECRET, TOKEN, "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token")


@pytest.fixture(scope="module")
def endpoint(s3_endpoint: str) -> str:
    """The loopback S3 server, with this module's bucket."""
    import s3fs

    s3fs.S3FileSystem(**s3_options(s3_endpoint)).mkdir(BUCKET)
    return s3_endpoint


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def publish(src: Path, url: str, *options: str) -> None:
    result = cli("build", str(src), url, "--workers", "1", *options)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def published(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A RecordIO dataset of 2+ shards published by ``packer build SRC s3://...``: (src, url)."""
    tmp = tmp_path_factory.mktemp("safety")
    files = write_tree(tmp / "src", {"a": 8, "b": 8}, seed=11)
    size = str(sum(len(b) for b in files.values()) // 2 + 1)
    url = f"s3://{BUCKET}/rec"
    publish(tmp / "src", url, "--format", "recordio", "--shard-size", size)
    return tmp / "src", url


def secret_options(server: str) -> dict[str, Any]:
    return {**s3_options(server), "key": KEY, "secret": SECRET, "token": TOKEN}


def texts(exc: BaseException) -> list[str]:
    """str and repr of `exc` and of every exception in its cause/context chain, and its trace."""
    out = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        out += [str(at), repr(at)]
        at = at.__cause__ or at.__context__
    return out


def assert_clean(found: list[str]) -> None:
    for text in found:
        for leak in LEAKS:
            assert leak not in text, f"{leak!r} in {text[:400]!r}"


def assert_clean_logs(records: list[logging.LogRecord]) -> None:
    """No record carries a presigned query; none outside botocore's own DEBUG signing output
    (which prints what it signs when a user turns it on) carries a credential."""
    for record in records:
        text = record.getMessage()
        assert "X-Amz-Signature=" not in text, record.name
        assert "X-Amz-Credential=" not in text, record.name
        if record.levelno >= logging.INFO or not record.name.startswith("botocore"):
            assert_clean([text])


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "BACKOFF_S", 0.01)


# --- item 2: no credentials in messages, logs or exception chains ---------------------------------


def test_redact_drops_query_strings_and_userinfo() -> None:
    text = (
        'Could not connect to "http://u:p@host:9000/b/k.rec?X-Amz-Algorithm=AWS4&'
        f'X-Amz-Credential={KEY}%2F2026&X-Amz-Security-Token={TOKEN}&X-Amz-Signature=ab12"'
    )
    assert redact(text) == 'Could not connect to "http://host:9000/b/k.rec"'
    assert redact(f"X-Amz-Security-Token={TOKEN} left alone") == (
        "X-Amz-Security-Token=<redacted> left alone"
    )


@pytest.mark.parametrize("mode", ["hangup", "drop"])
def test_lost_connections_on_ranged_reads_carry_no_credentials(
    published: tuple[Path, str],
    proxy: FaultProxy,
    mode: str,
    fast_retries: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dropped connection, retried then lasting: no text anywhere holds the presigned URL."""
    from readers import RecordIODataset

    caplog.set_level(logging.DEBUG)
    _, url = published
    ds = RecordIODataset(url, decode="bytes", storage_options=secret_options(proxy.url))
    want = ds[3]
    proxy.arm(mode, count=2)  # the retry path: read in the end
    assert ds[3] == want
    assert proxy.injected == 2
    proxy.arm(mode, count=1000)  # the final error path
    with pytest.raises(RemoteReadError, match=rf"{url}/.*shard-00000.rec: bytes .* in 4 attempts"):
        ds[1]
    assert proxy.injected >= ranges.ATTEMPTS  # (the HTTP client may retry a hangup itself)
    assert_clean(texts(caught_error(lambda: ds[1])))
    assert_clean_logs(caplog.records)


def caught_error(action: Any) -> BaseException:
    try:
        action()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def test_staging_over_a_lost_connection_carries_no_credentials(
    published: tuple[Path, str],
    proxy: FaultProxy,
    tmp_path: Path,
    fast_retries: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from readers import RecordIODataset

    caplog.set_level(logging.DEBUG)
    _, url = published
    proxy.arm("hangup", count=10_000)
    error = caught_error(
        lambda: RecordIODataset(
            url, cache_dir=tmp_path / "c", storage_options=secret_options(proxy.url)
        )
    )
    assert isinstance(error, StagingError)
    assert "shard-0000" in str(error)
    assert "stage again" in str(error)
    assert_clean(texts(error))
    assert_clean_logs(caplog.records)


# --- item 10: a digest per shard file, checked when staged --------------------------------------


def test_publish_records_a_digest_per_shard_file(
    published: tuple[Path, str], endpoint: str
) -> None:
    import hashlib

    import s3fs

    _, url = published
    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    base = url.removeprefix("s3://")
    meta = json.loads(fs.cat_file(f"{base}/meta.json"))
    digests = meta["shard_sha256"]
    names = [s["name"] for s in meta["shards"]]
    assert len(names) >= 2
    assert sorted(digests) == sorted(f"{n}{ext}" for n in names for ext in (".idx", ".rec"))
    for rel, sha in digests.items():
        data = fs.cat_file(f"{base}/{meta['data_prefix']}/{rel}")
        assert hashlib.sha256(data).hexdigest() == sha


def replace_one_byte(endpoint: str, url: str, rel: str) -> None:
    """Rewrite the object `rel` of the published dataset with one byte changed (same size)."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    base = url.removeprefix("s3://")
    prefix = json.loads(fs.cat_file(f"{base}/meta.json"))["data_prefix"]
    path = f"{base}/{prefix}/{rel}"
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(path, bytes(data))  # a new object: its own CRC-32, SHA metadata gone


def test_a_shard_replaced_out_of_band_is_refused_when_staged(endpoint: str, tmp_path: Path) -> None:
    from readers import LmdbDataset

    write_tree(tmp_path / "src", {"a": 5, "b": 5}, seed=12)
    url = f"s3://{BUCKET}/replaced.lmdb"
    publish(tmp_path / "src", url)
    ds = LmdbDataset(url, cache_dir=tmp_path / "before", decode="bytes")
    assert len(ds) == 10  # as published: staged and read
    replace_one_byte(endpoint, url, "shard-00000/data.mdb")
    with pytest.raises(
        StagingError,
        match=rf"^{url}/g-[0-9a-f]{{16}}/shard-00000/data.mdb: the staged bytes' SHA-256 differs "
        r"from the one meta.json recorded .*packer verify.*--overwrite",
    ):
        LmdbDataset(url, cache_dir=tmp_path / "after", decode="bytes")
    with pytest.raises(StagingError, match=r"shard-00000/data.mdb: the staged bytes' SHA-256"):
        LmdbDataset(url, cache_dir=tmp_path / "before", decode="bytes")  # its copy is stale
    result = cli("stage", url, str(tmp_path / "cli"))
    assert result.exit_code == 2
    assert "shard-00000/data.mdb: the staged bytes' SHA-256 differs" in result.output
    result = cli("verify", url)
    assert result.exit_code == 1
    assert "shard-00000/data.mdb: the staged bytes' SHA-256 differs" in result.output


def test_a_dataset_published_without_digests_still_stages(endpoint: str, tmp_path: Path) -> None:
    import s3fs

    from readers import LmdbDataset

    write_tree(tmp_path / "src", {"a": 4}, seed=13)
    url = f"s3://{BUCKET}/older.lmdb"
    publish(tmp_path / "src", url)
    fs = s3fs.S3FileSystem(**s3_options(endpoint))
    meta_path = f"{url.removeprefix('s3://')}/meta.json"
    meta = json.loads(fs.cat_file(meta_path))
    del meta["shard_sha256"]  # as published before the field existed
    fs.pipe_file(meta_path, json.dumps(meta).encode())
    ds = LmdbDataset(url, cache_dir=tmp_path / "c", decode="bytes")
    assert len(ds) == 4
    assert cli("verify", url).exit_code == 0


# --- item 16: an unreachable store, a server that is not S3, a missing bucket -------------------


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def store(
    request: pytest.FixtureRequest, endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """(endpoint, bucket) of one broken setting; AWS_ENDPOINT_URL points at the endpoint."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore: no backoff on a closed port
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    server = None
    if request.param == "closed":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"
        bucket = BUCKET
    elif request.param == "not_s3":
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url, bucket = f"http://127.0.0.1:{server.server_address[1]}", BUCKET
    else:
        url, bucket = endpoint, "no-such-bucket-here"
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    yield url, bucket
    if server is not None:
        server.shutdown()
        server.server_close()


EXPECTED = {
    "closed": r"cannot connect to the object store at {ep} \(EndpointConnectionError: .*\); "
    r"check AWS_ENDPOINT_URL .*running and reachable",
    "not_s3": r"{ep} did not answer as an S3 server \(HTTP 404 to ListObjectsV2\); check "
    r"AWS_ENDPOINT_URL .*S3 API",
    "no_bucket": r"the bucket {bucket} does not exist at {ep}; create it \(aws s3 mb "
    r"s3://{bucket}\) or fix the URL, or check AWS_ENDPOINT_URL",
}


@pytest.mark.parametrize("store", ["closed", "not_s3", "no_bucket"], indirect=True)
@pytest.mark.parametrize("command", ["build-out", "build-src", "verify", "info", "stage"])
def test_a_store_that_cannot_serve_the_url_is_one_error_line(
    store: tuple[str, str], command: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ep, bucket = store
    url = f"s3://{bucket}/x.lmdb"
    src = tmp_path / "src"
    write_tree(src, {"a": 2}, seed=14)
    args = {
        "build-out": ["build", str(src), url, "--workers", "1"],
        "build-src": ["build", url, str(tmp_path / "out"), "--workers", "1"],
        "verify": ["verify", url],
        "info": ["info", url],
        "stage": ["stage", url, str(tmp_path / "cache")],
    }[command]
    result = cli(*args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    kind = request.node.callspec.params["store"]
    assert kind in EXPECTED
    pattern = EXPECTED[kind].format(ep=ep, bucket=bucket)
    assert_matches(rf"^packer: error: {url}: {pattern}", lines[0])
    assert not (tmp_path / "out").exists()


def assert_matches(pattern: str, line: str) -> None:
    import re

    assert re.search(pattern, line), f"{pattern!r} does not match {line!r}"


@pytest.mark.parametrize("store", ["closed", "not_s3", "no_bucket"], indirect=True)
def test_readers_say_the_same_in_one_error(store: tuple[str, str]) -> None:
    from readers import RecordIODataset

    _, bucket = store
    with pytest.raises(StorageUnreachableError, match=rf"^s3://{bucket}/x: .*AWS_ENDPOINT_URL"):
        RecordIODataset(f"s3://{bucket}/x")


def test_a_missing_dataset_in_an_existing_bucket_is_still_not_found(endpoint: str) -> None:
    result = cli("info", f"s3://{BUCKET}/nothing-here")
    assert result.exit_code == 2
    assert "no dataset there (no meta.json)" in result.output


# --- item 17: the lifecycle commands refuse URLs ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["convert", "s3://b/x", "out"],
            "convert does not take URLs yet (s3://b/x); stage it "
            "first: packer stage s3://b/x DIR, then run packer convert on DIR",
        ),
        (
            ["convert", "local", "s3://b/y"],
            "convert does not write to URLs yet (s3://b/y); give "
            "a local path (only packer build publishes to object storage)",
        ),
        (["append", "s3://b/x", "src"], "append does not write to URLs yet (s3://b/x)"),
        (["append", "out", "s3://b/src"], "append does not take URLs yet (s3://b/src)"),
        (["merge", "s3://b/m", "a", "b"], "merge does not write to URLs yet (s3://b/m)"),
        (["merge", "m", "a", "s3://b/c"], "merge does not take URLs yet (s3://b/c)"),
        (
            ["split", "s3://b/x", "parts", "--into", "a=0.5,b=0.5"],
            "split does not take URLs yet (s3://b/x)",
        ),
        (
            ["split", "x", "gs://b/parts", "--into", "a=0.5,b=0.5"],
            "split does not write to URLs yet (gs://b/parts)",
        ),
        (["dupes", "s3://b/x"], "dupes does not take URLs yet (s3://b/x)"),
        (["dupes", "x", "s3://b/val"], "dupes does not take URLs yet (s3://b/val)"),
        (["bench", "s3://b/x"], "bench does not take URLs yet (s3://b/x); stage it first"),
        (["stage", "local", "s3://b/cache"], "stage does not write to URLs yet (s3://b/cache)"),
        (["info", "local", "--html", "s3://b/r.html"], "info --html does not write to URLs yet"),
    ],
)
def test_lifecycle_commands_refuse_urls_in_one_line(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"packer: error: {message}"), result.output
    assert list(tmp_path.iterdir()) == []  # no local s3: (or out) directory made
