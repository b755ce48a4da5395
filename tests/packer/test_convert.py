"""packer convert: every input kind, written by an independent writer, round-trips its bytes and
labels; exports read back with tarfile/webdataset and file by file; errors, resume, verify."""

from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from typer.testing import CliRunner

from packer import convert as convert_module
from packer.cli import app
from packer.convert import ConvertConfig, convert
from packer.verify import verify
from tests.conftest import encode, make_image

runner = CliRunner()


def _images(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        encode(make_image(rng, 8 + i, 6 + i % 3), ".png" if i % 2 else ".jpg") for i in range(n)
    ]


def _read_out(out: Path) -> list[tuple[bytes, Any, str]]:
    """(stored bytes, label, path) of every record of a packer dataset, from its index."""
    from readers.datasets import open_dataset

    ds = open_dataset(out, decode="bytes")
    rows = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    return [(ds[i][0], ds[i][1], rows[i]["path"]) for i in range(len(ds))]


def _check_verify(out: Path) -> None:
    assert verify(out, deep=True) == []


def write_scene_text_lmdb(root: Path, images: list[bytes], labels: list[str]) -> None:
    """The public scene-text layout, written with py-lmdb directly."""
    env = lmdb.open(str(root), map_size=1 << 26, subdir=True)
    with env.begin(write=True) as txn:
        for i, (data, label) in enumerate(zip(images, labels, strict=True), start=1):
            txn.put(b"image-%09d" % i, data)
            txn.put(b"label-%09d" % i, label.encode("utf-8"))
        txn.put(b"num-samples", str(len(images)).encode())
    env.close()


def _record(payload: bytes) -> bytes:
    """One dmlc RecordIO record: magic, length (cflag 0), payload, zero padding to 4 bytes."""
    return struct.pack("<II", 0xCED7230A, len(payload)) + payload + b"\0" * (-len(payload) % 4)


def write_mxnet_rec(
    prefix: Path, images: list[bytes], labels: list[float], *, insightface: bool
) -> None:
    """An MXNet .rec/.idx pair from the spec (IRHeader <IfQQ), optionally with InsightFace's
    header record (key 0: flag 2, labels (1 + images, end of identities), no image) and one
    identity record after the images."""
    rec, idx = bytearray(), []
    n = len(images)
    if insightface:
        idx.append((0, len(rec)))
        rec += _record(struct.pack("<IfQQ", 2, 0.0, 0, 0) + struct.pack("<ff", n + 1, n + 2))
    first = 1 if insightface else 0
    for j, (data, label) in enumerate(zip(images, labels, strict=True)):
        idx.append((first + j, len(rec)))
        rec += _record(struct.pack("<IfQQ", 0, label, first + j, 0) + data)
    if insightface:  # an identity record: flag 2, (start, end) of its images, no image
        idx.append((n + 1, len(rec)))
        rec += _record(struct.pack("<IfQQ", 2, 0.0, n + 1, 0) + struct.pack("<ff", 1, n + 1))
    prefix.with_suffix(".rec").write_bytes(bytes(rec))
    prefix.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in idx))


@pytest.mark.parametrize("to_format", ["lmdb", "recordio"])
def test_scene_text_lmdb_round_trips(tmp_path: Path, to_format: str) -> None:
    images = _images(7)
    labels = [f"word{i}" for i in range(6)] + ["007"]  # text stays text, leading zeros too
    write_scene_text_lmdb(tmp_path / "st", images, labels)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "st", out, format=to_format))
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got] == labels
    _check_verify(out)


@pytest.mark.parametrize("insightface", [False, True])
def test_mxnet_rec_round_trips(tmp_path: Path, insightface: bool) -> None:
    images = _images(5, seed=1)
    labels = [3.0, 1.0, 4.0, 1.0, 5.0]
    write_mxnet_rec(tmp_path / "train", images, labels, insightface=insightface)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "train.rec", out, format="lmdb"))
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got] == [3, 1, 4, 1, 5]  # integral float labels: class ids
    _check_verify(out)


