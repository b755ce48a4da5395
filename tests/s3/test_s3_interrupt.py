"""Ctrl-C while a build uploads to object storage: one line, exit 130, --resume finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from packer.cli import app
from tests.conftest import write_tree


def test_ctrl_c_mid_upload_says_what_is_kept_and_resume_finishes(
    tmp_path: Path, bucket: str
) -> None:
    from packer.publish import PAUSE_ENV

    write_tree(tmp_path / "src", {"cat": 6, "dog": 6}, seed=5)
    url = f"{bucket}/out.lmdb"
    args = [sys.executable, "-m", "packer.cli", "build", str(tmp_path / "src"), url]
    args += ["--shard-size", "3KB", "--workers", "1", "--no-progress"]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env["PACKER_WORK_DIR"] = str(tmp_path / "packer-work")
    proc = subprocess.Popen(
        args,
        env=env | {PAUSE_ENV: "2"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "upload paused" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("packer: interrupted")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"packer: interrupted: {url} is not published (no meta.json")
    assert lines[0].endswith("run the same command with --resume to finish")
    done = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "already uploaded, kept" in done.stderr
    assert CliRunner().invoke(app, ["verify", url]).exit_code == 0
