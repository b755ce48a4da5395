"""Common first mistakes get a message that says what to do.

Label paths written from SRC's parent, an image folder opened as a dataset, a path that does
not exist or is a file.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.config import BuildConfig
from packer.errors import ConfigError
from readers import LmdbDataset, RecordIODataset, open_dataset
from readers.errors import DatasetFormatError
from tests.conftest import write_tree

runner = CliRunner()


def ocr_tree(root: Path, *, prefixed: int, plain: int = 0) -> Path:
    """``root/imgs`` of text-line images and ``root/labels.txt`` as PaddleOCR lists it.

    The first `prefixed` lines name their image as ``imgs/...`` (from SRC's parent).
    """
    files = sorted(write_tree(root / "imgs", {"lines": prefixed + plain}))
    lines = [f"{'imgs/' if i < prefixed else ''}{rel}\tWORD{i}\n" for i, rel in enumerate(files)]
    (root / "labels.txt").write_text("".join(lines))
    return root / "imgs"


def build(src: Path, out: Path, labels: Path) -> object:
    args = ["build", str(src), str(out), "--labels", str(labels), "--workers", "1"]
    return runner.invoke(app, [*args, "--no-progress"])


def test_label_paths_prefixed_with_srcs_name_get_a_hint(tmp_path):
    data = tmp_path / "data"
    src = ocr_tree(data, prefixed=4, plain=2)
    result = build(src, tmp_path / "out.lmdb", data / "labels.txt")
    assert result.exit_code == 0, result.output
    assert "packed 2 images" in result.stdout
    assert "skipped 4 (missing 4" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "hint: 4 label paths start with 'imgs/' (SRC's own name) and are missing; label "
        f"paths are relative to SRC: pass the parent folder as SRC ({data}) or drop the "
        "prefix"
    )
    errors = [json.loads(x) for x in (tmp_path / "out.lmdb" / "errors.jsonl").open()]
    assert {e["reason"] for e in errors} == {"missing"}  # still skipped, as documented
    # the hint's advice works: the parent folder as SRC packs every listed image
    fixed = build(data, tmp_path / "fixed.lmdb", data / "labels.txt")
    assert fixed.exit_code == 0, fixed.output
    assert "packed 4 images" in fixed.stdout
    assert "hint:" not in fixed.output


def test_every_label_path_prefixed_says_so_in_the_error(tmp_path):
    src = ocr_tree(tmp_path, prefixed=3)
    result = build(src, tmp_path / "out.lmdb", tmp_path / "labels.txt")
    assert result.exit_code == 2
    assert result.output.startswith("packer: error: no image under")
    assert "; hint: 3 label paths start with 'imgs/' (SRC's own name)" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_no_hint_when_the_prefixed_paths_are_missing_anyway(tmp_path):
    src = ocr_tree(tmp_path, prefixed=0, plain=2)
    with (tmp_path / "labels.txt").open("a") as f:
        f.write("imgs/lines/gone.png\tX\nimgs/lines/lost.png\tY\n")
    result = build(src, tmp_path / "out.lmdb", tmp_path / "labels.txt")
    assert result.exit_code == 0, result.output
    assert "missing 2" in result.stdout
    assert "hint:" not in result.output


@pytest.fixture
def images(tmp_path: Path) -> Path:
    write_tree(tmp_path / "imgs", {"a": 3, "b": 2})
    return tmp_path / "imgs"


def folder_message(path: Path) -> str:
    return (
        f"{path} looks like a folder of images (5 found), not a packed dataset: pack it first "
        f"with `packer build {shlex.quote(str(path))} {shlex.quote(str(path) + '.lmdb')}`"
    )


@pytest.mark.parametrize("opener", [LmdbDataset, RecordIODataset, open_dataset])
def test_an_image_folder_opened_as_a_dataset(images, opener):
    with pytest.raises(DatasetFormatError) as caught:
        opener(images)
    assert str(caught.value) == folder_message(images)


@pytest.mark.parametrize("command", ["info", "verify"])
def test_an_image_folder_given_to_info_or_verify(images, command):
    result = runner.invoke(app, [command, str(images)])
    assert result.exit_code == (2 if command == "info" else 1)
    assert folder_message(images) in result.output


@pytest.mark.parametrize("opener", [LmdbDataset, RecordIODataset, open_dataset])
def test_a_missing_dataset_and_a_file_are_told_apart(tmp_path, opener):
    with pytest.raises(DatasetFormatError, match=r"/nope: does not exist$"):
        opener(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DatasetFormatError, match=r"notes\.txt: (neither|not a dataset)"):
        opener(tmp_path / "notes.txt")


def test_info_and_verify_tell_missing_from_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    missing = runner.invoke(app, ["info", str(tmp_path / "nope")])
    assert missing.output == f"packer: error: {tmp_path / 'nope'}: does not exist\n"
    a_file = runner.invoke(app, ["info", str(tmp_path / "notes.txt")])
    assert a_file.exit_code == 2
    assert "notes.txt: a file, not a packed dataset (a directory with meta.json)" in (a_file.output)
    assert (
        f"{tmp_path / 'nope'}: does not exist"
        in runner.invoke(app, ["verify", str(tmp_path / "nope")]).output
    )
    assert (
        "notes.txt: neither a packed dataset"
        in runner.invoke(app, ["verify", str(tmp_path / "notes.txt")]).output
    )


def test_a_missing_src_and_a_file_src_are_told_apart(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ConfigError, match=r"^SRC .*/nope does not exist$"):
        BuildConfig(src=tmp_path / "nope", out=tmp_path / "o")
    with pytest.raises(ConfigError, match=r"^SRC .*/notes\.txt: a file, not a directory"):
        BuildConfig(src=tmp_path / "notes.txt", out=tmp_path / "o")
    result = runner.invoke(app, ["build", str(tmp_path / "nope"), str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output == f"packer: error: SRC {tmp_path / 'nope'} does not exist\n"


def test_an_out_that_is_a_file_is_not_offered_overwrite(tree, tmp_path):
    src, _ = tree
    (tmp_path / "notes.txt").write_text("hi")
    result = runner.invoke(app, ["build", str(src), str(tmp_path / "notes.txt")])
    assert result.exit_code == 2
    assert result.output == (
        f"packer: error: {tmp_path / 'notes.txt'} already exists and is a file, not a dataset "
        "directory; choose another OUT (or remove the file)\n"
    )
    assert (tmp_path / "notes.txt").read_text() == "hi"
