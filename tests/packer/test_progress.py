"""Progress bars: per image while pool processes write shards, on a terminal only."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np

from packer.feedback import DELAY_ENV
from tests.conftest import encode

COUNTS = re.compile(r"(\d+)/(\d+) \[")


def noise_tree(
    root: Path, count: int, *, seed: int = 0, prefix: str = "img", side: int = 16
) -> int:
    """`count` noise PNGs `side` pixels square in two class folders; returns their bytes."""
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(count):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        data = encode(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), ".png")
        (folder / f"{prefix}_{i:04d}.png").write_bytes(data)
        total += len(data)
    return total


def packer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "packer.cli", *args]


def packer_env(delay: float = 0.0) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(DELAY_ENV, None)
    if delay:
        env[DELAY_ENV] = str(delay)
    return env


class TerminalRun:
    """A packer command whose stderr is a pseudo-terminal (stdout a pipe)."""

    def __init__(self, args: list[str], env: dict[str, str], **popen: object) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            **popen,  # type: ignore[call-overload]
        )
        os.close(slave)
        self.master = master
        self.err = b""

    def read_until(self, pattern: bytes, timeout: float = 60.0) -> bool:
        """Read the terminal until `pattern` shows (True) or it closes (False)."""
        deadline = time.monotonic() + timeout
        while pattern not in self.err and time.monotonic() < deadline:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return pattern in self.err
            if not chunk:
                break
            self.err += chunk
        return pattern in self.err

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        """Wait for the end; return its exit code, stdout and the terminal's text."""
        self.read_until(b"\0never\0", timeout)
        out = self.proc.stdout.read().decode() if self.proc.stdout else ""
        rc = self.proc.wait(timeout)
        os.close(self.master)
        return rc, out, self.err.decode(errors="replace")


def shown_counts(text: str, total: int) -> list[int]:
    """The image counts a tqdm bar of `total` drew, in order."""
    return [int(done) for done, of in COUNTS.findall(text) if int(of) == total]


def boundaries(out: Path) -> set[int]:
    """0 and the number of samples up to the end of each shard of the dataset `out`."""
    meta = json.loads((out / "meta.json").read_text())
    counts = [int(s["count"]) for s in meta["shards"]]
    return {0, *np.cumsum(counts).tolist()}


def test_parallel_build_shows_images_before_a_shard_is_done(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    total_bytes = noise_tree(src, 240)
    args = ["build", str(src), str(out), "--workers", "2", "--shard-size", str(total_bytes // 4)]
    run = TerminalRun(packer_cmd(*args), packer_env(delay=0.004))
    rc, stdout, err = run.finish()
    assert rc == 0, err
    assert "packed 240 images" in stdout
    shards = boundaries(out)
    assert len(shards) >= 4  # several shards, so that the pool writes them
    counts = shown_counts(err, 240)
    assert counts[-1] == 240, err
    between = [c for c in counts if c not in shards]
    assert between, f"the bar moved only when shards finished: {counts} (shards end at {shards})"


def test_verify_deep_shows_a_bar_on_a_terminal_only(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    noise_tree(src, 40)
    built = subprocess.run(
        packer_cmd("build", str(src), str(out), "--workers", "1"),
        capture_output=True,
        text=True,
        env=packer_env(),
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert built.stderr == ""  # no terminal: no bar, only the summary (on stdout)
    run = TerminalRun(packer_cmd("verify", str(out), "--deep"), packer_env())
    rc, stdout, err = run.finish()
    assert rc == 0, err
    assert stdout.strip() == f"{out}: OK (deep)"
    assert "verifying" in err
    assert shown_counts(err, 40)[-1] == 40
    quiet = subprocess.run(
        packer_cmd("verify", str(out), "--deep"),
        capture_output=True,
        text=True,
        env=packer_env(),
        check=False,
    )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, stdout, "")


def test_dupes_json_is_unchanged_by_the_bar(tmp_path: Path) -> None:
    from packer.dupes import find_dupes
    from tests.conftest import build_packed

    src, out = tmp_path / "src", tmp_path / "out.lmdb"
    noise_tree(src, 20, side=40)  # large enough to be compared for near copies
    (src / "a" / "copy.png").write_bytes((src / "a" / "img_0001.png").read_bytes())
    build_packed(src, out, "lmdb", workers=1)
    run = TerminalRun(packer_cmd("dupes", str(out), "--near", "--json"), packer_env())
    rc, stdout, err = run.finish()
    assert rc == 0, err
    expected = find_dupes([out], near=True, progress=False).as_json()
    assert stdout == json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    assert expected["groups"]
    assert "hashing" in err
    assert "comparing" in err  # the exact copies confirmed: 2 candidates
    assert shown_counts(err, 2)[-1] == 2
    assert shown_counts(err, 20)[-1] == 20  # the distinct images hashed
