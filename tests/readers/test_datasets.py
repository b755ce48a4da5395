"""What every registered format's Dataset does alike, run on each format (`packed` from
tests/conftest.py): decoding, labels, handles shared and dropped across pickle and fork,
errors that name the record, the class for another format, raw pixels, DataLoader workers."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest

from readers import open_dataset
from readers.errors import DatasetFormatError, RecordError
from readers.formats import REGISTRY
from readers.meta import load_meta
from tests.conftest import Packed, build_packed

CLASSES = ["cat", "dog", "eel"]


def dataset_class(fmt: str):
    return REGISTRY[fmt].dataset_class()


def test_open_dataset_picks_the_registered_class(packed: Packed) -> None:
    ds = open_dataset(packed.path)
    assert type(ds) is dataset_class(packed.format)
    assert ds.format == packed.format


def test_decode_modes_match_opencv(packed: Packed) -> None:
    cls = dataset_class(packed.format)
    paths = sorted(packed.files)
    for mode in ("rgb", "bgr", "gray", "unchanged"):
        ds = cls(packed.path, decode=mode)
        assert len(ds) == len(paths)
        for i, rel in enumerate(paths):
            buf = np.frombuffer(packed.files[rel], np.uint8)
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
            assert label == CLASSES.index(rel.split("/")[0])
    raw = cls(packed.path, decode="bytes")
    assert [raw[i][0] for i in range(len(raw))] == [packed.files[p] for p in paths]
    assert raw.read_bytes(-1) == packed.files[paths[-1]]
    with pytest.raises(IndexError):
        raw[len(raw)]
    with pytest.raises(ValueError, match="decode='jpeg'"):
        cls(packed.path, decode="jpeg")


def test_transform_labels_and_bounds(packed: Packed) -> None:
    ds = open_dataset(packed.path, transform=lambda im: im.shape)
    assert ds[0][0][2] == 3
    np.testing.assert_array_equal(ds.labels, [0] * 4 + [1] * 5 + [2] * 2)
    assert list(ds.shard_bounds) == [0, len(packed.files)]


def test_two_datasets_share_one_handle_and_pickle_without_it(packed: Packed) -> None:
    a, b = open_dataset(packed.path), open_dataset(packed.path)
    a[0], b[1]
    assert a._handle(0) is b._handle(0)
    clone = pickle.loads(pickle.dumps(a))
    assert clone._handles == []
    np.testing.assert_array_equal(clone[3][0], a[3][0])


def test_forked_child_reopens_instead_of_using_the_parents_handle(packed: Packed) -> None:
    ds = open_dataset(packed.path, decode="bytes")
    parent_bytes = ds[2][0]
    parent_handle = ds._handle(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not touch the inherited handle
        try:
            ok = ds._handle(0) is not parent_handle and ds[2][0] == parent_bytes
            os.write(write, b"1" if ok else b"0")
        except BaseException as exc:
            os.write(write, repr(exc).encode()[:200])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 256) == b"1"
    assert ds[2][0] == parent_bytes  # the parent's handle still works


def flip_in_shard(root: Path, stored: bytes, at: int) -> None:
    """Flip byte `at` of `stored` where the (only) shard's data file holds it."""
    meta = load_meta(root)
    fmt = REGISTRY[meta["format"]]
    data = Path(fmt.data_file(fmt.shard_path(root, meta["shards"][0]["name"])))
    blob = bytearray(data.read_bytes())
    where = bytes(blob).find(stored)
    assert where >= 0
    blob[where + at] ^= 0xFF
    data.write_bytes(bytes(blob))


def test_corrupt_record_names_shard_key_sample_and_source(packed: Packed) -> None:
    paths = sorted(packed.files)
    target = packed.files[paths[0]]
    flip_in_shard(packed.path, target, len(target) // 2)
    ds = open_dataset(packed.path, decode="bytes", verify_crc=True)
    with pytest.raises(RecordError) as caught:
        ds[0]
    assert re.search(
        r"shard-00000\S* key \S+ sample 0 .*\(source cat/img_000\.png\): CRC-32", str(caught.value)
    )
    assert ds[1][0] == packed.files[paths[1]]


def test_the_class_of_another_format_says_which_to_use(packed: Packed) -> None:
    for other in REGISTRY.values():
        if other.name == packed.format:
            continue
        mine = REGISTRY[packed.format]
        with pytest.raises(
            DatasetFormatError,
            match=f"a {packed.format} dataset, not {other.title}; use {mine.dataset_name}",
        ):
            other.dataset_class()(packed.path)


def test_raw_pixels_read_back_as_the_source(packed_raw: Packed) -> None:
    paths = sorted(packed_raw.files)
    for mode in ("rgb", "bgr", "gray"):
        ds = open_dataset(packed_raw.path, decode=mode)
        for i, rel in enumerate(paths):
            if not rel.endswith(".png"):  # lossless sources only: pixels compare exactly
                continue
            bgr = cv2.imdecode(np.frombuffer(packed_raw.files[rel], np.uint8), cv2.IMREAD_COLOR)
            image = ds[i][0]
            if mode == "gray":  # from stored RGB, not from the file: rounding may differ by 1
                expected = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)[:, :, None]
                assert image.shape == expected.shape
                assert np.abs(image.astype(int) - expected).max() <= 1, rel
                continue
            expected = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB) if mode == "rgb" else bgr
            np.testing.assert_array_equal(image, expected, err_msg=f"{rel} {mode}")


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_every_sample(tmp_path: Path, fmt: str, workers: int) -> None:
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
    ds = open_dataset(build_packed(src, tmp_path / "out", fmt))
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


def test_reading_does_not_look_up_source_paths(
    packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source path is for error messages only: finding it reads the index file, so a
    read that succeeds must not ask for it (it once cost 600 us per sample)."""
    from readers.index import DatasetIndex

    calls: list[int] = []
    original = DatasetIndex.path_of

    def counting(self: DatasetIndex, i: int) -> str | None:
        calls.append(i)
        return original(self, i)

    monkeypatch.setattr(DatasetIndex, "path_of", counting)
    ds = open_dataset(packed.path, decode="bytes", verify_crc=True)
    for i in range(len(ds)):
        ds[i]
    assert calls == []
    ds.index.crc32 = ds.index.crc32.copy()
    ds.index.crc32[0] ^= 1  # the error path still names the source
    with pytest.raises(RecordError, match=r"CRC-32"):
        ds[0]
    assert calls == [0]
