"""packer verify: intact datasets pass; each kind of damage is reported with shard and sample.

Tests taking `packed` / `packed_raw` (tests/conftest.py) run on every registered format; the
LMDB-specific ones (keys, num-samples, stored labels) use `lmdb_out`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import lmdb
import numpy as np
import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.decode_check import check_source
from packer.verify import verify
from readers import open_dataset
from readers.formats import REGISTRY
from readers.io import handles
from readers.meta import load_meta
from tests.conftest import Packed, build_packed
from tests.readers.test_lmdb_dataset import write_bare_lmdb
from tests.readers.test_recordio_dataset import image_payload, record, write_pair


@pytest.fixture
def lmdb_out(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    build(BuildConfig(src=src, out=out, format="lmdb"))
    return out, files


def flip_stored_byte(root: Path, sample: int, at: int) -> None:
    """Flip byte `at` of sample `sample`'s stored bytes where its shard file holds them."""
    stored = open_dataset(root, decode="bytes").read_bytes(sample)
    handles.close_all()
    meta = load_meta(root)
    fmt = REGISTRY[meta["format"]]
    shard = next(s for s in meta["shards"] if s["first"] <= sample < s["first"] + s["count"])
    data = Path(fmt.data_file(fmt.shard_path(root, shard["name"])))
    blob = bytearray(data.read_bytes())
    where = bytes(blob).find(stored)
    assert where >= 0
    assert bytes(blob).find(stored, where + 1) < 0  # found where it is, not elsewhere
    blob[where + at] ^= 0x01
    data.write_bytes(bytes(blob))


def test_intact_dataset_passes_shallow_and_deep(packed: Packed) -> None:
    assert verify(packed.path) == []
    assert verify(packed.path, deep=True) == []


def test_flipped_byte_is_reported(packed: Packed) -> None:
    flip_stored_byte(packed.path, 6, 100)
    problems = verify(packed.path)
    assert len(problems) == 1
    assert re.match(r"shard-00000 sample 6 \(.*, dog/img_002\.png\): CRC-32", problems[0])


def test_raw_dataset_passes_deep(packed_raw: Packed) -> None:
    # raw pixels are not an image file: --deep decodes them as readers do (decode_sample)
    assert verify(packed_raw.path) == []
    assert verify(packed_raw.path, deep=True) == []
    # and the pixels are the source's (PNG sources: lossless), gray ones included
    ds = open_dataset(packed_raw.path)
    names = sorted(packed_raw.files)
    pngs = [i for i, name in enumerate(names) if name.endswith(".png")]
    assert any(name.startswith("dog/img_004") for name in names)  # a gray PNG
    for i in pngs:
        source = cv2.imdecode(np.frombuffer(packed_raw.files[names[i]], np.uint8), cv2.IMREAD_COLOR)
        assert np.array_equal(ds[i][0], cv2.cvtColor(source, cv2.COLOR_BGR2RGB)), names[i]


def test_raw_dataset_damage_is_reported(packed_raw: Packed) -> None:
    flip_stored_byte(packed_raw.path, 3, 5)
    for deep in (False, True):
        problems = verify(packed_raw.path, deep=deep)
        assert len(problems) == 1, problems
        assert re.match(r"shard-00000 sample 3 \(.*, cat/img_003\.jpg\): CRC-32", problems[0])


def test_raw_dataset_with_wrong_dimensions_does_not_decode(packed_raw: Packed) -> None:
    rows = (packed_raw.path / "index.jsonl").read_text().splitlines()
    row = json.loads(rows[2])
    row["height"] += 1
    rows[2] = json.dumps(row)
    (packed_raw.path / "index.jsonl").write_text("\n".join(rows) + "\n")
    problems = verify(packed_raw.path, deep=True)
    assert any("index.jsonl: SHA-256 differs" in p for p in problems)
    assert any(re.match(r"shard-00000 sample 2 .*: does not decode", p) for p in problems)


def rewrite(out, fn):
    handles.close_all()
    env = lmdb.open(str(out / "shard-00000"))
    with env.begin(write=True) as txn:
        fn(txn)
    env.close()


def test_missing_key_is_reported(lmdb_out):
    out, _ = lmdb_out
    rewrite(out, lambda txn: txn.delete(b"image-000000003"))
    problems = verify(out)
    assert "shard-00000 sample 2 (image-000000003, cat/img_002.png): the image key is missing" in (
        problems
    )
    assert any("holds 33 keys, expected 34" in p for p in problems)


def test_wrong_num_samples_is_reported(lmdb_out):
    out, _ = lmdb_out
    rewrite(out, lambda txn: txn.put(b"num-samples", b"10"))
    assert verify(out) == ["shard-00000: num-samples is '10', expected 11 (meta.json)"]


