"""``packer convert --to folder|webdataset``: nothing written outside OUT, nothing replaced,
nothing lost or injected, files durable before the export appears, ``--overwrite`` of an export
packer wrote, and names made safe (`packer.export_folder`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.export_folder import MARKER_NAME, join_inside, label_text, safe_component
from tests.conftest import encode, make_image

runner = CliRunner()


def _cli(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def _images(names: list[str], root: Path, seed: int = 0) -> dict[str, bytes]:
    """A distinct small PNG at each relative path under `root`; their bytes by path."""
    rng = np.random.default_rng(seed)
    files = {}
    for k, name in enumerate(names):
        data = encode(make_image(rng, 6 + k, 5), ".png")
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        files[name] = data
    return files


def _packed(tmp_path: Path, labels: dict[str, Any]) -> tuple[Path, dict[str, bytes]]:
    """A packer dataset of one image per path in `labels`, labelled by a JSONL manifest."""
    src = tmp_path / "src"
    files = _images(list(labels), src)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(
        "".join(json.dumps({"path": p, "label": v}) + "\n" for p, v in labels.items())
    )
    out = tmp_path / "ds"
    result = _cli("build", src, out, "--labels", manifest)
    assert result.exit_code == 0, result.output
    return out, files


def _with_classes(ds: Path, classes: list[str]) -> None:
    """Give the dataset other class names, as a class map, a merge or a foreign meta.json may."""
    meta = json.loads((ds / "meta.json").read_text())
    meta["classes"] = classes
    (ds / "meta.json").write_text(json.dumps(meta))


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _exported(out: Path) -> dict[str, bytes]:
    """The image files of an export, by path (its own files left out)."""
    own = {"errors.jsonl", "warnings.jsonl", "labels.txt", MARKER_NAME}
    return {k: v for k, v in _files(out).items() if k not in own}


def _warnings(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "warnings.jsonl").read_text().splitlines()]


def test_class_names_that_leave_out_are_written_inside_it(tmp_path: Path) -> None:
    """Class names ``../../x`` and an absolute path wrote images outside OUT, over a file that
    was there; now each is one escaped folder inside OUT, listed in warnings.jsonl."""
    ds, files = _packed(tmp_path, {"a/1.png": 0, "a/2.png": 0, "b/1.png": 1})
    elsewhere = tmp_path / "elsewhere"
    _with_classes(ds, ["../../x", str(elsewhere)])
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "1.png").write_bytes(b"keep me")
    before = _files(tmp_path)
    out = tmp_path / "work" / "out"
    result = _cli("convert", ds, out, "--to", "folder")
    assert result.exit_code == 0, result.output
    after = {k: v for k, v in _files(tmp_path).items() if not k.startswith("work/out/")}
    assert after == before  # nothing written or replaced outside OUT
    assert not elsewhere.exists()
    folder_a, folder_b = "%2E.%2F..%2Fx", safe_component(str(elsewhere))
    assert folder_b.startswith("%2F")
    assert "/" not in folder_b
    assert _exported(out) == {
        f"{folder_a}/1.png": files["a/1.png"],
        f"{folder_a}/2.png": files["a/2.png"],
        f"{folder_b}/1.png": files["b/1.png"],
    }
    notes = _warnings(out)
    assert [(n["path"], n["reason"], n["exported_as"]) for n in notes] == [
        ("a/1.png", "unsafe_name", f"{folder_a}/1.png"),
        ("a/2.png", "unsafe_name", f"{folder_a}/2.png"),
        ("b/1.png", "unsafe_name", f"{folder_b}/1.png"),
    ]
    assert "the class name '../../x' is exported as the folder" in notes[0]["message"]
    assert "warnings.jsonl" in result.output  # said on stderr


def test_label_depth_and_reserved_class_names_are_exported_not_crashed(tmp_path: Path) -> None:
    """``--label-depth 2`` names (``a/b``) and names of the export's own files crashed with a
    traceback; names equal but for case collided. Each class gets its own folder now."""
    src = tmp_path / "src"
    files = _images(["a/b/1.png", "a/c/1.png", "d/e/1.png", "d/f/1.png"], src)
    ds = tmp_path / "ds"
    assert _cli("build", src, ds, "--label-depth", "2").exit_code == 0
    assert json.loads((ds / "meta.json").read_text())["classes"] == ["a/b", "a/c", "d/e", "d/f"]
    out = tmp_path / "out"
    result = _cli("convert", ds, out, "--to", "folder")
    assert result.exit_code == 0, result.output
    assert set(_exported(out)) == {"a%2Fb/1.png", "a%2Fc/1.png", "d%2Fe/1.png", "d%2Ff/1.png"}

    _with_classes(ds, ["errors.jsonl", "Images", ".hidden", "errors.JSONL"])
    again = tmp_path / "again"
    result = _cli("convert", ds, again, "--to", "folder")
    assert result.exit_code == 0, result.output
    assert _exported(again) == {
        "errors.jsonl~1/1.png": files["a/b/1.png"],
        "Images~1/1.png": files["a/c/1.png"],
        "%2Ehidden/1.png": files["d/e/1.png"],
        "errors.JSONL~2/1.png": files["d/f/1.png"],
    }
    assert (again / "errors.jsonl").read_text() == ""  # still the export's own file
    assert [n["reason"] for n in _warnings(again)] == ["name_collision"] * 2 + [
        "unsafe_name",
        "name_collision",
    ]
    # a re-pack of the export finds every image (no hidden folder, no reserved name lost)
    back = tmp_path / "back"
    assert _cli("build", again, back).exit_code == 0
    assert json.loads((back / "meta.json").read_text())["num_samples"] == 4


def test_colliding_file_names_get_a_suffix_and_one_line_each(tmp_path: Path) -> None:
    """``a/000002_x.png``, ``a/x.png`` and ``b/x.png``: the old ``ID_NAME`` scheme gave the third
    the first one's name, replacing its image and listing it twice in labels.txt."""
    labels = {"a/000002_x.png": "one", "a/x.png": "two", "b/x.png": "three"}
    ds, files = _packed(tmp_path, labels)
    out = tmp_path / "out"
    result = _cli("convert", ds, out, "--to", "folder")
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in (out / "labels.txt").read_text().splitlines()]
    assert lines == [
        ["images/000002_x.png", "one"],
        ["images/x.png", "two"],
        ["images/x~1.png", "three"],
    ]
    for (name, label), path in zip(lines, labels, strict=True):
        assert labels[path] == label
        assert (out / name).read_bytes() == files[path]
    assert len(_exported(out)) == 3
    assert _warnings(out) == [
        {
            "path": "b/x.png",
            "reason": "name_collision",
            "message": "another image took the name 'x.png'",
            "packed": True,
            "exported_as": "images/x~1.png",
        }
    ]


