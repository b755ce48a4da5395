"""``packer dupes`` against planted duplicates (no false groups), and ``packer build --dedup``."""

from __future__ import annotations

import json
import random
import shutil
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.dupes import confirm_candidates, exact_candidates, find_dupes
from packer.nearhash import group_near
from tests.conftest import build_packed, encode, write_tree

runner = CliRunner()


def _planted(tmp_path: Path, fmt: str) -> tuple[Path, Path]:
    """train: 11 distinct images + a copy with another label + a copy with the same label;
    val: 2 distinct images + a copy of a train image (leakage)."""
    src = tmp_path / "train_src"
    write_tree(src, {"cat": 4, "dog": 5, "eel": 2})
    shutil.copy(src / "cat/img_000.png", src / "dog/copy_of_cat.png")
    shutil.copy(src / "cat/img_001.jpg", src / "cat/again.jpg")
    val = tmp_path / "val_src"
    write_tree(val, {"dog": 2}, seed=7)
    shutil.copy(src / "dog/img_002.png", val / "dog/leak.png")
    train = build_packed(src, tmp_path / f"train.{fmt}", fmt)
    other = "recordio" if fmt == "lmdb" else "lmdb"  # across formats as well
    return train, build_packed(val, tmp_path / f"val.{other}", other)


def _paths(group: dict) -> list[tuple[str, str]]:
    return [(Path(m["dataset"]).stem, m["path"]) for m in group["members"]]


def test_dupes_finds_the_planted_groups_and_no_others(tmp_path: Path, fmt: str) -> None:
    train, val = _planted(tmp_path, fmt)
    result = runner.invoke(app, ["dupes", str(train), str(val), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    groups = report["groups"]
    # leakage first, then the label conflict, then the plain copy; nothing else
    assert [_paths(g) for g in groups] == [
        [("train", "dog/img_002.png"), ("val", "dog/leak.png")],
        [("train", "cat/img_000.png"), ("train", "dog/copy_of_cat.png")],
        [("train", "cat/again.jpg"), ("train", "cat/img_001.jpg")],
    ]
    assert [(g["cross_dataset"], g["conflicting_labels"]) for g in groups] == [
        (True, False),
        (False, True),
        (False, False),
    ]
    member = groups[1]["members"][1]
    assert member["class"] == "dog"
    assert set(member) >= {"dataset", "id", "path", "label"}
    assert report["summary"]["extra_copies"] == 3


def test_dupes_text_lists_groups(tmp_path: Path) -> None:
    train, val = _planted(tmp_path, "lmdb")
    result = runner.invoke(app, ["dupes", str(train), str(val)])
    assert result.exit_code == 0, result.output
    assert "3 groups of identical images (3 extra copies)" in result.output
    assert "[exact, across datasets]" in result.output
    assert "labels disagree" in result.output


def test_dupes_of_distinct_images_is_empty(packed) -> None:  # type: ignore[no-untyped-def]
    report = find_dupes([packed.path], near=True)
    assert report.groups == []


def test_dupes_refuses_a_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dupes", str(tmp_path)])
    assert result.exit_code == 2
    assert "no meta.json" in result.output


def _crc_collision() -> tuple[bytes, bytes]:
    """Two different 8-byte strings with the same CRC-32 (a birthday search)."""
    seen: dict[int, bytes] = {}
    rng = random.Random(0)  # random strings: CRC-32 never collides on short bursts
    for _ in range(1 << 20):
        data = rng.randbytes(8)
        crc = zlib.crc32(data)
        if crc in seen:
            return seen[crc], data
        seen[crc] = data
    raise AssertionError("no collision found")


def test_a_crc_collision_is_not_a_group() -> None:
    a, b = _crc_collision()
    blobs = [a, b, a, b"other123"]
    crc = np.array([zlib.crc32(x) for x in blobs], dtype=np.uint32)
    nbytes = np.array([len(x) for x in blobs], dtype=np.uint32)
    runs = exact_candidates(crc, nbytes)
    assert [r.tolist() for r in runs] == [[0, 1, 2]]  # the collision is a candidate ...
    groups = confirm_candidates(runs, lambda row: blobs[row])
    assert [g.tolist() for g, _ in groups] == [[0, 2]]  # ... but only equal bytes group


def _smooth(rng: np.random.Generator, side: int = 192) -> np.ndarray:
    low = rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)
    return cv2.resize(low, (side, side), interpolation=cv2.INTER_CUBIC)


def test_near_finds_resized_and_reencoded_copies(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    originals = [_smooth(rng) for _ in range(12)]
    for k, image in enumerate(originals):
        (src / f"orig_{k:02d}.png").write_bytes(encode(image, ".png"))
    half = cv2.resize(originals[0], (96, 96), interpolation=cv2.INTER_AREA)
    (src / "z_half.png").write_bytes(encode(half, ".png"))
    _, jpeg = cv2.imencode(".jpg", originals[1], [cv2.IMWRITE_JPEG_QUALITY, 80])
    (src / "z_reencoded.jpg").write_bytes(jpeg.tobytes())
    out = build_packed(tmp_path / "src", tmp_path / "out.lmdb", "lmdb")

    exact_only = find_dupes([out])
    assert exact_only.groups == []
    report = find_dupes([out], near=True)
    found = sorted(sorted(m["path"] for m in g.members) for g in report.groups)
    assert found == [["a/orig_00.png", "a/z_half.png"], ["a/orig_01.png", "a/z_reencoded.jpg"]]
    assert {g.kind for g in report.groups} == {"near"}


def test_group_near_links_within_the_threshold_only() -> None:
    base = np.uint64(0xF0F0_1234_ABCD_0F0F)
    hashes = np.array(
        [base, base ^ np.uint64(0b1), base ^ np.uint64(0b1011 << 40), base ^ np.uint64(2**64 - 1)],
        dtype=np.uint64,
    )
    # 0 and 1 differ in 1 bit; 2 differs from 0 in 3 bits; 3 is every bit away
    assert [g.tolist() for g in group_near(hashes, 1)] == [[0, 1]]
    assert [g.tolist() for g in group_near(hashes, 3)] == [[0, 1, 2]]
    with pytest.raises(ValueError, match="threshold"):
        group_near(hashes, 4)


# ------------------------------------------------------------------------- build --dedup


def _dup_tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_tree(src, {"cat": 4, "dog": 5})
    shutil.copy(src / "dog/img_003.jpg", src / "cat/a_copy.jpg")  # sorts first: it is kept
    shutil.copy(src / "dog/img_003.jpg", src / "dog/z_copy.jpg")
    return src


@pytest.mark.parametrize("workers", [1, 3])
def test_build_dedup_skips_copies_as_duplicate_content(tmp_path: Path, workers: int) -> None:
    src = _dup_tree(tmp_path)
    out = tmp_path / "out.lmdb"
    result = runner.invoke(
        app,
        ["build", str(src), str(out), "--dedup", "--workers", str(workers), "--shard-size", "600"],
    )
    assert result.exit_code == 0, result.output
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["path"], e["reason"]) for e in errors] == [
        ("dog/img_003.jpg", "duplicate_content"),
        ("dog/z_copy.jpg", "duplicate_content"),
    ]
    assert all("cat/a_copy.jpg" in e["message"] for e in errors)
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert len(index) == 9  # 9 distinct images of 11 files
    assert find_dupes([out]).groups == []  # the shards hold no copy either
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_build_without_dedup_keeps_copies(tmp_path: Path) -> None:
    src = _dup_tree(tmp_path)
    out = build_packed(src, tmp_path / "out.lmdb", "lmdb")
    assert (out / "errors.jsonl").read_text() == ""
    assert len(find_dupes([out]).groups) == 1


