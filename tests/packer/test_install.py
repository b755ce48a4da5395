"""Installing next to either paddle build, and what happens without one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "cpu" in (ROOT / "Makefile").read_text().split("pip install", 2)[2].split("\n")[0]


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