def test_labels_with_line_breaks_or_tabs_are_not_injected(tmp_path: Path) -> None:
    """A label holding a newline wrote lines of its own into labels.txt (a re-pack relabelled
    other images); such records are listed in errors.jsonl instead."""
    labels = {
        "a.png": "ok",
        "b.png": "evil\nimages/a.png\tstolen",
        "c.png": "tab\there",
        "d.png": "cr\rx",
        "e.png": "line\u2028separator",
        "f.png": "fine too",
    }
    ds, files = _packed(tmp_path, labels)
    out = tmp_path / "out"
    result = _cli("convert", ds, out, "--to", "folder")
    assert result.exit_code == 0, result.output
    assert "skipped 4 (label_not_exportable 4" in result.output
    assert (out / "labels.txt").read_text() == "images/a.png\tok\nimages/f.png\tfine too\n"
    assert _exported(out) == {"images/a.png": files["a.png"], "images/f.png": files["f.png"]}
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["path"], e["reason"]) for e in errors] == [
        (p, "label_not_exportable") for p in ("b.png", "c.png", "d.png", "e.png")
    ]
    assert "--to webdataset keeps it" in errors[0]["message"]
    # a re-pack of the export gets exactly the exported labels
    back = tmp_path / "back"
    assert _cli("build", out, back, "--labels", out / "labels.txt").exit_code == 0
    rows = [json.loads(line) for line in (back / "index.jsonl").read_text().splitlines()]
    assert [(r["path"], r["label"]) for r in rows] == [
        ("images/a.png", "ok"),
        ("images/f.png", "fine too"),
    ]
    failed = _cli("convert", ds, tmp_path / "strict", "--to", "folder", "--on-error", "fail")
    assert failed.exit_code == 2
    assert "packer: error: b.png: the label 'evil\\nimages" in failed.output
    assert "[label_not_exportable]" in failed.output


