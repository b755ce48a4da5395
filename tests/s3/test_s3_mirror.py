"""An ``s3://`` SRC downloaded into a local tree (`packer.mirror`): one GET per object, each the
object as listed, faults retried or named.

The server is moto's standalone server; faults come from the proxy in `tests/s3/fault_proxy.py`;
changes between the listing and the downloads are made at the seam between the two
(`packer.mirror._list`), on the server itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packer import mirror
from packer.mirror import RemoteSourceError, mirror_source
from tests.conftest import write_tree
from tests.s3.fault_proxy import FaultProxy, s3_options


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our backoff shortened, so that the fault tests take little time."""
    monkeypatch.setattr(mirror, "BACKOFF_S", 0.01)


@pytest.fixture
def source(tmp_path: Path, bucket: str, s3fs_client: Any) -> tuple[str, dict[str, bytes]]:
    """Twelve images under ``<bucket>/images/`` in class folders: (url, {relative path: bytes})."""
    files = write_tree(tmp_path / "src", {"cat": 5, "dog": 4, "eel": 3}, seed=8)
    s3fs_client.put(str(tmp_path / "src") + "/", f"{bucket}/images/", recursive=True)
    return f"{bucket}/images/", {str(k): v for k, v in files.items()}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_one_get_per_object_and_no_head(
    source: tuple[str, dict[str, bytes]], proxy: FaultProxy, tmp_path: Path
) -> None:
    url, files = source
    proxy.arm(None, match="/images/")
    count = mirror_source(url, tmp_path / "m", storage_options=s3_options(proxy.url))
    assert count == len(files) == 12
    assert tree(tmp_path / "m") == files
    assert proxy.methods["HEAD"] == 0  # s3fs's cat_file would HEAD each object first
    assert proxy.methods["GET"] == 12  # one per object (the listing names no object)


@pytest.mark.parametrize("mode", ["drop", "truncate"])
def test_transient_faults_are_retried(
    source: tuple[str, dict[str, bytes]],
    proxy: FaultProxy,
    tmp_path: Path,
    mode: str,
    fast_retries: None,
) -> None:
    url, files = source
    proxy.arm(mode, count=3, match=".png")
    mirror_source(url, tmp_path / "m", storage_options=s3_options(proxy.url), workers=2)
    assert proxy.injected == 3
    assert tree(tmp_path / "m") == files


def test_lasting_faults_are_bounded_and_name_the_object(
    source: tuple[str, dict[str, bytes]], proxy: FaultProxy, tmp_path: Path, fast_retries: None
) -> None:
    url, _ = source
    proxy.arm("truncate", count=1000, match="cat/")
    with pytest.raises(RemoteSourceError, match=r"images/cat/\S+: download failed 4 times"):
        mirror_source(url, tmp_path / "m", storage_options=s3_options(proxy.url), workers=1)
    assert proxy.requests == mirror.ATTEMPTS  # the first object's attempts, then the end


def test_expired_credentials_say_refresh(
    source: tuple[str, dict[str, bytes]], proxy: FaultProxy, tmp_path: Path
) -> None:
    url, _ = source
    proxy.arm("expired", count=1000, match="dog/")
    with pytest.raises(RemoteSourceError, match=r"images/dog/\S+: .*refresh AWS credentials"):
        mirror_source(url, tmp_path / "m", storage_options=s3_options(proxy.url))


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_an_object_changed_after_the_listing_stops_the_build(
    source: tuple[str, dict[str, bytes]],
    s3fs_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    url, files = source
    victim = sorted(files)[4]
    listed = mirror._list

    def list_then_change(*args: Any) -> list[mirror.SourceObject]:
        objects = listed(*args)
        key = f"{url}{victim}".removeprefix("s3://")
        if change == "replaced":  # the same size, other bytes: only the ETag tells
            data = files[victim]
            s3fs_client.pipe_file(key, data[:-1] + bytes([data[-1] ^ 1]))
        else:
            s3fs_client.rm_file(key)
        return objects

    monkeypatch.setattr(mirror, "_list", list_then_change)
    with pytest.raises(RemoteSourceError, match=rf"images/{victim}: {change} after SRC was listed"):
        mirror_source(url, tmp_path / "m")


def test_a_single_object_is_not_a_source(
    source: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, files = source
    with pytest.raises(RemoteSourceError, match="one object, not a prefix"):
        mirror_source(url + sorted(files)[0], tmp_path / "m")


def test_a_source_of_another_fsspec_protocol_builds_the_same_dataset(tmp_path: Path) -> None:
    """``memory://`` (a filesystem without an event loop): the same mirror, the same dataset."""
    import fsspec
    from typer.testing import CliRunner

    from packer.cli import app
    from tests.conftest import build_packed

    files = write_tree(tmp_path / "src", {"cat": 3, "dog": 2}, seed=9)
    fs = fsspec.filesystem("memory")
    for rel, data in files.items():
        fs.pipe_file(f"/h20src/{rel}", data)
    try:
        assert mirror_source("memory://h20src", tmp_path / "m") == 5
        assert tree(tmp_path / "m") == {str(k): v for k, v in files.items()}
        out = tmp_path / "out.recordio"
        done = CliRunner().invoke(
            app, ["build", "memory://h20src", str(out), "-f", "recordio", "--workers", "1"]
        )
        assert done.exit_code == 0, done.output
        local = build_packed(tmp_path / "src", tmp_path / "local.recordio", "recordio")
        for name in ("shard-00000.rec", "index.jsonl"):
            assert (out / name).read_bytes() == (local / name).read_bytes()
    finally:
        fs.rm("/h20src", recursive=True)
