"""packer verify: intact datasets pass; each kind of damage is reported with shard and sample."""

from __future__ import annotations

import json

import lmdb
import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.verify import verify
from readers import handles
from tests.readers.test_lmdb_dataset import write_bare_lmdb


@pytest.fixture
def packed(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    build(BuildConfig(src=src, out=out))
    return out, files


def rewrite(out, fn):
    handles.close_all()
    env = lmdb.open(str(out / "shard-00000"))
    with env.begin(write=True) as txn:
        fn(txn)
    env.close()


def test_intact_dataset_passes_shallow_and_deep(packed):
    out, _ = packed
    assert verify(out) == []
    assert verify(out, deep=True) == []


def test_flipped_byte_is_reported(packed):
    out, files = packed
    data = out / "shard-00000" / "data.mdb"
    blob = bytearray(data.read_bytes())
    target = files["dog/img_002.png"]
    at = bytes(blob).find(target)
    assert at > 0
    blob[at + 100] ^= 0x01
    data.write_bytes(bytes(blob))
    problems = verify(out)
    assert len(problems) == 1
    assert problems[0].startswith("shard-00000 sample 6 (image-000000007, dog/img_002.png): CRC-32")


def test_missing_key_is_reported(packed):
    out, _ = packed
    rewrite(out, lambda txn: txn.delete(b"image-000000003"))
    problems = verify(out)
    assert "shard-00000 sample 2 (image-000000003, cat/img_002.png): the image key is missing" in (
        problems
    )
    assert any("holds 22 keys, expected 23" in p for p in problems)


def test_wrong_num_samples_is_reported(packed):
    out, _ = packed
    rewrite(out, lambda txn: txn.put(b"num-samples", b"10"))
    assert verify(out) == ["shard-00000: num-samples is '10', expected 11 (meta.json)"]


def test_wrong_label_and_edited_index(packed):
    out, _ = packed
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


def test_missing_shard_and_meta(packed, tmp_path):
    out, _ = packed
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