def test_webdataset_tars_round_trip(tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    images = _images(6, seed=2)
    labels: list[Any] = [0, 1, "some text", {"box": [1, 2]}, 2, 0]
    shards = tmp_path / "wds"
    shards.mkdir()
    for n in range(2):
        with webdataset.TarWriter(str(shards / f"part-{n}.tar")) as sink:
            for i in range(3 * n, 3 * n + 3):
                sample: dict[str, Any] = {"__key__": f"s{i:04d}"}
                sample["png" if i % 2 else "jpg"] = images[i]
                label = labels[i]
                kind = (
                    "cls" if isinstance(label, int) else "txt" if isinstance(label, str) else "json"
                )
                sample[kind] = label if kind != "json" else json.dumps(label).encode()
                sink.write(sample)
    out = tmp_path / "out"
    convert(ConvertConfig(shards, out, format="recordio"))
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got] == labels
    _check_verify(out)


@pytest.mark.parametrize("to_format", ["lmdb", "recordio"])
def test_ours_round_trips(packed: Any, tmp_path: Path, to_format: str) -> None:
    out = tmp_path / "converted"
    convert(ConvertConfig(packed.path, out, format=to_format, shard_size=2000))
    got = _read_out(out)
    assert [g[2] for g in got] == sorted(packed.files)
    assert [g[0] for g in got] == [packed.files[p] for p in sorted(packed.files)]
    before = json.loads((packed.path / "meta.json").read_text())
    after = json.loads((out / "meta.json").read_text())
    assert after["classes"] == before["classes"]
    assert [g[1] for g in got] == [
        before["classes"].index(p.split("/")[0]) for p in sorted(packed.files)
    ]
    assert after["num_shards"] > 1
    _check_verify(out)


def test_non_image_record_is_an_error_with_reason(tmp_path: Path) -> None:
    images = _images(3)
    write_scene_text_lmdb(
        tmp_path / "st", [images[0], b"this is not an image", images[2]], ["a", "b", "c"]
    )
    out = tmp_path / "out"
    summary = convert(ConvertConfig(tmp_path / "st", out))
    assert summary.packed == 2
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert errors == [
        {"path": "image-000000002", "reason": "not_image", "message": errors[0]["message"]}
    ]
    assert [g[1] for g in _read_out(out)] == ["a", "c"]
    _check_verify(out)


