"""LmdbDataset specifics: bare PaddleOCR LMDBs, missing keys. What every format's Dataset does
alike (decoding, pickling, fork, DataLoader workers) is in test_datasets.py."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import LmdbDataset, open_dataset
from readers.errors import DatasetFormatError, RecordError
from readers.io import handles
from tests.conftest import write_tree


@pytest.fixture
def lmdb_packed(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    build(BuildConfig(src=src, out=out, format="lmdb"))
    return out, files


def write_bare_lmdb(path: Path, images: list[bytes], labels: list[str]) -> None:
    """A PaddleOCR-layout LMDB written directly with py-lmdb, as their tools do."""
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(zip(images, labels, strict=True), start=1):
            txn.put(b"image-%09d" % i, image)
            txn.put(b"label-%09d" % i, label.encode())
        txn.put(b"num-samples", str(len(images)).encode())
    env.close()


def test_bare_paddleocr_lmdb(tmp_path):
    files = write_tree(tmp_path / "src", {"w": 3})
    images = [files[k] for k in sorted(files)]
    bare = tmp_path / "bare"
    write_bare_lmdb(bare, images, ["hello", "wörld", "a b c"])
    ds = open_dataset(bare)
    assert isinstance(ds, LmdbDataset)
    assert len(ds) == 3
    assert [ds[i][1] for i in range(3)] == ["hello", "wörld", "a b c"]
    assert LmdbDataset(bare, decode="bytes")[1][0] == images[1]
    assert ds.labels is None


def test_a_bare_lmdb_whose_count_it_cannot_hold_is_refused_at_open(tmp_path):
    files = write_tree(tmp_path / "src", {"w": 3})
    bare = tmp_path / "bare"
    write_bare_lmdb(bare, [files[k] for k in sorted(files)], ["a", "b", "c"])
    env = lmdb.open(str(bare), map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"num-samples", b"1000000000")
    env.close()
    with pytest.raises(DatasetFormatError, match=r"'num-samples' says 1000000000 samples.*7 keys"):
        LmdbDataset(bare)


def test_open_dataset_says_what_it_found(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "readme.md").write_text("hi")
    with pytest.raises(DatasetFormatError, match=r"not a dataset .*readme\.md"):
        open_dataset(tmp_path / "x")
    with pytest.raises(DatasetFormatError, match="neither a packed dataset"):
        LmdbDataset(tmp_path / "x")


def test_missing_key_is_a_record_error(lmdb_packed):
    out, _ = lmdb_packed
    handles.close_all()
    env = lmdb.open(str(out / "shard-00000"))
    with env.begin(write=True) as txn:
        txn.delete(b"image-000000003")
    env.close()
    with pytest.raises(RecordError, match=r"image-000000003 sample 2 .*missing"):
        LmdbDataset(out)[2]
