"""Where a build may write (issue 21): OUT never overlaps SRC or a label file, --overwrite
replaces only a packer dataset, OUT's parent is checked, and the build lock cannot be outrun."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.build import build, temp_dir_for
from packer.cli import app
from packer.config import BuildConfig
from packer.errors import BuildLockedError
from packer.output import build_lock, lock_path_for
from tests.conftest import write_tree

runner = CliRunner()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path (links followed), with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def refused(args: list[str], match: str) -> str:
    """Run ``packer build ARGS``; it must exit 2 with a ``packer: error:`` line naming `match`."""
    result = runner.invoke(app, ["build", *args, "--workers", "1"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "packer: error:" in result.output
    assert match in result.output, result.output
    return result.output


def no_leftovers(parent: Path) -> None:
    """No build directory, lock file or renamed old OUT next to the datasets in `parent`."""
    hidden = [p.name for p in parent.iterdir() if p.name.startswith(".")]
    assert hidden == [], hidden


# -------------------------------------------------------------------------------------------
# OUT against SRC


@pytest.mark.parametrize("mode", [[], ["--overwrite"], ["--resume"], ["--resume", "--overwrite"]])
@pytest.mark.parametrize("spelling", ["same", "dotdot", "ends_in_dotdot", "out_link", "src_link"])
def test_out_that_is_src_is_refused_and_src_kept(tree, tmp_path, mode, spelling):
    src, _ = tree
    before = snapshot(src)
    if spelling == "same":
        args = [str(src), str(src)]
    elif spelling == "dotdot":
        args = [str(src), str(src / "cat" / ".." / ".." / src.name)]
    elif spelling == "ends_in_dotdot":
        args = [str(src), str(src / "cat" / "..")]
    elif spelling == "out_link":
        (tmp_path / "link").symlink_to(src)
        args = [str(src), str(tmp_path / "link")]
    else:
        (tmp_path / "link").symlink_to(src)
        args = [str(tmp_path / "link"), str(src)]
    refused([*args, *mode], "is SRC")
    assert snapshot(src) == before
    no_leftovers(tmp_path)


@pytest.mark.parametrize("mode", [[], ["--overwrite"], ["--resume"]])
def test_src_inside_out_is_refused(tmp_path, mode):
    out = tmp_path / "out"
    src = out / "images"
    write_tree(src, {"a": 2, "b": 1})
    before = snapshot(out)
    refused([str(src), str(out), *mode], "lies inside OUT")
    # through a link: SRC names a folder of OUT by another path
    (tmp_path / "shortcut").symlink_to(src)
    refused([str(tmp_path / "shortcut"), str(out), *mode], "lies inside OUT")
    assert snapshot(out) == before


def test_out_inside_src_is_refused(tree, tmp_path):
    """The scan of this build skips OUT, but a later build of SRC would take it for a class
    folder: an OUT inside SRC is refused, also through a link to SRC's folder."""
    src, _ = tree
    before = snapshot(src)
    refused([str(src), str(src / "packed.lmdb")], "lies inside SRC")
    refused([str(src), str(src / "cat" / "packed.lmdb")], "lies inside SRC")
    (tmp_path / "link").symlink_to(src / "dog")
    refused([str(src), str(tmp_path / "link" / "packed.lmdb")], "lies inside SRC")
    assert snapshot(src) == before
    assert not any(p.name.startswith(".") for p in src.rglob("*"))


def test_src_inside_the_build_directory_is_refused(tmp_path):
    """SRC under ``.OUT.partial``: the build clears that directory before it writes there."""
    out = tmp_path / "out"
    src = temp_dir_for(out) / "images"
    write_tree(src, {"a": 2, "b": 1})
    before = snapshot(src)
    for mode in ([], ["--resume"], ["--overwrite"]):
        refused([str(src), str(out), *mode], "the build directory")
    assert snapshot(src) == before
    assert not out.exists()


@pytest.mark.parametrize("name", [".", ".."])
def test_out_that_names_no_directory_is_refused(tree, tmp_path, monkeypatch, name):
    src, _ = tree
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    refused([str(src), name, "--overwrite"], "does not name a directory")
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("option", ["--labels", "--class-map"])
def test_label_file_inside_out_is_refused(tree, tmp_path, option):
    """--overwrite replaces OUT whole: a label file kept inside it would be gone."""
    src, files = tree
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out))
    listing = out / "labels.txt"
    if option == "--labels":
        listing.write_text("".join(f"{rel}\t{rel.split('/')[0]}\n" for rel in sorted(files)))
        extra = ["--labels", str(listing)]
    else:
        listing.write_text("cat\ndog\neel\n")
        extra = ["--class-map", str(listing)]
    refused([str(src), str(out), "--overwrite", *extra], f"{option} {listing}: {listing} lies")
    assert listing.exists()
    # the same file named through a link to OUT
    (tmp_path / "alias").symlink_to(out)
    aliased = str(tmp_path / "alias" / "labels.txt")
    refused([str(src), str(out), "--overwrite", option, aliased], "lies inside")
    assert listing.exists()


