"""packer build --format recordio: the bytes on disk against the MXNet specification, labels,
sharding, too-large images, atomicity; packer verify on packed and bare RecordIO."""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from packer.build import build, temp_dir_for
from packer.cli import app
from packer.config import BuildConfig
from packer.errors import DiskFullError, InputError
from packer.prepare import prepare_record
from packer.verify import verify
from packer.writers import ShardPart, merge_parts
from packer.writers import recordio as wr
from packer.writers.recordio import RecordIOShardWriter, RecordTooLargeForShardError
from readers.formats.recordio import header_label
from readers.io import handles
from tests.conftest import write_tree
from tests.readers.test_recordio_dataset import (
    MAGIC,
    MAGIC_BYTES,
    image_payload,
    insightface_records,
    png_images,
    record,
    write_pair,
)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def parse_rec(blob: bytes) -> list[tuple[int, bytes]]:
    """(offset, payload) of every record, following the specification with struct alone."""
    records = []
    pos = 0
    while pos < len(blob):
        start, parts = pos, []
        while True:
            magic, lrec = struct.unpack_from("<II", blob, pos)
            assert magic == MAGIC
            cflag, length = lrec >> 29, lrec & (2**29 - 1)
            parts.append(blob[pos + 8 : pos + 8 + length])
            pad = -length % 4
            assert blob[pos + 8 + length : pos + 8 + length + pad] == b"\0" * pad
            pos += 8 + length + pad
            if cflag in (0, 3):
                break
        records.append((start, MAGIC_BYTES.join(parts)))
    return records


@pytest.fixture
def packed(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.rec"
    build(BuildConfig(src=src, out=out, format="recordio"))
    return out, files


def test_layout_matches_the_specification(packed):
    out, files = packed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "recordio"
    assert meta["num_samples"] == len(files)
    assert meta["writer"]["idx_key"] == "global sample id"
    (shard,) = meta["shards"]
    assert shard["name"] == "shard-00000"
    assert shard["first"] == 0
    rec, idx = out / "shard-00000.rec", out / "shard-00000.idx"
    assert shard["file_bytes"] == rec.stat().st_size + idx.stat().st_size
    assert shard["bytes"] == sum(len(v) for v in files.values())
    records = parse_rec(rec.read_bytes())
    index = rows(out)
    assert idx.read_text() == "".join(f"{r['id']}\t{r['offset']}\n" for r in index)
    assert [off for off, _ in records] == [r["offset"] for r in index]
    for row, (_, payload) in zip(index, records, strict=True):
        data = files[row["path"]]
        assert row["key"] == str(row["id"])
        assert payload == struct.pack("<IfQQ", 0, float(row["label"]), row["id"], 0) + data
        assert row["nbytes"] == len(data)
        assert row["crc32"] == zlib.crc32(data)
    assert (out / "errors.jsonl").read_text() == ""
    assert not temp_dir_for(out).exists()


def test_shards_roll_over_and_idx_keys_are_global_ids(tmp_path):
    src = tmp_path / "src"
    files = write_tree(src, {"a": 10, "b": 10})
    out = tmp_path / "out"
    build(
        BuildConfig(
            src=src, out=out, format="recordio", shard_size=sum(map(len, files.values())) // 4
        )
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_shards"] >= 4
    index = rows(out)
    for n, shard in enumerate(meta["shards"]):
        lines = (out / f"{shard['name']}.idx").read_text().splitlines()
        keys = [int(line.split("\t")[0]) for line in lines]
        assert keys == list(range(shard["first"], shard["first"] + shard["count"]))
        records = parse_rec((out / f"{shard['name']}.rec").read_bytes())
        assert records[0][0] == 0
        for (offset, payload), key in zip(records, keys, strict=True):
            row = index[key]
            assert row["shard"] == n
            assert row["offset"] == offset
            assert struct.unpack_from("<Q", payload, 8)[0] == key  # IRHeader.id
            assert payload[24:] == files[row["path"]]
    assert verify(out, deep=True) == []


@pytest.mark.parametrize(
    ("label", "flag", "values"),
    [
        (3, 0, [3.0]),
        (0.25, 0, [0.25]),
        ([1, 2.5, -4], 3, [1.0, 2.5, -4.0]),
        ("hello", 0, [0.0]),
        ({"box": [1, 2]}, 0, [0.0]),
        (None, 0, [0.0]),
        (True, 0, [0.0]),
        ([], 0, [0.0]),
        (["a", 1], 0, [0.0]),
        (1e39, 0, [0.0]),
    ],
)
def test_label_mapping_into_the_header(tree, tmp_path, label, flag, values):
    src, files = tree
    rel = sorted(files)[0]
    base = prepare_record(rel, str(src / rel), None)
    assert not isinstance(base, type(None))
    root = tmp_path / "w"
    root.mkdir()
    part = ShardPart(root, 0, RecordIOShardWriter, first_id=0)
    part.add(replace(base, label=label))
    part.finish([])
    merge_parts(root, [0])
    ((_, payload),) = parse_rec((root / "shard-00000.rec").read_bytes())
    got_flag, got_label, got_id, _ = struct.unpack_from("<IfQQ", payload)
    assert got_flag == flag
    assert got_id == 0
    if flag:
        assert got_label == 0.0
        assert list(struct.unpack_from(f"<{flag}f", payload, 24)) == values
        assert payload[24 + 4 * flag :] == files[rel]
    else:
        assert [got_label] == values
        assert payload[24:] == files[rel]
    assert json.loads((root / "index.jsonl").read_text())["label"] == label


def test_header_label_rules():
    assert header_label(7) == 7.0
    assert isinstance(header_label(7), float)
    assert header_label([1, 2]) == [1.0, 2.0]
    assert header_label(False) is None
    assert header_label("7") is None
    assert header_label([1, None]) is None


def test_text_labels_live_in_the_index_and_verify(tree, tmp_path):
    src, _ = tree
    listing = tmp_path / "list.txt"
    listing.write_text("cat/img_000.png\thello world\ndog/img_001.jpg\t7\n")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, format="recordio", labels=str(listing)))
    payloads = [p for _, p in parse_rec((out / "shard-00000.rec").read_bytes())]
    assert struct.unpack_from("<If", payloads[0]) == (0, 0.0)
    assert struct.unpack_from("<If", payloads[1]) == (0, 7.0)
    assert [r["label"] for r in rows(out)] == ["hello world", 7]
    assert verify(out) == []


