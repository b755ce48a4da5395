"""Every option value of convert, append, merge, split and dupes is checked before anything is
written: a bad one is one ``packer: error:`` line naming the option (exit 2), never a
traceback, never silently ignored, and OUT (or DIR) is left as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.errors import ConfigError
from packer.regroup import check_part_name, parse_fractions, split_dataset
from readers.formats.layout import META_NAME
from tests.conftest import build_packed, write_tree

runner = CliRunner()

BAD = [
    # (command line with A, B = datasets, MORE = a directory of new images, X = nothing yet)
    ("convert A X --shard-size 0", "--shard-size '0': expected a size > 0"),
    ("convert A X --shard-size -5", "--shard-size '-5': '-5' is not a size"),
    ("convert A X --to nope", "--to 'nope': expected one of packer, webdataset, folder"),
    ("convert A X --on-error nope", "--on-error 'nope': expected skip or fail"),
    ("append A MORE --shard-size 0", "--shard-size '0': expected a size > 0"),
    ("append A MORE --quality 0", r"--quality 0: expected 1\.\.100"),
    ("append A MORE --quality 101", r"--quality 101: expected 1\.\.100"),
    ("append A MORE --max-pixels 0", "--max-pixels 0: expected a positive count"),
    ("append A MORE --label-depth 0", "--label-depth 0: must be at least 1"),
    ("append A MORE --workers -2", "--workers -2: must be at least 1"),
    ("append A MORE --class-map nope", "--class-map 'nope'"),
    ("append A MORE --on-error nope", "--on-error 'nope': expected skip or fail"),
    ("append A X", "SRC .*/x does not exist"),
    ("append X MORE", "OUT .*/x does not exist"),
    ("merge X A B --shard-size 0", "--shard-size '0': expected a size > 0"),
    ("merge X A X2", "SRC .*/x2 does not exist"),
    ("merge X A", "merge takes two or more"),
    ("split X DIR --into a=0.5,b=0.5", "SRC .*/x does not exist"),
    ("split A DIR --into a=0.5,b=0.5 --seed -1", "--seed -1: expected a whole number >= 0"),
    ("split A DIR --into .x.partial=0.5,x=0.5", "'.x.partial': a part name may not start"),
    ("split A DIR --into a=0.5,a=0.5", "the part 'a' is named twice"),
    ("split A DIR --into a/b=0.5,c=0.5", "'a/b': a part name is one directory name"),
    ("split A DIR --into ..=0.5,c=0.5", "'..': a part name may not start with '.'"),
    ("split A DIR --into a=0.5,b=0.6", "the fractions add up to 1.1; expected 1"),
    ("split A DIR --into a=0,b=1", "expected a fraction in"),
    ("split A DIR --into a=-0.5,b=1.5", "expected a fraction in"),
    ("split A DIR --into a", "'a' is not NAME=FRACTION"),
    ("dupes A X", "dataset .*/x does not exist"),
    ("dupes A --threshold 9", r"--threshold 9: expected 0\.\.8"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("options")
    write_tree(root / "src", {"cat": 2, "dog": 2})
    write_tree(root / "more" / "x", {"cat": 1}, seed=3)
    return {
        "A": build_packed(root / "src", root / "a.lmdb", "lmdb", workers=1),
        "B": build_packed(root / "src", root / "b.lmdb", "lmdb", workers=1),
        "MORE": root / "more" / "x",
        "X": root / "x",
        "X2": root / "x2",
        "DIR": root / "dir",
    }


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("line", "match"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_option_value_is_one_error_line(
    places: dict[str, Path], line: str, match: str
) -> None:
    root = places["A"].parent
    before = snapshot(root)
    args = [str(places.get(word, word)) for word in line.split()]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("packer: error: "), result.output
    assert re.search(match, lines[0]), lines[0]
    assert snapshot(root) == before  # nothing written, nothing removed
    assert not places["X"].exists()
    assert not places["DIR"].exists()


def test_part_names_and_the_library_checks(tmp_path: Path) -> None:
    for good in ("train", "val-1", "test_2", "a.b", "训练"):
        check_part_name(good, good)
    for bad in ("", ".hidden", "a\\b", "tab\there", "x" * 256):
        with pytest.raises(ConfigError, match="--into"):
            check_part_name(bad, bad)
    assert parse_fractions(" train = 0.75 , val=0.25 ") == {"train": 0.75, "val": 0.25}
    write_tree(tmp_path / "src", {"cat": 2})
    out = build_packed(tmp_path / "src", tmp_path / "a", "lmdb", workers=1)
    with pytest.raises(ConfigError, match="--seed -3"):
        split_dataset(out, tmp_path / "parts", {"a": 0.5, "b": 0.5}, seed=-3)
    with pytest.raises(ConfigError, match="--shard-size 0"):
        split_dataset(out, tmp_path / "parts", {"a": 0.5, "b": 0.5}, shard_size=0)
    with pytest.raises(ConfigError, match=r"'\.b'"):
        split_dataset(out, tmp_path / "parts", {"a": 0.5, ".b": 0.5})
    assert not (tmp_path / "parts").exists()
    assert (out / META_NAME).exists()
