"""``wh-%09d`` keys: every LMDB shard packer writes says each image's width and height.

PaddleOCR's ``RatioDataSet`` (and OpenOCR, and the ``create_lmdb_dataset.py`` writers) read
``wh-%09d`` -> ``b"W_H"`` to bucket by aspect ratio without decoding. The reader below is
written from that layout alone (py-lmdb, the key, ``split("_")``) and must agree with the index
for every sample of builds, converts, appends, merges and splits. ``packer verify`` checks the
keys against the index, and takes shards without any (built by an older packer) with a note;
``packer convert`` of a foreign LMDB whose ``wh-`` keys disagree with the images warns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import lmdb
import numpy as np
from typer.testing import CliRunner

from packer.cli import app
from packer.verify import verify
from readers import LmdbDataset
from readers.io import handles
from tests.conftest import encode, make_image

runner = CliRunner()


def _mixed_tree(root: Path, *, seed: int = 0, count: int = 12, prefix: str = "") -> Path:
    """Class folders of PNG and JPEG images, every one of another width and height."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        cls = ("wide", "tall")[i % 2]
        w, h = (30 + 7 * i, 9 + i) if cls == "wide" else (8 + i, 25 + 5 * i)
        ext = ".png" if i % 3 else ".jpg"
        (root / cls).mkdir(parents=True, exist_ok=True)
        (root / cls / f"{prefix}{i:02d}{ext}").write_bytes(encode(make_image(rng, w, h), ext))
    return root


def _invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def _paddleocr_sizes(shard: Path) -> dict[int, tuple[int, int]]:
    """What a PaddleOCR-style reader sees: ``wh-%09d`` of records 1..num-samples as (w, h)."""
    env = lmdb.open(str(shard), readonly=True, lock=False, readahead=False, meminit=False)
    try:
        with env.begin(write=False) as txn:
            count = int(txn.get(b"num-samples").decode())
            sizes = {}
            for n in range(1, count + 1):
                w, h = txn.get(b"wh-%09d" % n).decode("utf-8").split("_")
                sizes[n] = (int(w), int(h))
            return sizes
    finally:
        env.close()


def _assert_sizes_agree(out: Path) -> None:
    """Every sample's wh- key is the index's width and height, and the real image size."""
    handles.close_all()
    meta = json.loads((out / "meta.json").read_text())
    rows = _rows(out)
    assert rows
    per_shard = {n: _paddleocr_sizes(out / s["name"]) for n, s in enumerate(meta["shards"])}
    assert sum(len(s) for s in per_shard.values()) == len(rows)
    ds = LmdbDataset(str(out), decode="bytes")  # values read at the index's offsets
    for row in rows:
        local = row["id"] - meta["shards"][row["shard"]]["first"] + 1
        assert per_shard[row["shard"]][local] == (row["width"], row["height"]), row
        data, _label = ds[row["id"]]
        image = cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_UNCHANGED)
        assert (image.shape[1], image.shape[0]) == (row["width"], row["height"])
    handles.close_all()


def _rewrite(shard: Path, fn: Any) -> None:
    handles.close_all()
    env = lmdb.open(str(shard), subdir=True)
    with env.begin(write=True) as txn:
        fn(txn)
    env.close()


def _drop_wh_keys(txn: Any) -> None:
    """Make a shard as a packer older than the wh- keys wrote it."""
    with txn.cursor() as cursor:
        keys = [bytes(k) for k in cursor.iternext(values=False) if bytes(k).startswith(b"wh-")]
    for key in keys:
        txn.delete(key)


def test_a_paddleocr_style_reader_agrees_with_the_index(tmp_path: Path) -> None:
    src = _mixed_tree(tmp_path / "src")
    out = tmp_path / "out.lmdb"
    _invoke("build", str(src), str(out), "--shard-size", "3000", "--no-progress")
    assert len(json.loads((out / "meta.json").read_text())["shards"]) > 2
    _assert_sizes_agree(out)
    raw = tmp_path / "raw.lmdb"
    _invoke("build", str(src), str(raw), "--encode", "raw", "--compress", "lz4", "--no-progress")
    rows = _rows(raw)
    assert {row["compression"] for row in rows} == {"lz4"}
    sizes = _paddleocr_sizes(raw / "shard-00000")
    assert [sizes[row["id"] + 1] for row in rows] == [(r["width"], r["height"]) for r in rows]
    assert verify(out) == []
    assert verify(raw, deep=True) == []