def test_dupes_text_prints_labels_class_names_and_paths_escaped(tmp_path: Path) -> None:
    """Labels reached the terminal raw, so an ESC sequence in a label recoloured (or a CR
    overwrote) the report; they are shown escaped now, and --json stays valid JSON."""
    src = tmp_path / "src"
    write_tree(src, {"a": 2})
    shutil.copy(src / "a/img_000.png", src / "a/copy\x1b[2J.png")  # ESC in a path is allowed
    manifest = tmp_path / "labels.jsonl"
    labels = {"a/img_000.png": "\x1b[31mred", "a/img_001.jpg": "x", "a/copy\x1b[2J.png": "cr\r!"}
    manifest.write_text(
        "".join(json.dumps({"path": p, "label": v}) + "\n" for p, v in labels.items())
    )
    text_ds = build_packed(src, tmp_path / "text.lmdb", "lmdb", labels=str(manifest))
    class_ds = build_packed(src, tmp_path / "class.lmdb", "lmdb")
    meta = json.loads((class_ds / "meta.json").read_text())
    meta["classes"] = ["\x1b[32mgreen\r"]
    (class_ds / "meta.json").write_text(json.dumps(meta))
    result = runner.invoke(app, ["dupes", str(text_ds), str(class_ds)])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\r"):
        assert raw not in result.output
    assert 'label "\\u001b[31mred"' in result.output  # a text label is printed as JSON
    assert 'label "cr\\r!"' in result.output
    assert "label \\x1b[32mgreen\\r" in result.output
    assert "a/copy\\x1b[2J.png" in result.output
    as_json = runner.invoke(app, ["dupes", str(text_ds), str(class_ds), "--json"])
    assert as_json.exit_code == 0, as_json.output
    members = [m for g in json.loads(as_json.output)["groups"] for m in g["members"]]
    assert {m["label"] for m in members if "class" not in m} == {"\x1b[31mred", "x", "cr\r!"}
    assert {m["class"] for m in members if "class" in m} == {"\x1b[32mgreen\r"}
