"""The packer command through typer's CliRunner: exit codes and messages."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from packer.cli import app

runner = CliRunner()


def test_build_verify_info(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    result = runner.invoke(app, ["build", str(src), str(out), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert f"packed {len(files)} images" in result.output
    assert "skipped 0" in result.output

    result = runner.invoke(app, ["verify", str(out), "--deep"])
    assert result.exit_code == 0
    assert "OK (deep)" in result.output

    result = runner.invoke(app, ["info", str(out)])
    assert result.exit_code == 0
    assert f"{len(files)} samples in 1 shard" in result.output
    assert "cat" in result.output
    assert "jpeg" in result.output

    result = runner.invoke(app, ["info", str(out), "--json"])
    summary = json.loads(result.output)
    assert summary["labels"] == {"cat": 4, "dog": 5, "eel": 2}
    assert summary["num_samples"] == len(files)


def test_existing_out_exits_2_with_a_message(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "out"
    out.mkdir()
    result = runner.invoke(app, ["build", str(src), str(out)])
    assert result.exit_code == 2
    assert "already exists; pass --overwrite" in result.output
    assert "Traceback" not in result.output


def test_bad_options_exit_2(tree, tmp_path):
    src, _ = tree
    for args, message in (
        (["--shard-size", "huge"], "not a size"),
        (["--format", "zip"], "--format 'zip'"),
        (["--on-error", "maybe"], "--on-error"),
        (["--labels", str(tmp_path / "nope.txt")], "no such file"),
    ):
        result = runner.invoke(app, ["build", str(src), str(tmp_path / "o"), *args])
        assert result.exit_code == 2, args
        assert message in result.output, (args, result.output)


def test_on_error_fail_exit_code(tree, tmp_path):
    src, _ = tree
    (src / "cat" / "bad.png").write_bytes(b"")
    result = runner.invoke(app, ["build", str(src), str(tmp_path / "o"), "--on-error", "fail"])
    assert result.exit_code == 2
    assert "cat/bad.png: a zero-byte file [empty]" in result.output
    assert not (tmp_path / "o").exists()


def test_verify_exits_1_and_lists_problems(tree, tmp_path):
    src, _ = tree
    out = tmp_path / "out"
    assert runner.invoke(app, ["build", str(src), str(out)]).exit_code == 0
    (out / "index.jsonl").write_text("")
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert "index.jsonl: 0 lines but meta.json says 11" in result.output
    assert runner.invoke(app, ["info", str(tmp_path / "missing")]).exit_code == 2


def test_format_choices_come_from_the_registry():
    from readers.formats import REGISTRY

    result = runner.invoke(app, ["build", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.replace("\u2502", " ").split())  # rich's box edges out
    assert "|".join(REGISTRY) in text
    for fmt in REGISTRY.values():
        assert f"{fmt.name}: {fmt.summary}" in text
