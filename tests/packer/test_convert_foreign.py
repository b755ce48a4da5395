"""packer convert of inputs written by other tools: nothing is lost or altered unreported.

Bare LMDB labels that are not UTF-8 or missing, a ``num-samples`` beyond what the LMDB holds,
WebDataset tars with damaged headers, links and extra members, InsightFace ``.rec`` files with
images outside the header's range, and NaN/Infinity labels: every record that is not converted
is in ``errors.jsonl`` with its reason, and every label written is JSON.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.convert import ConvertConfig, convert
from packer.verify import verify
from tests.packer.test_convert import _images, _read_out, _record, write_mxnet_rec

runner = CliRunner()


def _errors(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def _index(out: Path) -> list[dict[str, Any]]:
    # json.loads with parse_constant refusing NaN/Infinity: the index must be strict JSON
    def refuse(name: str) -> Any:
        raise AssertionError(f"index.jsonl holds {name}")

    text = (out / "index.jsonl").read_text()
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def _write_lmdb(root: Path, pairs: list[tuple[bytes, bytes | None]], *, count: int | None = None):
    """A PaddleOCR-layout LMDB from raw label bytes (None: no label key), by py-lmdb."""
    env = lmdb.open(str(root), map_size=1 << 26, subdir=True)
    with env.begin(write=True) as txn:
        for i, (data, label) in enumerate(pairs, start=1):
            txn.put(b"image-%09d" % i, data)
            if label is not None:
                txn.put(b"label-%09d" % i, label)
        txn.put(b"num-samples", str(len(pairs) if count is None else count).encode())
    env.close()


# ----------------------------------------------------------------------- item 6: LMDB labels


def test_lmdb_labels_that_are_not_utf8_are_bad_label_never_replaced(tmp_path: Path) -> None:
    images = _images(5)
    labels = ["你好".encode("gbk"), "再见".encode("gbk"), "café".encode("latin-1"), b"ok", None]
    _write_lmdb(
        tmp_path / "st", [(images[0], "中文".encode()), *zip(images[1:], labels[:4], strict=True)]
    )
    _write_lmdb(tmp_path / "st2", [(images[0], b"a"), (images[1], labels[0]), (images[2], None)])
    out = tmp_path / "out"
    summary = convert(ConvertConfig(tmp_path / "st", out))
    assert summary.packed == 2
    assert [g[1] for g in _read_out(out)] == ["中文", "ok"]
    errors = _errors(out)
    assert [(e["path"], e["reason"]) for e in errors] == [
        ("image-000000002", "bad_label"),
        ("image-000000003", "bad_label"),
        ("image-000000004", "bad_label"),
    ]
    assert "label-000000002 is not UTF-8 text" in errors[0]["message"]
    assert repr("你好".encode("gbk")) in errors[0]["message"]  # the bytes, escaped
    assert repr("café".encode("latin-1")) in errors[2]["message"]
    assert "\ufffd" not in (out / "index.jsonl").read_text()
    assert verify(out, deep=True) == []

    out2 = tmp_path / "out2"
    convert(ConvertConfig(tmp_path / "st2", out2))
    assert [(e["path"], e["reason"]) for e in _errors(out2)] == [
        ("image-000000002", "bad_label"),
        ("image-000000003", "no_label"),
    ]
    assert "no label-000000003 key" in _errors(out2)[1]["message"]


def test_lmdb_without_any_label_key_converts_with_null_labels(tmp_path: Path) -> None:
    images = _images(2)
    _write_lmdb(tmp_path / "st", [(images[0], None), (images[1], None)])
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "st", out))
    assert [g[1] for g in _read_out(out)] == [None, None]
    assert _errors(out) == []
    assert json.loads((out / "meta.json").read_text())["label_source"] == "none"


def test_lmdb_bad_label_with_on_error_fail_exits_2(tmp_path: Path) -> None:
    images = _images(2)
    _write_lmdb(tmp_path / "st", [(images[0], b"a"), (images[1], b"\xff\xfe")])
    result = runner.invoke(
        app, ["convert", str(tmp_path / "st"), str(tmp_path / "out"), "--on-error", "fail"]
    )
    assert result.exit_code == 2
    assert (
        "packer: error: image-000000002: label-000000002 is not UTF-8 text (invalid start byte "
        "at byte 0): b'\\xff\\xfe'; re-encode the labels as UTF-8"
    ) in result.output
    assert "[bad_label]" in result.output
    assert not (tmp_path / "out").exists()


def test_lmdb_image_keys_past_num_samples_are_reported(tmp_path: Path) -> None:
    images = _images(4)
    _write_lmdb(tmp_path / "st", [(d, b"x") for d in images], count=2)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "st", out))
    assert len(_read_out(out)) == 2
    assert [(e["path"], e["reason"]) for e in _errors(out)] == [
        ("image-000000003", "extra_member"),
        ("image-000000004", "extra_member"),
    ]


# ------------------------------------------------------------- item 13: num-samples too large


def test_lmdb_num_samples_beyond_its_entries_fails_at_once(tmp_path: Path) -> None:
    images = _images(3)
    _write_lmdb(tmp_path / "st", [(d, b"x") for d in images], count=10**9)
    started = time.monotonic()
    result = runner.invoke(app, ["convert", str(tmp_path / "st"), str(tmp_path / "out")])
    assert time.monotonic() - started < 10
    assert result.exit_code == 2
    assert "'num-samples' says 1000000000 samples, but the LMDB holds only 7 keys" in (
        result.output
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------ item 8: InsightFace header's range


def _write_rec(prefix: Path, records: list[tuple[int, int, Any, bytes]]) -> None:
    """A .rec/.idx pair from (key, flag, label or labels, image) by the dmlc/MXNet spec."""
    rec, idx = bytearray(), []
    for key, flag, label, image in records:
        idx.append((key, len(rec)))
        if flag:
            head = struct.pack("<IfQQ", flag, 0.0, key, 0) + struct.pack(f"<{flag}f", *label)
        else:
            head = struct.pack("<IfQQ", 0, label, key, 0)
        rec += _record(head + image)
    prefix.with_suffix(".rec").write_bytes(bytes(rec))
    prefix.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in idx))


@pytest.mark.parametrize("with_idx", [True, False])
def test_images_outside_the_insightface_header_range_are_converted(
    tmp_path: Path, with_idx: bool
) -> None:
    images = _images(6, seed=3)
    # the meta record names images 1..3 (label[0] = 4) and identities up to key 5; keys 4 and
    # 5 are identity records, keys 6..8 images beyond the range, key 9 a record with nothing
    records = [(0, 2, [4.0, 6.0], b"")]
    records += [(k, 0, float(k % 2), images[k - 1]) for k in (1, 2, 3)]
    records += [(4, 2, [1.0, 3.0], b""), (5, 2, [3.0, 4.0], b"")]
    records += [(k, 0, float(k), images[k - 3]) for k in (6, 7, 8)]
    records += [(9, 0, 1.0, b"")]
    _write_rec(tmp_path / "train", records)
    if not with_idx:  # the whole .rec is scanned: the same samples, in file order
        (tmp_path / "train.idx").unlink()
    out = tmp_path / "out"
    summary = convert(ConvertConfig(tmp_path / "train.rec", out))
    got = _read_out(out)
    assert [g[2] for g in got] == [f"train.rec:{k}" for k in (1, 2, 3, 6, 7, 8)]
    assert [g[0] for g in got] == images[:3] + images[3:6]
    assert [g[1] for g in got] == [1, 0, 1, 6, 7, 8]
    assert summary.packed == 6
    assert [(e["path"], e["reason"]) for e in _errors(out)] == [("train.rec:9", "empty")]
    assert verify(out, deep=True) == []


def test_rec_round_trip_with_insightface_header_unchanged(tmp_path: Path) -> None:
    images = _images(3, seed=1)
    write_mxnet_rec(tmp_path / "train", images, [3.0, 1.0, 4.0], insightface=True)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "train.rec", out))
    assert [g[1] for g in _read_out(out)] == [3, 1, 4]  # the identity record is metadata
    assert _errors(out) == []


# ------------------------------------------------------------- item 11: NaN and Infinity


def test_rec_nan_and_infinite_header_labels_are_bad_label(tmp_path: Path) -> None:
    images = _images(5, seed=4)
    labels: list[Any] = [1.0, float("nan"), 2.0, float("inf"), [1.0, float("-inf")]]
    records = [
        (k, 2 if isinstance(lab, list) else 0, lab, images[k]) for k, lab in enumerate(labels)
    ]
    _write_rec(tmp_path / "train", records)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "train.rec", out, format="recordio"))
    assert [row["label"] for row in _index(out)] == [1.0, 2.0]
    errors = _errors(out)
    assert [(e["path"], e["reason"]) for e in errors] == [
        ("train.rec:1", "bad_label"),
        ("train.rec:3", "bad_label"),
        ("train.rec:4", "bad_label"),
    ]
    assert all("not a finite number" in e["message"] for e in errors)


def test_build_refuses_a_nan_sidecar_label_as_bad_label(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, data in enumerate(_images(3, seed=5)):
        (src / f"a{i}.png").write_bytes(data)
    (src / "a0.json").write_text('{"score": 0.5}')
    (src / "a1.json").write_text('{"score": NaN}')
    (src / "a2.json").write_text("[1, Infinity]")
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", str(src), str(out), "--labels", "sidecar"])
    assert result.exit_code == 0, result.output
    assert [row["label"] for row in _index(out)] == [{"score": 0.5}]
    errors = _errors(out)
    assert [(e["path"], e["reason"]) for e in errors] == [
        ("a1.png", "bad_label"),
        ("a2.png", "bad_label"),
    ]
    assert all("not a finite number" in e["message"] for e in errors)


def test_index_rows_never_hold_nan() -> None:
    from packer.writers.part import label_text

    assert label_text([1.5, 2.0])[0] == "[1.5,2.0]"
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        label_text({"x": float("nan")})


# --------------------------------------------------------------- item 7: WebDataset tars


def _tar(path: Path, members: list[tuple[str, Any]]) -> dict[str, tarfile.TarInfo]:
    """A tar by Python's tarfile: (name, bytes) regular members, (name, ("sym"|"hard", target))
    links; returns the members' headers by name (their offsets)."""
    with tarfile.open(path, "w") as tar:
        for name, value in members:
            info = tarfile.TarInfo(name)
            if isinstance(value, tuple):
                info.type = tarfile.SYMTYPE if value[0] == "sym" else tarfile.LNKTYPE
                info.linkname = value[1]
                tar.addfile(info)
            else:
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def _labelled(images: list[bytes], first: int = 0) -> list[tuple[str, Any]]:
    members: list[tuple[str, Any]] = []
    for i, data in enumerate(images, start=first):
        members += [(f"s{i:03d}.png", data), (f"s{i:03d}.cls", str(i).encode())]
    return members


