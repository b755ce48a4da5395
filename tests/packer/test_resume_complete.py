"""``packer build --resume`` on an OUT that already finished: a retried job succeeds when
nothing changed, and says what differs otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from tests.conftest import write_tree

runner = CliRunner()
FORMATS = ["lmdb", "recordio"]


def packer_build(src: Path, out: Path, fmt: str, *extra: str) -> tuple[int, str]:
    args = ["build", str(src), str(out), "--format", fmt, "--no-progress", *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


@pytest.fixture(params=FORMATS)
def built(request, tmp_path) -> tuple[Path, Path, str]:
    src = tmp_path / "src"
    write_tree(src, {"a": 6, "b": 5})
    out = tmp_path / "out"
    code, output = packer_build(src, out, request.param, "--shard-size", "2000")
    assert code == 0, output
    return src, out, request.param


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*")}


def test_resume_of_a_complete_build_succeeds_and_keeps_it(built):
    src, out, fmt = built
    before = snapshot(out)
    # other workers (or the engine) do not change the output, so they do not count
    code, output = packer_build(src, out, fmt, "--shard-size", "2000", "--resume", "--workers", "2")
    assert code == 0, output
    assert "already complete" in output
    meta = json.loads((out / "meta.json").read_text())
    assert f"({meta['num_samples']} images in {meta['num_shards']} shards" in output
    assert snapshot(out) == before
    assert not (out.parent / ".out.partial").exists()


def test_without_resume_an_existing_out_is_still_refused(built):
    src, out, fmt = built
    code, output = packer_build(src, out, fmt, "--shard-size", "2000")
    assert code == 2
    assert "already complete" not in output


def test_other_options_are_named_with_both_values(built):
    src, out, fmt = built
    before = snapshot(out)
    code, output = packer_build(
        src, out, fmt, "--shard-size", "5000", "--no-decode-check", "--resume"
    )
    assert code == 2
    assert "already complete, but not as this build would make it" in output
    assert "--shard-size is 2000 in OUT, 5000 now" in output
    assert "--decode-check is True in OUT, False now" in output
    assert "--overwrite" in output
    assert snapshot(out) == before


def test_added_and_removed_sources_are_named(built):
    src, out, fmt = built
    (src / "a" / "img_000.png").rename(src / "b" / "moved.png")
    code, output = packer_build(src, out, fmt, "--shard-size", "2000", "--resume")
    assert code == 2
    assert "the sources changed: 1 file(s) added (b/moved.png)" in output
    assert "1 file(s) removed (a/img_000.png)" in output


def test_a_changed_source_is_reported(built):
    src, out, fmt = built
    path = src / "b" / "img_001.jpg"
    path.write_bytes(path.read_bytes() + b"\0")  # bigger: the plan changes
    code, output = packer_build(src, out, fmt, "--shard-size", "2000", "--resume")
    assert code == 2
    assert "the sources changed: files were modified" in output


def test_a_complete_out_from_an_older_packer_is_not_taken_for_the_same(built):
    src, out, fmt = built
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["plan_digest"]
    meta_path.write_text(json.dumps(meta))
    code, output = packer_build(src, out, fmt, "--shard-size", "2000", "--resume")
    assert code == 2
    assert "records no plan digest" in output


def test_resume_of_an_out_that_is_not_a_dataset_is_refused(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a": 2})
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, output = packer_build(src, out, "lmdb", "--resume")
    assert code == 2
    assert "already complete" not in output
    assert (out / "notes.txt").read_text() == "mine"