def test_interrupted_convert_leaves_no_out_and_resume_finishes(
    packed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    whole = tmp_path / "whole"
    convert(ConvertConfig(packed.path, whole, shard_size=1500))
    real = convert_module.open_input
    calls = {"n": 0}

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        read = found.source.read_batches
        assert read is not None  # a packer dataset is copied a batch at a time

        def read_until_interrupt(start: int, stop: int) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt
            yield from read(start, stop)

        found.source.read_batches = read_until_interrupt
        return found

    monkeypatch.setattr(convert_module, "open_input", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(ConvertConfig(packed.path, out, shard_size=1500))
    assert not out.exists()
    assert (tmp_path / ".out.partial").is_dir()
    monkeypatch.setattr(convert_module, "open_input", real)
    summary = convert(ConvertConfig(packed.path, out, shard_size=1500, resume=True))
    assert summary.packed == len(packed.files)
    assert (out / "index.jsonl").read_bytes() == (whole / "index.jsonl").read_bytes()
    assert not (tmp_path / ".out.partial").exists()
    again = convert(ConvertConfig(packed.path, out, shard_size=1500, resume=True))
    assert again.already_complete
    _check_verify(out)


def test_to_webdataset_reads_back(packed: Any, tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    out = tmp_path / "wds"
    result = runner.invoke(app, ["convert", str(packed.path), str(out), "--to", "webdataset"])
    assert result.exit_code == 0, result.output
    tars = sorted(str(p) for p in out.glob("*.tar"))
    assert f"exported {len(packed.files)} images" in result.output
    assert f"into {len(tars)} tar shard" in result.output
    samples = list(webdataset.WebDataset(tars, shardshuffle=False))
    names = sorted(packed.files)
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(len(names))]
    for s, name in zip(samples, names, strict=True):
        ext = "png" if name.endswith(".png") else "jpg"
        assert s[ext] == packed.files[name]
        assert int(s["cls"]) == sorted({n.split("/")[0] for n in names}).index(name.split("/")[0])
    with tarfile.open(tars[0]) as tar:
        assert tar.getnames()[:2] == ["000000.png", "000000.cls"]
    back = tmp_path / "back"
    convert(ConvertConfig(out, back))  # and our own reader of tars agrees
    assert [g[0] for g in _read_out(back)] == [packed.files[n] for n in names]


def test_to_folder_class_folders_file_by_file(packed: Any, tmp_path: Path) -> None:
    out = tmp_path / "folder"
    summary = convert(ConvertConfig(packed.path, out, to="folder"))
    assert summary.line().startswith(f"exported {len(packed.files)} images (")
    assert " as image files, skipped 0, " in summary.line()
    written = {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and p.name not in ("errors.jsonl", "warnings.jsonl", ".packer-export.json")
    }
    assert written == packed.files  # the original tree: class folders, file names, bytes
    assert (out / "warnings.jsonl").read_text() == ""  # nothing renamed


def test_to_folder_text_labels_list(tmp_path: Path) -> None:
    images = _images(3)
    write_scene_text_lmdb(tmp_path / "st", images, ["hello", "wor ld", "x"])
    out = tmp_path / "folder"
    convert(ConvertConfig(tmp_path / "st", out, to="folder"))
    lines = (out / "labels.txt").read_text().splitlines()
    assert [line.split("\t")[1] for line in lines] == ["hello", "wor ld", "x"]
    for line, data in zip(lines, images, strict=True):
        assert (out / line.split("\t")[0]).read_bytes() == data


def test_open_dataset_reads_webdataset_tars(tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    from readers.datasets import open_dataset

    images = _images(4)
    (tmp_path / "wds").mkdir()
    with webdataset.TarWriter(str(tmp_path / "wds" / "a.tar")) as sink:
        for i, data in enumerate(images):
            sink.write({"__key__": f"k{i}", "png" if i % 2 else "jpg": data, "cls": i})
    ds = open_dataset(tmp_path / "wds", decode="bytes")
    assert [ds[i] for i in range(len(ds))] == [(d, i) for i, d in enumerate(images)]
    image, label = open_dataset(tmp_path / "wds")[1]
    assert image.shape == (7, 9, 3)
    assert label == 1


@pytest.mark.parametrize("to_format", ["lmdb", "recordio"])
def test_compressed_raw_pixels_keep_their_compression(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str, to_format: str
) -> None:
    """The index's ``compression`` goes with the compressed bytes (else they do not decode)."""
    from packer.transform import Transform
    from readers.datasets import open_dataset
    from tests.conftest import build_packed

    src, _ = tree
    raw = build_packed(
        src, tmp_path / "raw", fmt, transform=Transform(encode="raw", compress="lz4")
    )
    out = tmp_path / "out"
    convert(ConvertConfig(raw, out, format=to_format, shard_size=600))
    before = [json.loads(line) for line in (raw / "index.jsonl").read_text().splitlines()]
    after = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [r.get("compression") for r in after] == ["lz4"] * len(before)
    old, new = open_dataset(raw), open_dataset(out)
    for i in range(len(old)):
        assert np.array_equal(old[i][0], new[i][0])
        assert old[i][1] == new[i][1]
    _check_verify(out)


def test_damaged_record_is_a_crc_mismatch_and_the_rest_are_kept(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """A record whose stored bytes differ from the index's CRC-32, amid a batch, is an error;
    the records around it are copied."""
    from tests.conftest import build_packed

    src, files = tree
    packed = build_packed(src, tmp_path / "in", "recordio")
    rows = [json.loads(line) for line in (packed / "index.jsonl").read_text().splitlines()]
    bad = rows[4]
    rec = packed / "shard-00000.rec"
    raw = bytearray(rec.read_bytes())
    raw[int(bad["offset"]) + 8 + 24 + 3] ^= 0xFF  # a byte of its image, past the headers
    rec.write_bytes(bytes(raw))
    out = tmp_path / "out"
    summary = convert(ConvertConfig(packed, out, format="lmdb"))
    assert summary.packed == len(rows) - 1
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["path"], e["reason"]) for e in errors] == [(bad["path"], "crc_mismatch")]
    got = _read_out(out)
    kept = [r["path"] for r in rows if r["id"] != 4]
    assert [g[2] for g in got] == kept
    assert [g[0] for g in got] == [files[p] for p in kept]
    _check_verify(out)