def test_wrong_label_and_edited_index(lmdb_out):
    out, _ = lmdb_out
    rewrite(out, lambda txn: txn.put(b"label-000000001", b"2"))
    problems = verify(out)
    assert len(problems) == 1
    assert "stored label b'2' differs from the index label 0" in problems[0]

    rows = (out / "index.jsonl").read_text().splitlines()
    row = json.loads(rows[4])
    row["width"] += 1
    rows[4] = json.dumps(row)
    (out / "index.jsonl").write_text("\n".join(rows) + "\n")
    deep = verify(out, deep=True)
    assert any("index.jsonl: SHA-256 differs" in p for p in deep)
    assert any(p.startswith("shard-00000 sample 4 ") and "the index says" in p for p in deep)


def test_missing_shard_and_meta(lmdb_out, tmp_path):
    out, _ = lmdb_out
    (out / "shard-00000" / "data.mdb").unlink()
    problems = verify(out)
    assert problems[0].startswith("shard-00000: cannot open")
    assert verify(tmp_path / "nothing") == [f"{tmp_path / 'nothing'}: does not exist"]


def test_bare_paddleocr_lmdb(tmp_path, tree):
    _, files = tree
    images = [files[k] for k in sorted(files)]
    bare = tmp_path / "bare"
    write_bare_lmdb(bare, [*images[:3], b"not an image"], ["a", "b", "c", "d"])
    assert verify(bare) == []
    assert verify(bare, deep=True) == ["bare sample 3 (image-000000004): does not decode"]
    handles.close_all()
    env = lmdb.open(str(bare))
    with env.begin(write=True) as txn:
        txn.delete(b"label-000000002")
    env.close()
    assert verify(bare) == [
        "bare sample 1 (image-000000002): the label key label-000000002 is missing"
    ]


def corrupt_jpeg() -> bytes:
    """A JPEG with restart markers whose scan has 120 bytes zeroed in its middle: it ends in
    EOI and OpenCV decodes it (the damaged part made up); libjpeg only warns on stderr."""
    image = cv2.GaussianBlur(
        np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8), (7, 7), 0
    )
    flags = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, 2]
    data = bytearray(cv2.imencode(".jpg", image, flags)[1].tobytes())
    sos = data.find(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    middle = (start + len(data) - 2) // 2
    data[middle : middle + 120] = bytes(120)
    assert cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_UNCHANGED) is not None
    assert check_source(bytes(data), "jpeg").dims is None  # the build refuses it
    return bytes(data)


CORRUPT = (
    r"the build's decode check refuses it \(undecodable\): the JPEG decoder reports corrupt data"
)


def test_deep_is_as_strict_as_the_build_decode_check(tree, tmp_path, fmt: str) -> None:
    """A JPEG whose scan has a zeroed stretch decodes (OpenCV makes the pixels up; libjpeg only
    warns on stderr): packed with --no-decode-check the index is consistent, so only the
    build's own check can find it, and verify --deep runs it."""
    src, _ = tree
    (src / "cat" / "zeroed.jpg").write_bytes(corrupt_jpeg())
    out = build_packed(src, tmp_path / f"out.{fmt}", fmt, decode_check=False)
    i = [json.loads(line)["path"] for line in (out / "index.jsonl").open()].index("cat/zeroed.jpg")
    assert verify(out) == []
    problems = verify(out, deep=True)
    assert len(problems) == 1, problems
    assert re.match(rf"shard-00000 sample {i} \(.*cat/zeroed\.jpg\): {CORRUPT}", problems[0])


def test_deep_of_bare_shards_runs_the_build_decode_check(tmp_path, tree) -> None:
    _, files = tree
    pngs = [files[k] for k in sorted(files) if k.endswith(".png")]
    images = [*pngs[:2], corrupt_jpeg()]
    write_bare_lmdb(tmp_path / "bare", images, ["a", "b", "c"])
    assert verify(tmp_path / "bare") == []
    problems = verify(tmp_path / "bare", deep=True)
    assert len(problems) == 1, problems
    assert re.match(rf"bare sample 2 \(image-000000003\): {CORRUPT}", problems[0])

    recs = [(k, record(image_payload(data, 1.0, k))) for k, data in enumerate(images)]
    offsets = write_pair(tmp_path / "x", recs)
    assert verify(tmp_path / "x.rec") == []
    problems = verify(tmp_path / "x.rec", deep=True)
    assert len(problems) == 1, problems
    assert re.match(rf"x\.rec record 2 \(offset {offsets[2]}, key 2\): {CORRUPT}", problems[0])