def _pngs(n: int, seed: int = 7) -> list[bytes]:
    from tests.conftest import encode, make_image

    rng = np.random.default_rng(seed)
    return [encode(make_image(rng, 8 + i, 6), ".png") for i in range(n)]


def test_damaged_tar_header_mid_shard_keeps_the_rest_and_reports(tmp_path: Path) -> None:
    images = _pngs(5)
    (tmp_path / "wds").mkdir()
    tar = tmp_path / "wds" / "a.tar"
    headers = _tar(tar, _labelled(images))
    data = bytearray(tar.read_bytes())
    at = headers["s001.png"].offset  # its header block: name and checksum made garbage
    data[at : at + 100] = b"\xa5" * 100
    tar.write_bytes(bytes(data))
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(tmp_path / "wds"), str(out)])
    assert result.exit_code == 0, result.output
    got = _read_out(out)
    assert [g[2] for g in got] == [
        "a.tar/s000.png",
        "a.tar/s002.png",
        "a.tar/s003.png",
        "a.tar/s004.png",
    ]
    assert [g[0] for g in got] == [images[0], *images[2:]]
    assert [g[1] for g in got] == [0, 2, 3, 4]
    errors = {(e["path"], e["reason"]): e["message"] for e in _errors(out)}
    assert set(errors) == {("a.tar", "damaged"), ("a.tar/s001", "not_image")}
    assert f"bytes {at}..{headers['s001.cls'].offset}" in errors["a.tar", "damaged"]
    assert "skipped 2" in result.output
    result = runner.invoke(
        app, ["convert", str(tmp_path / "wds"), str(tmp_path / "o2"), "--on-error", "fail"]
    )
    assert result.exit_code == 2
    assert "packer: error: a.tar: bytes 2048..3072 (1024 bytes) are not tar headers" in (
        result.output
    )
    assert "[damaged]" in result.output
    assert not (tmp_path / "o2").exists()
    for to in ("webdataset", "folder"):  # an export stops on it as well
        args = [str(tmp_path / "wds"), str(tmp_path / to), "--to", to, "--on-error", "fail"]
        result = runner.invoke(app, ["convert", *args])
        assert result.exit_code == 2
        assert "[damaged]" in result.output
        assert not (tmp_path / to).exists()


