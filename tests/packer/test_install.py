"""Installing next to either paddle build, and what happens without one."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

import readers
from tests.conftest import Packed, write_tree

ROOT = Path(__file__).resolve().parents[2]

# Runs `code` in a fresh interpreter in which `import paddle` fails as on a machine without it.
NO_PADDLE = "import sys; sys.modules['paddle'] = None\n"
# packer's command line from this tree, as the console script runs it
CLI = "from packer.cli import main; sys.argv = ['packer'] + {args!r}; main()"


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


def _make(target: str, cwd: Path, *variables: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``make TARGET`` in `cwd` (a copy of the Makefile and pyproject.toml), its venv's python a
    script that logs each call's arguments; (the run, the log)."""
    log = cwd / "python.log"
    done = subprocess.run(
        ["make", "--no-print-directory", target, *variables],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, log.read_text() if log.exists() else ""


@pytest.fixture
def make_dir(tmp_path: Path) -> Path:
    """The Makefile and pyproject.toml in a directory whose .venv/bin/python only logs."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "python.log"}\n')
    python.chmod(0o755)
    return tmp_path


def test_make_test_installs_everything_the_tests_need(make_dir: Path) -> None:
    done, log = _make(".venv/.installed", make_dir)
    assert done.returncode == 0, done.stderr
    assert log == "-m pip install --quiet -e .[cpu,dev,ray,s3]\n"


def test_make_demo_installs_the_cpu_extra_only_and_never_less_than_the_full_install(
    make_dir: Path,
) -> None:
    done, log = _make(".venv/.installed-demo", make_dir)
    assert done.returncode == 0, done.stderr
    assert log == "-m pip install --quiet -e .[cpu]\n"
    assert (make_dir / ".venv" / ".installed-demo").exists()

    (make_dir / ".venv" / ".installed-demo").unlink()
    (make_dir / "python.log").unlink()
    (make_dir / ".venv" / ".installed").touch()  # `make install` ran after the last change
    done, log = _make(".venv/.installed-demo", make_dir)
    assert done.returncode == 0, done.stderr
    assert log == ""
    assert "has the full install" in done.stdout
    assert (make_dir / ".venv" / ".installed-demo").exists()


def test_make_dist_builds_a_wheel_with_the_extras_both_packages_and_the_format_readmes(
    tmp_path: Path,
) -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    backend = next(r for r in requires if r.startswith("setuptools"))
    need = tuple(int(p) for p in backend.split(">=")[1].split("."))
    have = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    if have < need:  # `make install` brings it (the dev extra); the build is offline here
        pytest.skip(f"setuptools {have} installed, the build needs {backend}")
    src = tmp_path / "clone"
    src.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("packer", "readers"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    python = src / ".venv" / "bin" / "python"  # this interpreter, as the venv's
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = subprocess.run(
        ["make", "--no-print-directory", "dist", "DIST_FLAGS=--no-build-isolation"],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (src / "dist").glob("paddle_packer-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(metadata).decode()
        entry_points = z.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    for extra in ("cpu", "gpu", "dev", "ray", "s3"):
        assert f"Provides-Extra: {extra}\n" in meta
    assert 'Requires-Dist: paddlepaddle>=2.6; extra == "cpu"' in meta
    assert 'Requires-Dist: paddlepaddle-gpu>=2.6; extra == "gpu"' in meta
    assert "packer = packer.cli:main" in entry_points
    ours = {str(p.relative_to(src)) for p in src.glob("[pr]*/**/*.py")}
    assert ours <= names, sorted(ours - names)[:5]
    assert {"readers/formats/lmdb/README.md", "readers/formats/recordio/README.md"} <= names
    assert not [n for n in names if n.startswith(("tests/", "scripts/"))]


def test_a_missing_paddle_is_named_with_install_lines_that_work(tmp_path: Path) -> None:
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
    # packages that pip finds on PyPI, and the extra as a clone or a wheel spells it
    assert "`pip install paddlepaddle`" in done.stdout
    assert "`pip install paddlepaddle-gpu`" in done.stdout
    assert "`pip install '.[cpu]'`" in done.stdout
    assert "paddle-packer[" not in done.stdout  # no such package is published


def test_reading_stored_bytes_without_paddle_leaves_the_paddle_classes_refused(
    packed: Packed, tmp_path: Path
) -> None:
    done = _run_without_paddle(
        "import readers\n"
        "from readers._paddle import open_for_bytes\n"
        f"ds = open_for_bytes({str(packed.path)!r})\n"
        "print(ds.read_bytes(0).hex())\n"
        "print(ds.decode_stored(ds.read_bytes(0), 0, 'rgb').shape)\n"
        "try:\n"
        "    readers.LmdbDataset\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('ERROR', exc.name)\n"
        "try:\n"
        "    import paddle\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('ERROR', exc.name)\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert bytes.fromhex(lines[0]) in packed.files.values()
    assert lines[1].startswith("("), done.stdout
    assert lines[2:] == ["ERROR paddle", "ERROR paddle"], done.stdout


def test_every_command_but_bench_works_without_paddle(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, files = tree
    more = tmp_path / "more"
    for rel in write_tree(more, {"cat": 2, "dog": 2}, seed=1):  # new paths, known classes
        (more / rel).rename(more / rel.replace("/img_", "/new_"))
    out, copy = tmp_path / "out.lmdb", tmp_path / "copy.lmdb"
    html = tmp_path / "report.html"
    commands = [
        ["build", str(src), str(out)],
        ["verify", "--deep", str(out)],
        ["info", str(out)],
        ["info", str(out), "--html", str(html)],  # thumbnails: the stored bytes decoded
        ["convert", str(out), str(copy)],
        ["dupes", str(out), str(copy)],  # every image in both: candidates read and hashed
        ["dupes", "--near", str(out)],  # every image decoded
        ["append", str(copy), str(more)],
        ["split", str(out), str(tmp_path / "split"), "--into", "train=0.5,val=0.5"],
        ["merge", str(tmp_path / "merged.lmdb"), str(copy), str(tmp_path / "split" / "val")],
        ["stage", str(out), str(tmp_path / "cache")],
    ]
    outputs = {}
    for args in commands:
        done = _run_without_paddle(CLI.format(args=args), tmp_path)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        outputs[" ".join(args[:2])] = done.stdout
    assert f"{len(files)}" in outputs[f"info {out}"]
    assert html.read_text().count("<img ") == len(files)
    assert f"{len(files)} group" in outputs[f"dupes {out}"], outputs[f"dupes {out}"]
    assert (tmp_path / "merged.lmdb" / "meta.json").is_file()


def test_bench_without_paddle_says_what_to_install(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    src, _ = tree
    out = tmp_path / "out.lmdb"
    done = _run_without_paddle(CLI.format(args=["build", str(src), str(out)]), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    done = _run_without_paddle(CLI.format(args=["bench", str(out)]), tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("packer: error: PaddlePaddle is not installed")
    assert "pip install paddlepaddle-gpu" in lines[0]


def test_dir_lists_the_lazily_imported_names() -> None:
    names = dir(readers)
    for name in readers.__all__:
        assert name in names
        assert getattr(readers, name) is not None
    assert {"LoaderStats", "LmdbDataset", "ShardStream", "open_dataset"} <= set(names)
