"""``packer append``: new shards after the old ones, old ids/shards/bytes untouched, the class
rules of the first build, duplicates refused, and OUT the old or the new dataset at every
moment (``kill -9`` at each step of an append, readers open on it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.append import (
    KILL_AT_ENV,
    STEPS,
    AppendSummary,
    append,
    append_config,
    read_dataset,
)
from packer.cli import app
from packer.errors import InputError, PackerError
from packer.labels.classmap import ClassGrowthError
from readers import open_dataset
from readers.errors import DatasetRebuiltError
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def new_tree(root: Path, spec: dict[str, int], *, seed: int = 7, prefix: str = "new") -> dict:
    """A class-folder tree whose file names do not collide with `write_tree`'s."""
    files = write_tree(root, spec, seed=seed)
    renamed = {}
    for rel, data in files.items():
        cls, name = rel.split("/")
        (root / rel).rename(root / cls / f"{prefix}_{name}")
        renamed[f"{cls}/{prefix}_{name}"] = data
    return renamed


def snapshot(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of OUT (recursively): its inode and bytes."""
    found = {}
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name != "lock.mdb":
            found[str(path.relative_to(out))] = (path.stat().st_ino, path.read_bytes())
    return found


def shard_files(snap: dict[str, tuple[int, bytes]]) -> dict[str, tuple[int, bytes]]:
    return {k: v for k, v in snap.items() if k.startswith("shard-")}


def do_append(out: Path, src: Path, **given: object) -> AppendSummary:
    class_map = str(given.pop("class_map", "keep"))
    cfg = append_config(out, src, read_dataset(out), **given)
    return append(cfg, class_map=class_map, log=lambda _: None)


def check_records(out: Path, files: dict[str, bytes]) -> None:
    """Every sample of OUT read back: its bytes are its source file's, its label its class."""
    ds = open_dataset(str(out), decode="bytes")
    meta = json.loads((out / META_NAME).read_text())
    lines = [json.loads(line) for line in (out / INDEX_NAME).read_text().splitlines()]
    assert len(ds) == len(lines) == meta["num_samples"] == len(files)
    for i, row in enumerate(lines):
        data, label = ds[i]
        assert row["id"] == i
        assert bytes(data) == files[row["path"]]
        assert meta["classes"][label] == row["path"].split("/")[0]


def verify_ok(out: Path) -> None:
    result = runner.invoke(app, ["verify", str(out), "--deep"])
    assert result.exit_code == 0, result.output


@pytest.fixture
def grown(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, bytes]]:
    """A dataset of two shards (cat, dog, eel), to append to."""
    src = tmp_path / "src"
    files = write_tree(src, {"cat": 4, "dog": 5, "eel": 2})
    out = build_packed(src, tmp_path / f"out.{fmt}", fmt, shard_size=2000, workers=1)
    assert len(json.loads((out / META_NAME).read_text())["shards"]) >= 2
    return out, files