# -------------------------------------------------------------------------------------------
# what --overwrite may replace


def test_overwrite_onto_a_directory_of_other_files_is_refused(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "photos"
    write_tree(out, {"holiday": 2})
    (out / "notes.txt").write_text("keep me")
    before = snapshot(out)
    refused([str(src), str(out), "--overwrite"], "holds no meta.json")
    assert snapshot(out) == before
    no_leftovers(tmp_path)


@pytest.mark.parametrize(
    "meta",
    [
        b'{"name": "someone else\'s"}',
        b'{"format": "parquet", "version": 1}',
        b'{"format": "lmdb", "version": "1"}',
        b'{"format": "lmdb"}',
        b"[1, 2]",
        b"{not json",
    ],
)
def test_overwrite_onto_a_foreign_meta_json_is_refused(tree, tmp_path, meta):
    src, _ = tree
    out = tmp_path / "other"
    out.mkdir()
    (out / "meta.json").write_bytes(meta)
    (out / "data.bin").write_bytes(b"precious")
    before = snapshot(out)
    refused([str(src), str(out), "--overwrite"], "meta.json")
    assert snapshot(out) == before


def test_overwrite_onto_a_file_is_refused(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "out.lmdb"
    out.write_text("a file a user wrote")
    refused([str(src), str(out), "--overwrite"], "is a file, not a dataset directory")
    assert out.read_text() == "a file a user wrote"


def test_overwrite_onto_an_empty_directory_builds(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out"
    out.mkdir()
    result = runner.invoke(app, ["build", str(src), str(out), "--overwrite", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "meta.json").read_text())["num_samples"] == len(files)
    no_leftovers(tmp_path)


def test_overwrite_onto_a_link_to_a_dataset_is_refused(tree, tmp_path):
    """Neither the link nor the dataset it points to is replaced; the message says to name the
    target."""
    src, files = tree
    target = tmp_path / "v1.lmdb"
    build(BuildConfig(src=src, out=target))
    before = snapshot(target)
    link = tmp_path / "current"
    link.symlink_to(target)
    refused([str(src), str(link), "--overwrite"], "pass the link's target as OUT")
    assert link.is_symlink()
    assert snapshot(target) == before
    result = runner.invoke(app, ["build", str(src), str(target), "--overwrite", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert link.is_symlink()
    assert json.loads((link / "meta.json").read_text())["num_samples"] == len(files)


# -------------------------------------------------------------------------------------------
# OUT's parent


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory no build can write in: a read-only tmpfs as root (root ignores permission
    bits), else mode 0555."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs")
        yield path
        subprocess.run(["umount", "-l", str(path)], check=False)
    else:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)


def test_out_in_a_read_only_directory_is_an_error_line(tree, read_only_dir):
    src, _ = tree
    output = refused([str(src), str(read_only_dir / "out")], "is not writable")
    assert str(read_only_dir) in output
    assert "Traceback" not in output
    output = refused([str(src), str(read_only_dir / "new" / "out")], "cannot make its parent")
    assert str(read_only_dir / "new") in output


def test_out_below_a_file_is_an_error_line(tree, tmp_path):
    src, _ = tree
    blocker = tmp_path / "plain"
    blocker.write_text("a file")
    refused([str(src), str(blocker / "out")], f"{blocker} is not a directory")
    refused([str(src), str(blocker / "deeper" / "out")], f"{blocker} is not a directory")
    assert blocker.read_text() == "a file"


def test_missing_parents_of_out_are_made(tree, tmp_path):
    src, files = tree
    out = tmp_path / "a" / "b" / "out"
    result = runner.invoke(app, ["build", str(src), str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "meta.json").read_text())["num_samples"] == len(files)


# -------------------------------------------------------------------------------------------
# the build lock


def test_a_lock_file_removed_by_its_holder_cannot_be_outrun(tmp_path, monkeypatch):
    """Build B opens the lock file; build A, which held it, finishes and removes it; B then
    locks the removed file. Build C, starting now, must still find OUT locked by B (the old
    lock let C lock a new file of the same name, and B and C ran together)."""
    out = tmp_path / "out"
    real_flock = fcntl.flock
    a_ran = []

    def flock_after_a_finishes(fd, operation):
        if not a_ran:  # B, between its open and its flock: A runs to the end
            a_ran.append(True)
            with build_lock(out):
                pass
            assert not lock_path_for(out).exists()
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_finishes)
    with build_lock(out):  # B
        assert a_ran
        with pytest.raises(BuildLockedError, match=f"pid {os.getpid()}"), build_lock(out):  # C
            pass
        assert lock_path_for(out).exists()
    assert not lock_path_for(out).exists()
    with build_lock(out):
        pass


def test_build_lock_lives_beside_out_and_is_removed(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "out"
    with build_lock(out):
        assert lock_path_for(out) == tmp_path / ".out.lock"
        assert lock_path_for(out).read_text() == f"pid {os.getpid()}"
        with pytest.raises(BuildLockedError):
            build(BuildConfig(src=src, out=out))
    build(BuildConfig(src=src, out=out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
