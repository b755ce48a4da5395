"""A FIFO, a directory or a device node in place of a dataset file (meta.json, the index, a shard
file) makes every command and every reader fail at once with a message naming the file, never
block in ``open`` forever.

Each command runs in a subprocess with a timeout, so that a hang (the bug) fails the test
instead of stopping the run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from readers.files import (
    DATASET_FILES,
    NotRegularFileError,
    check_regular,
    open_inside,
    open_regular,
    read_regular,
)
from readers.formats import FORMATS, REGISTRY
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from tests.conftest import build_packed, write_tree

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # seconds; a command that does not end by then is taken to hang


def _cases() -> list[tuple[str, str]]:
    cases = []
    for fmt in FORMATS:
        for name in (
            META_NAME,
            INDEX_NAME,
            INDEX_COLUMNAR_NAME,
            *REGISTRY[fmt].shard_files("shard-00000"),
        ):
            cases.append((fmt, name))
    return cases


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small dataset per format (two shards), copied by each test before it breaks it."""
    root = tmp_path_factory.mktemp("built")
    src = root / "src"
    files = write_tree(src, {"a": 3, "b": 3})
    size = sum(len(b) for b in files.values()) // 2 + 1
    return {fmt: build_packed(src, root / f"ds.{fmt}", fmt, shard_size=size) for fmt in FORMATS}


def _replace(out: Path, name: str, kind: str) -> None:
    """Put a `kind` (fifo, directory, device) where the file `name` of `out` was."""
    (out / name).unlink()
    if kind == "fifo":
        os.mkfifo(out / name)
    elif kind == "directory":
        (out / name).mkdir()
    else:
        try:
            os.mknod(out / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # like /dev/null
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")


def _copy(built: dict[str, Path], fmt: str, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / f"broken.{fmt}"
    shutil.copytree(built[fmt], out, symlinks=True)
    return out


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"python {' '.join(args[-3:])} hangs (still running after {TIMEOUT} s)")


_PROBE = """
    import json, sys
    from typer.testing import CliRunner
    from packer.cli import app
    from readers import LmdbDataset, RecordIODataset, ShardStream, open_dataset

    path, fmt, cache = sys.argv[1:]
    found = {}
    for command in (["verify", path], ["stage", path, cache], ["info", path]):
        result = CliRunner().invoke(app, command)
        found[command[0]] = [result.exit_code, result.stdout, result.stderr]
    classes = {"lmdb": LmdbDataset, "recordio": RecordIODataset}
    for what, make in (
        ("open_dataset", lambda: open_dataset(path)),
        ("dataset class", lambda: classes[fmt](path)),
        ("ShardStream", lambda: next(iter(ShardStream(path)))),
    ):
        try:
            make()
            found[what] = "opened"
        except Exception as exc:
            found[what] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(found))
"""


def _probe(out: Path, fmt: str, cache: Path) -> dict[str, Any]:
    """What ``packer verify``, ``stage`` and ``info`` and every reader make of `out`."""
    run = _run("-c", textwrap.dedent(_PROBE), str(out), fmt, str(cache))
    assert run.returncode == 0, run.stderr
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


KIND_WORDS = {"fifo": "FIFO (named pipe)", "directory": "directory", "device": "character device"}
READERS = ("open_dataset", "dataset class", "ShardStream")


@pytest.mark.parametrize(("fmt", "name"), _cases())
def test_a_fifo_fails_every_command_and_reader_with_a_message(
    built: dict[str, Path], tmp_path: Path, fmt: str, name: str
) -> None:
    out = _copy(built, fmt, tmp_path)
    _replace(out, name, "fifo")
    cache = tmp_path / "cache"
    found = _probe(out, fmt, cache)
    shown = f"{name}: is a FIFO (named pipe), not a regular file"

    code, stdout, _ = found["verify"]
    assert code == 1
    assert shown in stdout

    code, stdout, stderr = found["stage"]
    assert code == 2, stdout + stderr
    assert shown in stderr
    assert stdout == ""
    # nothing that looks like a staged dataset is left without its index
    assert not [p for p in cache.glob("*/meta.json") if not (p.parent / INDEX_NAME).is_file()]

    code, stdout, stderr = found["info"]
    if name in (META_NAME, INDEX_NAME, INDEX_COLUMNAR_NAME):
        assert code == 2, stdout
        assert shown in stderr
    else:  # info reads no shard
        assert code == 0, stderr

    for what in READERS:
        assert found[what].startswith("NotRegularFileError: "), (what, found[what])
        assert f"{out / name}: is a FIFO (named pipe), not a regular file" in found[what]


@pytest.mark.parametrize(
    ("fmt", "name", "kind"),
    [
        (FORMATS[0], META_NAME, "directory"),
        (FORMATS[-1], INDEX_NAME, "device"),
        ("lmdb", "shard-00000/data.mdb", "directory"),
        ("lmdb", "shard-00001/data.mdb", "device"),
        ("recordio", "shard-00001.rec", "device"),
    ],
)
def test_a_directory_or_device_in_place_of_a_file_is_named(
    built: dict[str, Path], tmp_path: Path, fmt: str, name: str, kind: str
) -> None:
    if fmt not in FORMATS:
        pytest.skip(f"{fmt} is not registered")
    out = _copy(built, fmt, tmp_path)
    _replace(out, name, kind)
    found = _probe(out, fmt, tmp_path / "cache")
    shown = f"{name}: is a {KIND_WORDS[kind]}, not a regular file"
    assert found["verify"][0] == 1
    assert shown in found["verify"][1]
    assert found["stage"][0] == 2
    assert shown in found["stage"][2]
    for what in READERS:
        assert shown in found[what], (what, found[what])


def test_a_bare_lmdb_whose_data_file_is_a_fifo_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    os.mkfifo(bare / "data.mdb")
    code = "import sys\nfrom readers import LmdbDataset\ntry:\n    LmdbDataset(sys.argv[1])\n"
    code += "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    run = _run("-c", code, str(bare))
    assert f"NotRegularFileError {bare / 'data.mdb'}: is a FIFO" in run.stdout, run.stderr


# --- readers.files ---------------------------------------------------------------------------


def test_open_regular_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opened without O_NONBLOCK, this would block forever
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"bytes")
    os.symlink(tmp_path / "file", tmp_path / "link")
    with pytest.raises(NotRegularFileError, match=r"fifo: is a FIFO \(named pipe\), not a regular"):
        open_regular(tmp_path / "fifo")
    with pytest.raises(NotRegularFileError, match="dir: is a directory, not a regular file"):
        read_regular(tmp_path / "dir")
    with pytest.raises(FileNotFoundError):
        check_regular(tmp_path / "missing")
    assert read_regular(tmp_path / "link") == b"bytes"  # links are followed unless refused
    with pytest.raises(NotRegularFileError, match="link: is a symbolic link"):
        open_regular(tmp_path / "link", follow=False)
    with open_regular(tmp_path / "file") as f:
        assert f.read() == b"bytes"
        assert os.get_blocking(f.fileno())  # O_NONBLOCK served the open only


