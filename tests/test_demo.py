"""``make demo``'s last step (scripts/demo_read.py): fair timings, and a headline that claims
only what its rows show."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import build_packed

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


@pytest.fixture(scope="module")
def demo() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import demo_read

        yield demo_read
    finally:
        sys.path.remove(str(SCRIPTS))


def _runs(rates: list[float], waited: float = 0.0) -> list[dict[str, Any]]:
    return [{"samples": r, "seconds": 1.0, "waited": waited, "cached": 0.0} for r in rates]


def test_a_row_that_loses_is_explained_and_never_in_the_headline(
    demo: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    res = {
        demo.WARM: {"packed": _runs([620, 700, 580]), "loose": _runs([1000, 1000, 1000])},
        demo.COLD: {"packed": _runs([2000, 2100, 1900]), "loose": _runs([1000, 1000, 1000])},
        "step": {"packed": _runs([1, 1, 1], 0.03), "loose": _runs([1, 1, 1], 0.6)},
    }
    args = type("Args", (), {"workers": 2, "rounds": 3, "step_ms": 20, "size": "64x64"})()
    demo.report(args, res, demo.COLD, "not root (a blkio cgroup needs root)")
    out = capsys.readouterr().out.splitlines()
    assert any(line.split()[:4] == ["warm", "620", "1,000", "0.62x"] for line in out), out
    assert any("skipped: not root" in line for line in out)
    (why,) = [line for line in out if "no gain" in line and not line.startswith("Result")]
    assert why.strip().startswith("warm, no gain: every read comes from memory")
    result = out[-1]
    assert result.startswith("Result: packed reads ran 2.0x cold as fast as loose files;")
    assert "warm" not in result.split(";")[0]
    assert "waited for data 3% of the time, not 60%" in result
    assert result.endswith("no gain warm 0.62x (why: above).")


def test_rounds_that_disagree_are_called_noisy(
    demo: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    res = {
        demo.WARM: {"packed": _runs([2280, 890, 650]), "loose": _runs([1000, 1000, 1000])},
        demo.COLD: {"packed": _runs([1600, 1700, 1400]), "loose": _runs([1000, 1000, 1000])},
        "step": {"packed": _runs([1, 1, 1], 0.01), "loose": _runs([1, 1, 1], 0.02)},
    }
    args = type("Args", (), {"workers": 2, "rounds": 3, "step_ms": 20, "size": "64x64"})()
    demo.report(args, res, demo.COLD, "not root")
    out = capsys.readouterr().out
    assert "  warm: the rounds disagree (0.65x to 2.28x)" in out
    assert "cold: the rounds" not in out
    assert out.splitlines()[-1] == (
        "Result: packed reads ran 1.6x cold as fast as loose files; both kept a training job fed "
        "(cold); no gain warm 0.89x (noisy) (why: above)."
    )


def test_the_headline_says_when_packing_gained_nothing(demo: ModuleType) -> None:
    line = demo.headline({demo.WARM: 0.9, demo.COLD: 1.05}, 0.02, 0.01, demo.COLD)
    assert "ran" not in line
    assert line == (
        "Result: both kept a training job fed (cold); no gain warm 0.90x, cold 1.05x (why: above)."
    )
    line = demo.headline({demo.COLD: 1.5}, 0.4, 0.2, demo.COLD)
    assert "waited longer packed (40%) than loose (20%)" in line


@pytest.mark.slow
def test_the_demo_runs_every_timing_in_a_fresh_process(tmp_path: Path) -> None:
    images, packed = tmp_path / "images", tmp_path / "sample.lmdb"
    env_python = [sys.executable]
    subprocess.run(
        [*env_python, str(SCRIPTS / "make_demo_data.py"), str(images), "--per-class", "13"],
        check=True,
        capture_output=True,
    )
    build_packed(images, packed, "lmdb")
    done = subprocess.run(
        [*env_python, str(SCRIPTS / "demo_read.py"), str(packed), str(images), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("LmdbDataset: 130 samples; sample 0: (64, 64, 3) uint8, label 0")
    assert "each timing in a fresh process, the sources alternating" in out
    for row in ("warm", "cold"):
        assert f"\n  {row} " in out
    assert "emulated HDD" in out  # timed, or skipped with the reason
    assert "Training job, 20 ms step per batch" in out
    assert out.splitlines()[-2].startswith("Result: ")
