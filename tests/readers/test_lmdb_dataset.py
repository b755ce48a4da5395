"""LmdbDataset: decoding, labels, bare PaddleOCR LMDBs, pickling, fork, DataLoader workers."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import cv2
import lmdb
import numpy as np
import paddle
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import LmdbDataset, handles, open_dataset
from readers.errors import DatasetFormatError, RecordError
from tests.conftest import write_tree


@pytest.fixture
def packed(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.lmdb"
    build(BuildConfig(src=src, out=out))
    return out, files


def source_order(files: dict[str, bytes]) -> list[str]:
    return sorted(files)


def test_decode_modes_match_opencv(packed):
    out, files = packed
    paths = source_order(files)
    for mode in ("rgb", "bgr", "gray", "unchanged"):
        ds = LmdbDataset(out, decode=mode)
        assert len(ds) == len(files)
        for i, rel in enumerate(paths):
            buf = np.frombuffer(files[rel], np.uint8)
            flag = {"gray": cv2.IMREAD_GRAYSCALE, "unchanged": cv2.IMREAD_UNCHANGED}.get(
                mode, cv2.IMREAD_COLOR
            )
            expected = cv2.imdecode(buf, flag)
            if mode == "rgb":
                expected = cv2.cvtColor(expected, cv2.COLOR_BGR2RGB)
            if expected.ndim == 2:
                expected = expected[:, :, None]
            image, label = ds[i]
            assert image.dtype == np.uint8
            assert image.ndim == 3
            np.testing.assert_array_equal(image, expected)
            assert label == ["cat", "dog", "eel"].index(rel.split("/")[0])
    raw = LmdbDataset(out, decode="bytes")
    assert [raw[i][0] for i in range(len(raw))] == [files[p] for p in paths]
    assert raw[-1][0] == files[paths[-1]]
    with pytest.raises(IndexError):
        raw[len(raw)]
    with pytest.raises(ValueError, match="decode='jpeg'"):
        LmdbDataset(out, decode="jpeg")


def test_transform_and_labels_array(packed):
    out, files = packed
    ds = LmdbDataset(out, transform=lambda im: im.shape)
    assert ds[0][0][2] == 3
    np.testing.assert_array_equal(ds.labels, [0] * 4 + [1] * 5 + [2] * 2)
    assert list(ds.shard_bounds) == [0, len(files)]


def test_two_datasets_share_one_handle_and_pickle_without_it(packed):
    out, _ = packed
    a, b = LmdbDataset(out), LmdbDataset(out)
    a[0], b[1]
    assert a._env(0) is b._env(0)
    clone = pickle.loads(pickle.dumps(a))
    assert clone._envs == []
    np.testing.assert_array_equal(clone[3][0], a[3][0])


def test_forked_child_reopens_instead_of_using_the_parents_handle(packed):
    out, _ = packed
    ds = LmdbDataset(out, decode="bytes")
    parent_bytes = ds[2][0]
    parent_env = ds._env(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not touch the inherited environment
        try:
            ok = ds._env(0) is not parent_env and ds[2][0] == parent_bytes
            os.write(write, b"1" if ok else b"0")
        except BaseException as exc:
            os.write(write, repr(exc).encode()[:200])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 256) == b"1"
    assert ds[2][0] == parent_bytes  # the parent's handle still works


def test_corrupt_record_names_shard_key_and_source(packed):
    out, files = packed
    data = out / "shard-00000" / "data.mdb"
    blob = bytearray(data.read_bytes())
    target = files[source_order(files)[0]]
    at = bytes(blob).find(target)
    blob[at + len(target) // 2] ^= 0xFF
    data.write_bytes(bytes(blob))
    ds = LmdbDataset(out, decode="bytes", verify_crc=True)
    with pytest.raises(
        RecordError,
        match=r"shard-00000 key image-000000001 sample 0 "
        r"\(source cat/img_000\.png\): CRC-32",
    ):
        ds[0]
    assert LmdbDataset(out, decode="bytes", verify_crc=True)[1][0] == files[source_order(files)[1]]


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


def test_open_dataset_says_what_it_found(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "readme.md").write_text("hi")
    with pytest.raises(DatasetFormatError, match=r"not a dataset .*readme\.md"):
        open_dataset(tmp_path / "x")
    with pytest.raises(DatasetFormatError, match="neither a packed dataset"):
        LmdbDataset(tmp_path / "x")


def test_missing_key_is_a_record_error(packed):
    out, _ = packed
    handles.close_all()
    env = lmdb.open(str(out / "shard-00000"))
    with env.begin(write=True) as txn:
        txn.delete(b"image-000000003")
    env.close()
    with pytest.raises(RecordError, match=r"image-000000003 sample 2 .*missing"):
        LmdbDataset(out)[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_every_sample(tmp_path, workers):
    rng = np.random.default_rng(5)
    src = tmp_path / "src"
    expected = {}
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(20):
            image = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
            _ok, buf = cv2.imencode(".png", image)
            (src / cls / f"{i:02d}.png").write_bytes(buf.tobytes())
            expected[(cls, i)] = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out))
    ds = LmdbDataset(out)
    ds[0]  # open the handle in the parent first: workers must not reuse it
    loader = paddle.io.DataLoader(
        ds,
        batch_size=8,
        shuffle=False,
        num_workers=workers,
        use_shared_memory=workers > 0,
        persistent_workers=workers > 0,
    )
    for _epoch in range(2):
        seen = []
        for images, labels in loader:
            assert tuple(images.shape[1:]) == (12, 10, 3)
            seen.extend(zip(images.numpy(), labels.numpy().ravel().tolist(), strict=True))
        assert len(seen) == 40
        for n, (image, label) in enumerate(seen):
            cls, i = ("a", "b")[n // 20], n % 20
            assert label == ("a", "b").index(cls)
            np.testing.assert_array_equal(image, expected[(cls, i)])