def test_too_large_images_are_skipped_or_stop_the_build(tree, tmp_path, monkeypatch):
    src, files = tree
    limit = 500
    monkeypatch.setattr(wr, "MAX_PAYLOAD", limit)
    big = sorted(p for p, d in files.items() if 24 + len(d) > limit)
    assert big
    assert len(big) < len(files)
    out = tmp_path / "out"
    summary = build(BuildConfig(src=src, out=out, format="recordio"))
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["path"] for e in errors) == big
    assert {e["reason"] for e in errors} == {"too_large"}
    assert "at most 500 bytes" in errors[0]["message"]
    assert summary.packed == len(files) - len(big)
    assert summary.reasons == {"too_large": len(big)}
    assert verify(out) == []
    with pytest.raises(InputError, match=r"\[too_large\]"):
        build(BuildConfig(src=src, out=tmp_path / "fail", format="recordio", on_error="fail"))
    assert not (tmp_path / "fail").exists()
    # the shard writer refuses on its own too, naming the file
    record = prepare_record(big[0], str(src / big[0]), 0)
    shard = RecordIOShardWriter(tmp_path / "shard-00000")
    with pytest.raises(RecordTooLargeForShardError, match=rf"{big[0]}: .*shard-00000\.rec"):
        shard.write(1, 0, record)  # type: ignore[arg-type]
    shard.abort()