@pytest.mark.parametrize("cut", ["mid_member", "at_boundary"])
def test_tar_that_ends_early_is_truncated(tmp_path: Path, cut: str) -> None:
    images = _pngs(3)
    (tmp_path / "wds").mkdir()
    tar = tmp_path / "wds" / "a.tar"
    headers = _tar(tar, _labelled(images))
    end = headers["s002.png"].offset_data + (100 if cut == "mid_member" else 0)
    tar.write_bytes(tar.read_bytes()[:end])
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "wds", out))
    assert [g[1] for g in _read_out(out)] == [0, 1]
    reasons = sorted((e["path"], e["reason"]) for e in _errors(out))
    assert ("a.tar", "truncated") in reasons
    assert ("a.tar/s002.png", "truncated") in reasons


def test_tar_cut_at_a_member_boundary_without_end_blocks(tmp_path: Path) -> None:
    images = _pngs(2)
    (tmp_path / "wds").mkdir()
    tar = tmp_path / "wds" / "a.tar"
    headers = _tar(tar, _labelled(images))
    tar.write_bytes(tar.read_bytes()[: headers["s001.png"].offset])
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "wds", out))
    assert [g[1] for g in _read_out(out)] == [0]
    [error] = _errors(out)
    assert (error["path"], error["reason"]) == ("a.tar", "truncated")
    assert "without the two zero blocks" in error["message"]


