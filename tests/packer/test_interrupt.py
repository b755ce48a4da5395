"""Ctrl-C: one ``packer: interrupted`` line (what is kept, how to go on), exit 130, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from packer.build import temp_dir_for
from packer.verify import verify
from packer.writers.part import read_done
from tests.conftest import build_packed
from tests.packer.test_progress import TerminalRun, noise_tree, packer_cmd, packer_env


def _ctrl_c(proc: subprocess.Popen[str], when: object, timeout: float = 60.0) -> tuple[str, str]:
    """Send SIGINT to the process group of `proc` (as a terminal's Ctrl-C) once `when()`."""
    deadline = time.monotonic() + timeout
    while not when():  # type: ignore[operator]
        assert proc.poll() is None, "the command ended before it could be interrupted"
        assert time.monotonic() < deadline, "the command never got there"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return out, err


def _finished_shards(tmp: Path) -> int:
    return sum(read_done(tmp, n) is not None for n in range(64)) if tmp.is_dir() else 0


def _one_interrupted_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.replace("\x1b[K", "").splitlines()  # a terminal's line: over the bar
    lines = [line for line in lines if line.startswith("packer: interrupted")]
    assert len(lines) == 1, err
    return lines[0]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        packer_cmd(*args), capture_output=True, text=True, env=packer_env(), check=False
    )


def _start(*args: str, delay: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        packer_cmd(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=packer_env(delay=delay),
        start_new_session=True,  # its own process group: the SIGINT reaches the pool too
    )


def test_ctrl_c_during_a_parallel_build_keeps_finished_shards_for_resume(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    total_bytes = noise_tree(src, 160)
    args = ["build", str(src), str(out), "--workers", "2", "--shard-size", str(total_bytes // 4)]
    tmp = temp_dir_for(out)
    proc = _start(*args, delay=0.01)
    _, err = _ctrl_c(proc, lambda: _finished_shards(tmp) >= 1)
    assert proc.returncode == 130, err
    line = _one_interrupted_line(err)
    kept = _finished_shards(tmp)
    assert f"{kept} of " in line
    assert "--resume" in line
    assert str(tmp) in line
    assert not out.exists()

    resumed = _run(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{kept} finished shard(s) kept" in resumed.stderr
    assert "packed 160 images" in resumed.stdout
    assert verify(out, deep=True) == []


def test_ctrl_c_during_convert_keeps_finished_shards_for_resume(tmp_path: Path) -> None:
    src, packed, out = tmp_path / "src", tmp_path / "in.lmdb", tmp_path / "out.rec"
    total_bytes = noise_tree(src, 120)
    build_packed(src, packed, "lmdb", shard_size=total_bytes // 4, workers=1)
    args = ["convert", str(packed), str(out), "--format", "recordio"]
    args += ["--shard-size", str(total_bytes // 4)]
    tmp = temp_dir_for(out)
    proc = _start(*args, delay=0.01)
    _, err = _ctrl_c(proc, lambda: _finished_shards(tmp) >= 1)
    assert proc.returncode == 130, err
    line = _one_interrupted_line(err)
    assert "shards finished are kept" in line
    assert "--resume" in line

    resumed = _run(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "finished shard(s) kept" in resumed.stderr
    assert verify(out, deep=True) == []


def test_ctrl_c_during_verify_says_nothing_changed(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    noise_tree(src, 30)
    build_packed(src, out, "lmdb", workers=1)
    # on a terminal the bar shows when the checks have started: interrupt them then
    run = TerminalRun(
        packer_cmd("verify", str(out), "--deep"), packer_env(delay=0.05), start_new_session=True
    )
    assert run.read_until(b"verifying")
    os.killpg(run.proc.pid, signal.SIGINT)
    rc, stdout, err = run.finish()
    assert rc == 130, err
    line = _one_interrupted_line(err)
    assert line == "packer: interrupted: nothing was written or changed"
    assert "OK" not in stdout


def _any_done(root: Path) -> bool:
    return any(root.rglob("shard-*.done.json")) if root.is_dir() else False


def test_ctrl_c_during_append_leaves_out_unchanged(tmp_path: Path) -> None:
    first, more, out = tmp_path / "first", tmp_path / "more", tmp_path / "out.lmdb"
    noise_tree(first, 20)
    total_bytes = noise_tree(more, 80, seed=1, prefix="more")
    build_packed(first, out, "lmdb", workers=1)
    args = ["append", str(out), str(more), "--workers", "1"]
    args += ["--shard-size", str(total_bytes // 4)]
    proc = _start(*args, delay=0.01)
    _, err = _ctrl_c(proc, lambda: _any_done(temp_dir_for(out)))
    assert proc.returncode == 130, err
    line = _one_interrupted_line(err)
    assert line == f"packer: interrupted: {out} is unchanged; run the same command again"
    assert verify(out) == []
    assert '"num_samples": 20' in (out / "meta.json").read_text()
    again = _run(*args)
    assert again.returncode == 0, again.stderr
    assert '"num_samples": 100' in (out / "meta.json").read_text()


def test_ctrl_c_during_merge_keeps_finished_shards_for_resume(tmp_path: Path) -> None:
    parts = []
    for n in range(2):
        src, packed = tmp_path / f"src{n}", tmp_path / f"in{n}.lmdb"
        total_bytes = noise_tree(src, 60, seed=n)
        build_packed(src, packed, "lmdb", shard_size=total_bytes // 2, workers=1)
        parts.append(str(packed))
    out = tmp_path / "merged.lmdb"
    args = ["merge", str(out), *parts, "--shard-size", str(total_bytes // 3)]
    proc = _start(*args, delay=0.01)
    _, err = _ctrl_c(proc, lambda: _any_done(temp_dir_for(out)))
    assert proc.returncode == 130, err
    assert "--resume" in _one_interrupted_line(err)
    resumed = _run(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "finished shard(s) kept" in resumed.stderr
    assert verify(out) == []


def test_ctrl_c_during_split_puts_no_part_in_place(tmp_path: Path) -> None:
    src, packed, into = tmp_path / "src", tmp_path / "in.lmdb", tmp_path / "parts"
    total_bytes = noise_tree(src, 100)
    build_packed(src, packed, "lmdb", shard_size=total_bytes // 4, workers=1)
    args = ["split", str(packed), str(into), "--into", "train=0.5,val=0.5"]
    proc = _start(*args, delay=0.01)
    _, err = _ctrl_c(proc, lambda: _any_done(into))
    assert proc.returncode == 130, err
    line = _one_interrupted_line(err)
    assert line == (
        f"packer: interrupted: no part was put in place, {into} is as it was; run the same "
        "command again"
    )
    assert not (into / "train").exists()
    assert not (into / "val").exists()
    again = _run(*args)
    assert again.returncode == 0, again.stderr


def test_interrupted_while_merging_does_not_promise_resume(tmp_path: Path) -> None:
    from packer.feedback import shards_kept
    from packer.plan import MERGING_NAME

    tmp = tmp_path / ".out.lmdb.partial"
    tmp.mkdir()
    assert shards_kept(tmp, range(3)).kept == (
        f"0 of 3 shards finished are kept in {tmp}; run the same command with --resume to finish"
    )
    (tmp / MERGING_NAME).touch()
    assert shards_kept(tmp, range(3)).kept == (
        f"it was merging the shards' index in {tmp}, which cannot be resumed; run the same "
        "command again"
    )
