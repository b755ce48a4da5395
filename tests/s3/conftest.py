"""A real S3 API on loopback for the object-storage tests: moto's standalone server.

The server is started once per session (``python -m moto.server`` on 127.0.0.1 and a free
port), the standard AWS variables point every client at it, and each test gets a new bucket.
No in-process mocking: s3fs and botocore talk HTTP to the server as they would to S3.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from tests.s3.fault_proxy import FaultProxy

pytest.importorskip("moto.server", reason="moto[server] is a test dependency (dev extra)")
pytest.importorskip("s3fs", reason="s3fs is in the s3 extra")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server on loopback, with the AWS variables set to use it."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {url}") from None
            time.sleep(0.2)
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield url
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3fs_client(s3_endpoint: str) -> object:
    """An s3fs filesystem on the moto server (fresh: no listing cache across tests)."""
    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}, skip_instance_cache=True)


@pytest.fixture
def bucket(s3fs_client: object, monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> str:
    """A new, empty bucket: ``s3://<name>``; builds keep their local work under tmp_path."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3fs_client.mkdir(name)  # type: ignore[attr-defined]
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "packer-work"))  # type: ignore[operator]
    return f"s3://{name}"


@pytest.fixture(scope="module")
def endpoint(s3_endpoint: str) -> str:
    """The server a module's tests talk to; modules that need a bucket of their own override it."""
    return s3_endpoint


@pytest.fixture
def proxy(endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the module's `endpoint` (tests/s3/fault_proxy.py)."""
    p = FaultProxy(endpoint)
    yield p
    p.close()