def test_tar_members_links_extras_and_missing_labels(tmp_path: Path) -> None:
    images = _pngs(6)
    (tmp_path / "wds").mkdir()
    members: list[tuple[str, Any]] = [
        ("s000.png", images[0]), ("s000.cls", b"0"),
        ("s001.png", images[1]), ("s001.jpg", images[2]), ("s001.cls", b"1"),
        ("s001.txt", b"caption"),
        ("s002.png", ("sym", "s000.png")), ("s002.cls", b"2"),
        ("d/s003.png", ("hard", "s001.png")), ("d/s003.cls", b"3"),
        ("s004.png", ("sym", "nowhere.png")), ("s004.cls", b"4"),
        ("s005.png", ("sym", "../../etc/passwd")), ("s005.cls", b"5"),
        ("s006.png", images[3]),
        ("s007.png", images[4]), ("s007.json", b'{"box": [1, NaN]}'),
        ("s008.png", images[5]), ("s008.json", b'{"box": [1, 2]}'),
    ]  # fmt: skip
    _tar(tmp_path / "wds" / "a.tar", members)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "wds", out))
    got = _read_out(out)
    assert [(g[2], g[1]) for g in got] == [
        ("a.tar/s000.png", 0),
        ("a.tar/s001.png", 1),
        ("a.tar/s002.png", 2),
        ("a.tar/d/s003.png", 3),
        ("a.tar/s008.png", {"box": [1, 2]}),
    ]
    assert [g[0] for g in got] == [images[0], images[1], images[0], images[1], images[5]]
    errors = sorted((e["path"], e["reason"]) for e in _errors(out))
    assert errors == [
        ("a.tar/s001.jpg", "extra_member"),
        ("a.tar/s001.txt", "extra_member"),
        ("a.tar/s004", "not_image"),
        ("a.tar/s004.png", "broken_link"),
        ("a.tar/s005", "not_image"),
        ("a.tar/s005.png", "outside_src"),
        ("a.tar/s006.png", "no_label"),
        ("a.tar/s007.png", "bad_label"),
    ]
    messages = {e["path"]: e["message"] for e in _errors(out)}
    assert "NaN is not a finite number" in messages["a.tar/s007.png"]
    assert "a second image of sample s001" in messages["a.tar/s001.jpg"]
    assert "a link to 'nowhere.png', which is no file of the tar" in messages["a.tar/s004.png"]
    assert verify(out, deep=True) == []


def test_tars_without_any_label_convert_with_null_labels(tmp_path: Path) -> None:
    images = _pngs(2)
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "a.tar", [("a.png", images[0]), ("b.png", images[1])])
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "wds", out))
    assert [g[1] for g in _read_out(out)] == [None, None]
    assert _errors(out) == []


def test_open_dataset_reads_the_members_after_a_damaged_header(tmp_path: Path) -> None:
    from readers.datasets import open_dataset

    images = _pngs(4)
    (tmp_path / "wds").mkdir()
    tar = tmp_path / "wds" / "a.tar"
    headers = _tar(tar, [(f"s{i}.png", d) for i, d in enumerate(images)])
    data = bytearray(tar.read_bytes())
    data[headers["s1.png"].offset : headers["s1.png"].offset + 100] = b"\xa5" * 100
    tar.write_bytes(bytes(data))
    ds = open_dataset(tmp_path / "wds", decode="bytes")
    assert [ds[i][0] for i in range(len(ds))] == [images[0], images[2], images[3]]