@pytest.mark.parametrize("to", ["folder", "webdataset"])
def test_overwrite_replaces_an_export_packer_wrote_and_nothing_else(
    tmp_path: Path, to: str
) -> None:
    ds, _ = _packed(tmp_path, {"a/1.png": 0, "b/1.png": 1})
    out = tmp_path / "out"
    assert _cli("convert", ds, out, "--to", to).exit_code == 0
    marker = json.loads((out / MARKER_NAME).read_text())
    assert (marker["export"], marker["num_samples"]) == (to, 2)
    (out / "stale.txt").write_text("from the old export")
    result = _cli("convert", ds, out, "--to", to, "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no leftovers

    (out / MARKER_NAME).unlink()  # as an export written before packer marked them
    result = _cli("convert", ds, out, "--to", to, "--overwrite")
    assert result.exit_code == 2
    assert "packer: error:" in result.output
    assert f"not an export packer wrote (it holds no {MARKER_NAME})" in result.output
    assert (out / "errors.jsonl").exists()  # untouched

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    result = _cli("convert", ds, mine, "--to", to, "--overwrite")
    assert result.exit_code == 2
    assert "is not a packer dataset" in result.output
    assert (mine / "notes.txt").read_text() == "precious"


def test_image_files_and_folders_are_fsynced_before_the_export_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds, _ = _packed(tmp_path, {"a/1.png": 0, "a/2.png": 0, "b/1.png": 1})
    synced: set[tuple[int, int]] = set()
    at_publish: set[tuple[int, int]] = set()
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        real_fsync(fd)

    def rename(src: Any, dst: Any, **kwargs: Any) -> None:
        if Path(src).name == ".out.partial":
            at_publish.update(synced)
        real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    out = tmp_path / "out"
    assert _cli("convert", ds, out, "--to", "folder").exit_code == 0
    paths = [*out.rglob("*"), out]
    assert len([p for p in paths if p.suffix == ".png"]) == 3
    for path in paths:
        st = os.stat(path)
        assert (st.st_dev, st.st_ino) in at_publish, path


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("cat", "cat"),
        ("..", "%2E."),
        (".", "%2E"),
        ("", "_"),
        ("a/b", "a%2Fb"),
        ("50%", "50%25"),
        ("a\\b", "a%5Cb"),
        ("\x1b[31m\r\n", "%1B[31m%0D%0A"),
        ("\u202eevil", "%E2%80%AEevil"),
        ("bad\ud800", "bad%ED%A0%80"),
        ("日本", "日本"),
    ],
)
def test_safe_component(name: str, safe: str, tmp_path: Path) -> None:
    assert safe_component(name) == safe
    assert join_inside(tmp_path, safe) == tmp_path / safe


def test_safe_component_is_cut_to_a_file_name_and_join_refuses_the_rest(tmp_path: Path) -> None:
    assert len(safe_component("é" * 300).encode()) == 200
    assert len(safe_component("/" * 300)) == 198  # whole escapes only
    for bad in ("..", "a/b", ".x", ""):
        with pytest.raises(ValueError, match="not one safe path component"):
            join_inside(tmp_path, bad)


def test_label_text() -> None:
    assert label_text("wor ld") == "wor ld"
    assert label_text(["a", "b\nc"]) == '["a", "b\\nc"]'  # JSON escapes it
    for bad in ("a\nb", "a\tb", "a\rb", "a\x0bb", "a\x85b"):
        assert label_text(bad) is None