def test_append_adds_shards_and_keeps_old_ones(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out, files = grown
    old_meta = json.loads((out / META_NAME).read_text())
    old_index = (out / INDEX_NAME).read_bytes()
    before = snapshot(out)
    extra = new_tree(tmp_path / "more", {"dog": 3, "cat": 2})
    summary = do_append(out, tmp_path / "more")
    meta = json.loads((out / META_NAME).read_text())
    # the old index lines, byte for byte, then the new ones
    index = (out / INDEX_NAME).read_bytes()
    assert index.startswith(old_index)
    assert meta["classes"] == old_meta["classes"]
    assert meta["shards"][: len(old_meta["shards"])] == old_meta["shards"]
    assert len(meta["shards"]) > len(old_meta["shards"])
    assert meta["num_samples"] == old_meta["num_samples"] + 5
    assert meta["options"]["appended"][0]["first_id"] == old_meta["num_samples"]
    # the old shards are the very same files: same inodes (hard links), same bytes
    after = snapshot(out)
    assert {k: after[k] for k in shard_files(before)} == shard_files(before)
    assert summary.appended == 5
    check_records(out, {**files, **extra})
    verify_ok(out)
    # and again: a second append continues after the first
    more = new_tree(tmp_path / "again", {"eel": 2}, seed=9, prefix="again")
    do_append(out, tmp_path / "again")
    check_records(out, {**files, **extra, **more})
    verify_ok(out)
    assert not (out.parent / f".{out.name}.partial").exists()


def test_new_class_is_an_error_unless_grow(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out, files = grown
    before = snapshot(out)
    extra = new_tree(tmp_path / "more", {"cat": 1, "fox": 2, "ant": 1})
    with pytest.raises(
        ClassGrowthError, match=r"2 class name\(s\).*'ant', 'fox'.*--class-map grow"
    ):
        do_append(out, tmp_path / "more")
    assert snapshot(out) == before
    do_append(out, tmp_path / "more", class_map="grow")
    meta = json.loads((out / META_NAME).read_text())
    assert meta["classes"] == ["cat", "dog", "eel", "ant", "fox"]  # old ids kept
    assert meta["options"]["appended"][0]["new_classes"] == ["ant", "fox"]
    check_records(out, {**files, **extra})
    verify_ok(out)


def test_a_path_already_in_out_is_a_duplicate(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out, files = grown
    more = tmp_path / "more"
    again = write_tree(more, {"cat": 2})  # cat/img_000.png and cat/img_001.jpg: in OUT already
    extra = new_tree(more, {"dog": 1}, seed=3)
    before = snapshot(out)
    with pytest.raises(InputError, match=r"cat/img_000.png: already in .* as id 0.*\[duplicate\]"):
        do_append(out, more, on_error="fail")
    assert snapshot(out) == before
    do_append(out, more)
    errors = [json.loads(line) for line in (out / ERRORS_NAME).read_text().splitlines()]
    assert [(e["path"], e["reason"]) for e in errors] == [(p, "duplicate") for p in sorted(again)]
    check_records(out, {**files, **extra})  # the old bytes of the duplicates, not the new
    assert do_append(out, more).already_complete  # the same SRC again: a retry
    write_tree(tmp_path / "dupes", {"cat": 2})  # another SRC, of paths OUT holds only
    with pytest.raises(PackerError, match="nothing to append"):
        do_append(out, tmp_path / "dupes")


def test_a_retried_append_is_already_complete(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """An append run again (e.g. after a kill -9 once it swapped in) is done: exit 0."""
    out, files = grown
    extra = new_tree(tmp_path / "more", {"dog": 2, "fox": 1})
    env = {**os.environ, KILL_AT_ENV: "swapped"}
    cmd = [sys.executable, "-m", "packer.cli", "append", str(out), str(tmp_path / "more")]
    killed = subprocess.run(
        [*cmd, "--class-map", "grow"], env=env, capture_output=True, text=True, check=False
    )
    assert killed.returncode == -9, killed.stderr
    check_records(out, {**files, **extra})  # swapped in before the kill
    history = json.loads((out / META_NAME).read_text())["options"]["appended"]
    assert [len(h["source_digest"]) for h in history] == [64]
    before = snapshot(out)
    for retry in ([*cmd, "--class-map", "grow"], cmd):  # fox is one of OUT's classes now
        result = runner.invoke(app, retry[3:])
        assert result.exit_code == 0, result.output
        first = len(files)
        assert (
            f"{out} already holds {tmp_path / 'more'}: appended at {history[0]['created']} as "
            f"ids {first}..{first + 2} from the same files, sizes, labels and options: "
            "nothing to do"
        ) in result.output
        assert snapshot(out) == before
        assert not (out.parent / f".{out.name}.partial").exists()  # the killed run's, removed
    # a file of SRC changed since: not the same SRC, and its path is in OUT already
    changed = sorted((tmp_path / "more").rglob("*.png"))[0]
    changed.write_bytes(changed.read_bytes() + b"\0")
    result = runner.invoke(app, cmd[3:])
    assert result.exit_code == 2
    assert "nothing to append" in result.output
    assert "duplicate" in result.output
    # a new file beside SRC's: only it is appended
    new_tree(tmp_path / "more", {"eel": 1}, seed=11, prefix="later")
    result = runner.invoke(app, cmd[3:])
    assert result.exit_code == 0, result.output
    assert f"appended 1 images as ids {len(files) + 3}..{len(files) + 3}" in result.output


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_step_leaves_old_or_new(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path, step: str
) -> None:
    out, files = grown
    before = snapshot(out)
    extra = new_tree(tmp_path / "more", {"dog": 2, "eel": 1})
    env = {**os.environ, KILL_AT_ENV: step}
    cmd = [sys.executable, "-m", "packer.cli", "append", str(out), str(tmp_path / "more")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stderr
    if step == "swapped":  # killed after the exchange: OUT is the new dataset
        check_records(out, {**files, **extra})
        assert {k: snapshot(out)[k] for k in shard_files(before)} == shard_files(before)
    else:  # killed before it: OUT is the old dataset, file for file
        assert snapshot(out) == before
        check_records(out, files)
    verify_ok(out)
    # a later append cleans up what the killed one left, and works
    leftover = out.parent / f".{out.name}.partial"
    assert leftover.exists()
    if step != "swapped":
        do_append(out, tmp_path / "more")
    else:
        later = new_tree(tmp_path / "later", {"cat": 1}, seed=5, prefix="later")
        do_append(out, tmp_path / "later")
        extra.update(later)
    assert not leftover.exists()
    check_records(out, {**files, **extra})
    verify_ok(out)


def test_an_open_reader_keeps_its_build(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out, files = grown
    old = open_dataset(str(out), decode="bytes")
    rows = [json.loads(line) for line in (out / INDEX_NAME).read_text().splitlines()]
    first, last = rows[0], rows[-1]
    assert first["shard"] != last["shard"]
    data, _ = old[0]  # opens shard 0 now
    assert bytes(data) == files[first["path"]]
    extra = new_tree(tmp_path / "more", {"cat": 2})
    do_append(out, tmp_path / "more")
    # the shard it holds is the same file (hard link): it reads on, with the old length
    data, _ = old[0]
    assert bytes(data) == files[first["path"]]
    assert len(old) == len(files)
    # a shard it has not opened yet would be the new build's: refused, never mixed
    with pytest.raises(DatasetRebuiltError):
        old[len(old) - 1]
    new = open_dataset(str(out), decode="bytes")
    assert len(new) == len(files) + len(extra)
    assert bytes(new[len(new) - 1][0]) in extra.values()


def test_cli_append_and_its_errors(grown: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    out, _ = grown
    new_tree(tmp_path / "more", {"cat": 1, "gnu": 1})
    result = runner.invoke(app, ["append", str(out), str(tmp_path / "more")])
    assert result.exit_code == 2
    assert "'gnu'" in result.output
    assert "--class-map grow" in result.output
    result = runner.invoke(app, ["append", str(out), str(tmp_path / "more"), "--class-map", "grow"])
    assert result.exit_code == 0, result.output
    assert "appended 2 images as ids 11..12" in result.output
    assert "new classes ['gnu']" in result.output
    result = runner.invoke(app, ["append", str(tmp_path / "nothing"), str(tmp_path / "more")])
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_out_is_never_missing_while_appending(
    grown: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """A reader polling OUT during the append sees the old meta.json or the new, never none."""
    import threading

    out, files = grown
    extra = new_tree(tmp_path / "more", {"dog": 4, "cat": 3})
    seen: set[int] = set()
    missing: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                seen.add(json.loads((out / META_NAME).read_bytes())["num_samples"])
            except (OSError, ValueError) as exc:
                missing.append(repr(exc))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        do_append(out, tmp_path / "more")
    finally:
        stop.set()
        poller.join()
    assert not missing
    assert seen <= {len(files), len(files) + len(extra)}
    assert json.loads((out / META_NAME).read_text())["num_samples"] == len(files) + len(extra)