def test_failure_mid_build_leaves_no_out(tree, tmp_path, monkeypatch):
    src, _ = tree
    out = tmp_path / "out"
    calls = {"n": 0}
    original = RecordIOShardWriter.write

    def failing(self, local, sample_id, record):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return original(self, local, sample_id, record)

    monkeypatch.setattr(RecordIOShardWriter, "write", failing)
    with pytest.raises(DiskFullError, match="No space left on device"):
        build(BuildConfig(src=src, out=out, format="recordio"))
    assert not out.exists()
    # what was finished stays hidden for --resume; the unfinished shard is rewritten then
    assert temp_dir_for(out).exists()
    monkeypatch.setattr(RecordIOShardWriter, "write", original)
    build(BuildConfig(src=src, out=out, format="recordio", resume=True))
    assert verify(out) == []
    assert not temp_dir_for(out).exists()


# --------------------------------------------------------------------------------------------
# verify


def damage(path: Path, fn) -> None:
    handles.close_all()
    blob = bytearray(path.read_bytes())
    path.write_bytes(bytes(fn(blob)))


def test_verify_intact_passes(packed):
    out, _ = packed
    assert verify(out) == []
    assert verify(out, deep=True) == []


def test_verify_truncated_rec(packed):
    out, _files = packed
    rec = out / "shard-00000.rec"
    last = rows(out)[-1]
    damage(rec, lambda b: b[: last["offset"] + 20])
    problems = verify(out)
    assert any(
        p.startswith(
            f"shard-00000 sample {last['id']} (key {last['id']}, {last['path']}): "
            "truncated RecordIO record"
        )
        for p in problems
    ), problems


def test_verify_rec_cut_at_a_record_boundary(packed):
    out, _files = packed
    rec = out / "shard-00000.rec"
    index = rows(out)
    damage(rec, lambda b: b[: index[-3]["offset"]])
    problems = verify(out)
    assert f"samples {index[-3]['id']}..{index[-1]['id']} are missing (the file is cut short)" in (
        "\n".join(problems)
    )
    assert any(p.startswith(f"shard-00000 sample {index[-3]['id']} ") for p in problems)


def test_verify_wrong_idx_offset(packed):
    out, _ = packed
    idx = out / "shard-00000.idx"
    lines = idx.read_text().splitlines()
    key, offset = lines[4].split("\t")
    lines[4] = f"{key}\t{int(offset) + 4}"
    idx.write_text("\n".join(lines) + "\n")
    problems = verify(out)
    assert any(
        p.startswith("shard-00000 sample 4 ")
        and f"shard-00000.idx gives offset {int(offset) + 4}, but the record starts at {offset}"
        in p
        for p in problems
    ), problems