def test_open_inside_follows_no_link_on_its_way(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.mdb").write_bytes(b"secret")
    root = tmp_path / "ds"
    (root / "real").mkdir(parents=True)
    (root / "real" / "data.mdb").write_bytes(b"ours")
    os.symlink(tmp_path / "elsewhere", root / "linked")
    os.symlink(tmp_path / "elsewhere" / "data.mdb", root / "real" / "link.mdb")
    with open_inside(root, "real/data.mdb") as f:
        assert f.read() == b"ours"
    with pytest.raises(NotRegularFileError, match="linked: is a symbolic link"):
        open_inside(root, "linked/data.mdb")
    with pytest.raises(NotRegularFileError, match=r"link\.mdb: is a symbolic link"):
        open_inside(root, "real/link.mdb")
    with pytest.raises(ValueError, match="inside the dataset"):
        open_inside(root, "../elsewhere/data.mdb")


def test_dataset_files_name_what_packer_build_writes(built: dict[str, Path]) -> None:
    from readers.formats.layout import WARNINGS_NAME

    assert WARNINGS_NAME in DATASET_FILES
    for fmt, out in built.items():
        meta = json.loads((out / META_NAME).read_text())
        shards = {
            rel.split("/")[0]
            for shard in meta["shards"]
            for rel in REGISTRY[fmt].shard_files(shard["name"])
        }
        assert {p.name for p in out.iterdir()} == set(DATASET_FILES) | shards
