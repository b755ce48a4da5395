"""Installing next to either paddle build, and what happens without one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

import readers

ROOT = Path(__file__).resolve().parents[2]

# Runs `code` in a fresh interpreter in which `import paddle` fails as on a machine without it.
NO_PADDLE = "import sys; sys.modules['paddle'] = None\n"


def _run_without_paddle(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_PADDLE + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_paddle_build_is_a_hard_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("[")[0].strip() for d in project["dependencies"]]
    assert not [n for n in names if n.startswith("paddlepaddle")]
    extras = project["optional-dependencies"]
    assert any(d.startswith("paddlepaddle>") for d in extras["cpu"])
    assert any(d.startswith("paddlepaddle-gpu>") for d in extras["gpu"])
    assert "cpu" in (ROOT / "Makefile").read_text().split("pip install", 2)[2].split("\n")[0]


def test_a_missing_paddle_is_named_with_both_builds(tmp_path: Path) -> None:
    done = _run_without_paddle(
        "import readers\n"
        "try:\n"
        "    readers.LmdbDataset\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('ERROR', exc.name, exc)\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ERROR paddle "), done.stdout
    assert "paddle-packer[cpu]" in done.stdout
    assert "paddlepaddle-gpu" in done.stdout


def test_packing_works_without_paddle_and_bench_says_what_to_install(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    out = tmp_path / "out.lmdb"
    cli = "from packer.cli import main; sys.argv = ['packer'] + {args!r}; main()"
    cache = str(tmp_path / "cache")
    for args in (
        ["build", str(src), str(out)],
        ["verify", "--deep", str(out)],
        ["stage", str(out), cache],
        ["info", str(out)],
    ):
        done = _run_without_paddle(cli.format(args=args), tmp_path)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    assert "paddle" not in done.stderr.lower()
    assert f"{len(files)}" in done.stdout

    done = _run_without_paddle(cli.format(args=["bench", str(out)]), tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "paddlepaddle-gpu" in done.stderr
    assert "Traceback" not in done.stderr


def test_dir_lists_the_lazily_imported_names() -> None:
    names = dir(readers)
    for name in readers.__all__:
        assert name in names
        assert getattr(readers, name) is not None
    assert {"LoaderStats", "LmdbDataset", "ShardStream", "open_dataset"} <= set(names)