def test_every_writing_command_writes_the_keys(tmp_path: Path) -> None:
    a = tmp_path / "a.lmdb"
    _invoke("build", str(_mixed_tree(tmp_path / "src")), str(a), "--shard-size", "3000")
    more = _mixed_tree(tmp_path / "more", seed=1, count=5, prefix="m")
    _invoke("append", str(a), str(more))
    _assert_sizes_agree(a)
    b = tmp_path / "b.lmdb"
    _invoke("build", str(_mixed_tree(tmp_path / "src-b", seed=2, count=6, prefix="b")), str(b))
    merged = tmp_path / "merged.lmdb"
    _invoke("merge", str(merged), str(a), str(b), "--shard-size", "2500")
    _assert_sizes_agree(merged)
    parts = tmp_path / "parts"
    _invoke("split", str(merged), str(parts), "--into", "train=0.7,val=0.3", "--seed", "1")
    _assert_sizes_agree(parts / "train")
    _assert_sizes_agree(parts / "val")
    converted = tmp_path / "converted.lmdb"
    _invoke("convert", str(merged), str(converted), "--shard-size", "4000")
    _assert_sizes_agree(converted)
    for out in (a, merged, parts / "train", parts / "val", converted):
        assert verify(out) == [], out


def test_verify_reports_a_tampered_or_missing_wh_key(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    _invoke("build", str(_mixed_tree(tmp_path / "src")), str(out))
    row = _rows(out)[1]
    _rewrite(out / "shard-00000", lambda txn: txn.put(b"wh-000000002", b"1_1"))
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == (
        f"shard-00000 sample 1 (image-000000002, {row['path']}): wh-000000002 is b'1_1', "
        f"the index says {row['width']}_{row['height']} (width_height)"
    )
    _rewrite(out / "shard-00000", lambda txn: txn.delete(b"wh-000000003"))
    problems = verify(out)
    assert any(p.endswith("wh-000000003 is missing") for p in problems), problems
    assert (
        "shard-00000: holds 36 keys, expected 37 (an image, a label and a wh- size per"
        in (problems[0])
    )


def test_shards_without_wh_keys_verify_with_a_note(tmp_path: Path) -> None:
    old = tmp_path / "old.lmdb"
    _invoke("build", str(_mixed_tree(tmp_path / "src")), str(old))
    _rewrite(old / "shard-00000", _drop_wh_keys)
    result = runner.invoke(app, ["verify", str(old), "--deep"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{old}: OK (deep)\n"
    assert result.stderr == (
        "note: shard-00000: no wh- keys (built by an older packer); PaddleOCR's RatioDataSet "
        "decodes every image of such a shard at start-up to learn its size (a `packer "
        "convert` of the dataset writes them)\n"
    )
    # merged with a new build, the old shard is reused as it is: only it is noted
    new = tmp_path / "new.lmdb"
    _invoke("build", str(_mixed_tree(tmp_path / "src-new", seed=3, prefix="n")), str(new))
    merged = tmp_path / "merged.lmdb"
    _invoke("merge", str(merged), str(old), str(new))
    assert (merged / "shard-00000" / "data.mdb").stat().st_ino == (
        (old / "shard-00000" / "data.mdb").stat().st_ino
    )
    notes: list[str] = []
    assert verify(merged, notes=notes) == []
    assert [n.split(":")[0] for n in notes] == ["shard-00000"]
    # a convert writes the keys
    converted = tmp_path / "converted.lmdb"
    _invoke("convert", str(old), str(converted))
    notes = []
    assert verify(converted, notes=notes) == []
    assert notes == []
    _assert_sizes_agree(converted)


def _bare_lmdb(path: Path, images: list[bytes], whs: list[bytes | None]) -> None:
    env = lmdb.open(str(path), map_size=1 << 24, subdir=True)
    with env.begin(write=True) as txn:
        for n, (data, wh) in enumerate(zip(images, whs, strict=True), start=1):
            txn.put(b"image-%09d" % n, data)
            txn.put(b"label-%09d" % n, f"word{n}".encode())
            if wh is not None:
                txn.put(b"wh-%09d" % n, wh)
        txn.put(b"num-samples", str(len(images)).encode())
    env.close()


def test_convert_of_a_bare_lmdb_with_wh_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    sizes = [(40, 12), (25, 30), (64, 16), (18, 18)]
    images = [encode(make_image(rng, w, h), ".png") for w, h in sizes]
    bare = tmp_path / "bare"
    # right, wrong, not W_H, absent
    _bare_lmdb(bare, images, [b"40_12", b"30_25", b"wide", None])
    assert verify(bare) == [
        "bare sample 2 (image-000000003): wh-000000003 is b'wide', not W_H",
    ]
    out = tmp_path / "out.lmdb"
    _invoke("convert", str(bare), str(out))
    rows = _rows(out)
    assert [(r["width"], r["height"]) for r in rows] == sizes  # from the images themselves
    warnings = [json.loads(line) for line in (out / "warnings.jsonl").read_text().splitlines()]
    assert [(w["path"], w["reason"], w["id"]) for w in warnings] == [
        ("image-000000002", "wh_mismatch", 1),
        ("image-000000003", "wh_mismatch", 2),
    ]
    assert warnings[0]["message"] == (
        "the input's wh-000000002 is '30_25', the image is 25x30 (width x height); packed "
        "with its own size"
    )
    _assert_sizes_agree(out)
    assert verify(out) == []