def test_verify_flipped_byte_in_image_and_in_header(packed):
    out, files = packed
    rec = out / "shard-00000.rec"
    index = rows(out)
    target = index[6]
    data = files[target["path"]]
    at = rec.read_bytes().find(data)

    def flip_image(b):
        b[at + len(data) // 3] ^= 0x01
        return b

    damage(rec, flip_image)
    problems = verify(out)
    assert len(problems) == 1
    assert problems[0].startswith(f"shard-00000 sample 6 (key 6, {target['path']}): CRC-32")
    damage(rec, flip_image)  # undo
    assert verify(out) == []

    def flip_label(b):
        b[index[2]["offset"] + 8 + 7] ^= 0x40  # the top byte of IRHeader.label of sample 2
        return b

    damage(rec, flip_label)
    (problem,) = verify(out)
    assert problem.startswith("shard-00000 sample 2 ")
    assert "header has flag 0, label" in problem
    assert "the index label means flag 0, label 0.0" in (problem)


def test_verify_bad_magic_then_goes_on(packed):
    out, _ = packed
    index = rows(out)

    def flip_magic(b):
        b[index[3]["offset"]] ^= 0xFF
        return b

    damage(out / "shard-00000.rec", flip_magic)
    problems = verify(out)
    assert len(problems) == 1
    assert problems[0].startswith("shard-00000 sample 3 ")
    assert "bad RecordIO magic" in problems[0]


def test_verify_missing_shard_file(packed):
    out, _ = packed
    (out / "shard-00000.idx").unlink()
    problems = verify(out)
    assert problems[0].startswith("shard-00000.idx: cannot read")


def test_cli_verify_exit_codes(packed):
    out, files = packed
    runner = CliRunner()
    result = runner.invoke(app, ["verify", str(out), "--deep"])
    assert result.exit_code == 0, result.output
    assert "OK (deep)" in result.output
    info = runner.invoke(app, ["info", str(out)])
    assert info.exit_code == 0
    assert "recordio dataset, 11 samples in 1 shard" in info.output
    rec = out / "shard-00000.rec"
    damage(rec, lambda b: b[:-10])
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert f"shard-00000 sample {len(files) - 1} " in result.output


def test_cli_build_recordio(tree, tmp_path):
    src, files = tree
    out = tmp_path / "cli.rec"
    result = CliRunner().invoke(
        app, ["build", str(src), str(out), "--format", "recordio", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert f"packed {len(files)} images" in result.output
    assert (out / "shard-00000.rec").is_file()


# --------------------------------------------------------------------------------------------
# verify on bare .rec/.idx pairs (written by hand from the specification)


def test_verify_bare_pair(tmp_path):
    images = png_images(3, seed=9)
    write_pair(tmp_path / "train", insightface_records(images, meta_first=False))
    for path in (tmp_path / "train.rec", tmp_path / "train", tmp_path / "train.idx"):
        assert verify(path) == []
        assert verify(path, deep=True) == []


def test_verify_bare_pair_problems(tmp_path):
    images = png_images(3)
    recs = [(k, record(image_payload(p, 1.0, k))) for k, (_, p) in enumerate(images)]
    recs.append((3, record(image_payload(b"not an image", 1.0, 3))))
    offsets = write_pair(tmp_path / "x", recs)
    assert verify(tmp_path / "x.rec") == []
    assert verify(tmp_path / "x.rec", deep=True) == [
        f"x.rec record 3 (offset {offsets[3]}, key 3): does not decode"
    ]
    (tmp_path / "x.idx").write_text(
        "".join(
            f"{k}\t{o + (2 if k == 1 else 0)}\n" for (k, _), o in zip(recs, offsets, strict=True)
        )
    )
    assert verify(tmp_path / "x.rec") == [
        f"x.idx: key 1 gives offset {offsets[1] + 2}, which is not the start of a record in x.rec",
        "x.idx: 1 of the 4 records of x.rec have no line",
    ]
    blob = (tmp_path / "x.rec").read_bytes()
    (tmp_path / "x.rec").write_bytes(blob[: offsets[2] + 30])
    (tmp_path / "x.idx").write_text(
        "".join(f"{k}\t{o}\n" for (k, _), o in zip(recs, offsets, strict=True))
    )
    problems = verify(tmp_path / "x")
    assert problems[0].startswith(f"x.rec record 2 (offset {offsets[2]}, key 2): truncated")
    assert "the records after it cannot be located" in problems[0]
    assert problems[1:] == [
        f"x.idx: key 3 gives offset {offsets[3]}, past the end of x.rec ({offsets[2] + 30} bytes)"
    ]


def test_verify_says_what_it_found(tmp_path):
    (tmp_path / "d").mkdir()
    assert verify(tmp_path / "d") == [
        f"{tmp_path / 'd'}: neither a packed dataset (meta.json), an LMDB (data.mdb) nor a "
        "RecordIO file (.rec with its .idx)"
    ]


def test_payload_size_and_magic_in_image(tmp_path):
    """An image whose stored bytes hold the magic at an aligned payload offset is written as
    a multi-part record and verifies (strict) clean."""
    from tests.conftest import encode
    from tests.readers.test_recordio_dataset import png_with_magic

    image = np.random.default_rng(4).integers(0, 256, (5, 5, 3), dtype=np.uint8)
    png = png_with_magic(encode(image, ".png"), base=24)
    (tmp_path / "src" / "k").mkdir(parents=True)
    (tmp_path / "src" / "k" / "m.png").write_bytes(png)
    out = tmp_path / "out"
    build(BuildConfig(src=tmp_path / "src", out=out, format="recordio"))
    ((_, payload),) = parse_rec((out / "shard-00000.rec").read_bytes())
    assert payload[24:] == png
    assert verify(out, deep=True) == []
