"""packer build --engine ray: the same dataset as a local build, retries, --on-error, resume.

One real local Ray instance (2 CPUs) serves the whole module; the driver-kill test runs the
driver in a subprocess that starts its own instance, and ends the processes it left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from packer.build import build, temp_dir_for
from packer.cli import app
from packer.config import BuildConfig
from packer.engines import EngineError
from packer.errors import ConfigError, InputError
from tests.conftest import write_tree

ray = pytest.importorskip("ray")
ray_engine = pytest.importorskip("packer.engines.ray")

ROOT = Path(__file__).resolve().parents[2]
SHARD_SIZE = 4000  # bytes of source files per shard: about six of the test images


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    yield
    ray.shutdown()


def dataset_files(out: Path) -> dict[str, bytes]:
    """Every file of a dataset by relative path, meta.json without its timing and engine."""
    files = {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("lock.mdb", "meta.json")
    }
    meta = json.loads((out / "meta.json").read_text())
    del meta["created"], meta["options"]["engine"]
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def make_source(root: Path, *, bad: bool = True) -> Path:
    """A tree of several shards; with `bad`, skipped inputs early on (so RecordIO shards are
    renumbered) and one shard of nothing but a bad input (dropped, the rest renamed)."""
    src = root / "src"
    write_tree(src, {"a": 24, "b": 24})
    if bad:
        (src / "a" / "a_first_bad.png").write_bytes(b"not an image")
        (src / "a" / "img_010_bad.jpg").write_bytes(b"\xff\xd8 not a jpeg either")
        (src / "b" / "b_huge_bad.png").write_bytes(b"x" * (2 * SHARD_SIZE))
    return src


def cfg(src: Path, out: Path, **kw: Any) -> BuildConfig:
    kw.setdefault("shard_size", SHARD_SIZE)
    return BuildConfig(src=src, out=out, progress=False, **kw)


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_same_dataset_as_a_local_build(tmp_path: Path, fmt: str) -> None:
    src = make_source(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    build(cfg(src, ref, format=fmt))
    messages: list[str] = []
    summary = build(cfg(src, out, format=fmt, engine="ray"), log=messages.append)

    assert dataset_files(out) == dataset_files(ref)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["options"]["engine"] == "ray"
    assert meta["num_shards"] >= 5
    assert summary.skipped == 3
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [e["path"] for e in errors] == [
        "a/a_first_bad.png",
        "a/img_010_bad.jpg",
        "b/b_huge_bad.png",
    ]
    planned = len(json.loads((out / "meta.json").read_text())["shards"]) + 1  # one was dropped
    assert any(f"ray: {planned} shard(s) on 1 node(s)" in m for m in messages)
    assert any(f"{planned} shards, 51 images" in m for m in messages)  # the per-node line
    assert not temp_dir_for(out).exists()


def test_on_error_fail_reports_the_first_bad_input_and_leaves_nothing(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    local, out = tmp_path / "local", tmp_path / "out"
    with pytest.raises(InputError) as expected:
        build(cfg(src, local, on_error="fail"))
    with pytest.raises(InputError, match=r"a/a_first_bad\.png: .*\[not_image\]") as got:
        build(cfg(src, out, on_error="fail", engine="ray"))
    assert str(got.value) == str(expected.value)  # the same error as a local build gives
    assert not out.exists()
    assert not temp_dir_for(out).exists()


def _die_once_in(marker: Path, shard: int) -> Any:
    """A task function that kills its process mid-shard (after 3 records) the first time."""
    original = ray_engine._shard_task

    def task(cfg: BuildConfig, job: Any) -> Any:
        if job.shard.number == shard and not marker.exists():
            marker.touch()
            from packer.writers import ShardPart

            real_add = ShardPart.add

            def add(self: Any, record: Any, *rest: Any) -> None:
                real_add(self, record, *rest)
                if self.count == 3:  # the process dies with 3 records of the shard on disk
                    if hasattr(self.shard, "_commit"):
                        self.shard._commit()  # LMDB: a committed transaction
                    if hasattr(self.shard, "_rec"):
                        self.shard._rec.flush()  # RecordIO: out of the file buffer
                    os._exit(1)

            ShardPart.add = add  # type: ignore[method-assign]
        return original(cfg, job)

    return task


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_task_killed_mid_shard_is_retried(tmp_path: Path, monkeypatch: Any, fmt: str) -> None:
    src = make_source(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    build(cfg(src, ref, format=fmt))
    marker = tmp_path / "killed"
    monkeypatch.setattr(ray_engine, "_shard_task", _die_once_in(marker, shard=2))
    build(cfg(src, out, format=fmt, engine="ray"))
    assert marker.exists()
    assert dataset_files(out) == dataset_files(ref)


def test_task_that_always_dies_keeps_the_finished_shards(tmp_path: Path, monkeypatch: Any) -> None:
    src = make_source(tmp_path, bad=False)
    ref, out = tmp_path / "ref", tmp_path / "out"
    build(cfg(src, ref))
    original = ray_engine._shard_task

    def task(cfg: BuildConfig, job: Any) -> Any:
        if job.shard.number == 3:
            os._exit(1)
        return original(cfg, job)

    monkeypatch.setattr(ray_engine, "_shard_task", task)
    with pytest.raises(EngineError, match=r"shard-00003: its Ray task did not finish.*--resume"):
        build(cfg(src, out, engine="ray"))
    assert not out.exists()
    assert list(temp_dir_for(out).glob("*.done.json"))
    monkeypatch.undo()
    messages: list[str] = []
    build(cfg(src, out, resume=True), log=messages.append)
    assert any("finished shard(s) kept" in m for m in messages)
    assert dataset_files(out) == dataset_files(ref)


_SLOW_DRIVER = textwrap.dedent(
    """
    import sys, time
    import packer.engines.ray as engine
    from packer.cli import main

    original = engine._shard_task

    def slow(cfg, job):
        time.sleep(0.3)
        return original(cfg, job)

    engine._shard_task = slow
    sys.argv[0] = "packer"
    main()
    """
)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the driver's children")
@pytest.mark.parametrize(("fmt", "resume_engine"), [("lmdb", "local"), ("recordio", "ray")])
def test_driver_killed_then_resume_is_identical(
    tmp_path: Path, fmt: str, resume_engine: str
) -> None:
    src = make_source(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    build(cfg(src, ref, format=fmt))
    args = [sys.executable, "-c", _SLOW_DRIVER, "build", str(src), str(out), "--format", fmt]
    args += ["--shard-size", str(SHARD_SIZE), "--engine", "ray", "--workers", "2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(list(temp_dir_for(out).glob("*.done.json"))) < 2:
            assert proc.poll() is None, "the build ended before it could be killed"
            assert time.monotonic() < deadline
            started |= _descendants(proc.pid)
            time.sleep(0.01)
        started |= _descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        # the driver's own Ray processes (and nothing else) outlive it: end them by pid
        for pid in started | _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not out.exists()
    kept = len(list(temp_dir_for(out).glob("*.done.json")))
    planned = len(json.loads((temp_dir_for(out) / "plan.json").read_text())["shards"])
    assert 2 <= kept < planned
    messages: list[str] = []
    build(cfg(src, out, format=fmt, resume=True, engine=resume_engine), log=messages.append)
    assert any(f"{kept} finished shard(s) kept" in m for m in messages)
    assert dataset_files(out) == dataset_files(ref)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_running_cluster_via_ray_address(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    build(cfg(src, ref))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "token"  # as `ray start` clusters expect by default
    args = [sys.executable, "-m", "packer.cli", "build", str(src), str(out)]
    args += ["--shard-size", str(SHARD_SIZE), "--workers", "1"]
    args += ["--engine", "ray", "--ray-address"]
    refused = subprocess.run(
        [*args, f"127.0.0.1:{port}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "cannot connect to a Ray cluster there" in refused.stderr
    ray_cli = Path(sys.executable).with_name("ray")
    quiet = ["--include-dashboard=false", "--disable-usage-stats"]
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=2", "--block", *quiet],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: ended below, and nothing else
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert head.poll() is None, "ray start --head failed"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        done = subprocess.run(
            [*args, f"127.0.0.1:{port}"], cwd=ROOT, env=env, capture_output=True, text=True
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        # what `ray stop` would remove, so that a later bare ray.init() does not look for it
        current = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")
        with contextlib.suppress(OSError):
            if current.read_text().strip().endswith(f":{port}"):
                current.unlink()
    assert done.returncode == 0, done.stderr
    assert f"ray: connected to 127.0.0.1:{port}" in done.stderr
    assert dataset_files(out) == dataset_files(ref)


def test_cli_engine_options(tmp_path: Path) -> None:
    src = make_source(tmp_path, bad=False)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["build", str(src), str(out), "--engine", "ray", "--shard-size", "4000"]
    )
    assert result.exit_code == 0, result.output
    assert "packed 48 images" in result.output
    assert json.loads((out / "meta.json").read_text())["options"]["engine"] == "ray"
    result = CliRunner().invoke(app, ["build", str(src), str(out), "--engine", "spark"])
    assert result.exit_code == 2
    assert "--engine 'spark': expected one of local, ray" in result.output
    result = CliRunner().invoke(app, ["build", str(src), str(out), "--ray-address", "h:6379"])
    assert result.exit_code == 2
    assert "only --engine ray uses a cluster address" in result.output


def test_config_checks_and_shared_plan(tmp_path: Path) -> None:
    from packer.build import _output_options

    src = make_source(tmp_path, bad=False)
    with pytest.raises(ConfigError, match="--engine"):
        BuildConfig(src=src, out=tmp_path / "o", engine="dask")
    with pytest.raises(ConfigError, match="--ray-address"):
        BuildConfig(src=src, out=tmp_path / "o", ray_address="auto")
    local = BuildConfig(src=src, out=tmp_path / "o")
    remote = BuildConfig(src=src, out=tmp_path / "o", engine="ray", ray_address="h:6379")
    assert local.options()["engine"] == "local"
    assert "ray_address" not in remote.options()
    assert _output_options(local) == _output_options(remote)  # one plan digest for both


def test_local_build_never_imports_ray(tmp_path: Path) -> None:
    src = make_source(tmp_path, bad=False)
    code = (
        "import sys; from packer.cli import main; sys.argv[0] = 'packer'\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, "build", str(src), str(tmp_path / "out")],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "out" / "meta.json").exists()


def test_without_ray_installed_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: Any
) -> None:
    src = make_source(tmp_path, bad=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"needs Ray on every node: pip install ray"):
        build(cfg(src, tmp_path / "out", engine="ray"))
    assert not temp_dir_for(tmp_path / "out").exists()
