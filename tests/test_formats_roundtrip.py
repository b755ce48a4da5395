"""One round-trip suite over every format: build -> read back -> bytes, labels, pixels equal the
source; a real DataLoader with and without workers; verify passes, and catches a flipped byte."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.verify import verify
from readers import LmdbDataset, RecordIODataset, open_dataset
from readers.formats import FORMATS
from readers.io import handles
from tests.conftest import encode

DATASET_CLASS = {"lmdb": LmdbDataset, "recordio": RecordIODataset}
SHAPE = (12, 10, 3)  # fixed, so DataLoader batches collate
CLASSES = ("ant", "bee", "cow")
PER_CLASS = 7


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """Fixed-size PNG and JPEG images in three class folders."""
    src = tmp_path_factory.mktemp("roundtrip") / "src"
    rng = np.random.default_rng(11)
    files: dict[str, bytes] = {}
    for cls in CLASSES:
        (src / cls).mkdir(parents=True)
        for i in range(PER_CLASS):
            ext = ".png" if i % 2 == 0 else ".jpg"
            data = encode(rng.integers(0, 256, SHAPE, dtype=np.uint8), ext)
            rel = f"{cls}/{i:02d}{ext}"
            (src / rel).write_bytes(data)
            files[rel] = data
    return src, files


@pytest.fixture(params=FORMATS)
def packed(request: pytest.FixtureRequest, source, tmp_path: Path):
    src, files = source
    fmt = request.param
    out = tmp_path / f"out.{'rec' if fmt == 'recordio' else fmt}"
    # a small shard size, so that reads cross shard boundaries
    build(BuildConfig(src=src, out=out, format=fmt, shard_size=4000))
    return fmt, out, files


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def expected_label(rel: str) -> int:
    return CLASSES.index(rel.split("/")[0])


def test_build_writes_the_format_and_several_shards(packed):
    fmt, out, files = packed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == fmt
    assert meta["num_samples"] == len(files)
    assert meta["num_shards"] > 1
    for n, shard in enumerate(meta["shards"]):
        assert set(shard) >= {"name", "first", "count", "bytes", "file_bytes"}
        assert shard["name"] == f"shard-{n:05d}"
        if fmt == "recordio":
            assert (out / f"{shard['name']}.rec").is_file()
            assert (out / f"{shard['name']}.idx").is_file()
        else:
            assert (out / shard["name"] / "data.mdb").is_file()


def test_bytes_and_labels_equal_the_source(packed):
    fmt, out, files = packed
    ds = open_dataset(out, decode="bytes")
    assert isinstance(ds, DATASET_CLASS[fmt])
    index = rows(out)
    assert len(ds) == len(files) == len(index)
    assert [r["path"] for r in index] == sorted(files)
    for i, row in enumerate(index):
        data, label = ds[i]
        assert data == files[row["path"]]
        assert ds.read_bytes(i) == data
        assert label == expected_label(row["path"]) == row["label"]
    np.testing.assert_array_equal(ds.labels, [expected_label(p) for p in sorted(files)])
    assert int(ds.shard_bounds[-1]) == len(files)
    assert len(ds.shard_bounds) > 2


@pytest.mark.parametrize("mode", ["rgb", "bgr", "gray", "unchanged"])
def test_decoded_images_equal_opencv(packed, mode):
    fmt, out, files = packed
    ds = DATASET_CLASS[fmt](out, decode=mode, verify_crc=True)
    flag = {"gray": cv2.IMREAD_GRAYSCALE, "unchanged": cv2.IMREAD_UNCHANGED}.get(
        mode, cv2.IMREAD_COLOR
    )
    for i, rel in enumerate(sorted(files)):
        expected = cv2.imdecode(np.frombuffer(files[rel], np.uint8), flag)
        if mode == "rgb":
            expected = cv2.cvtColor(expected, cv2.COLOR_BGR2RGB)
        if expected.ndim == 2:
            expected = expected[:, :, None]
        image, _ = ds[i]
        assert image.dtype == np.uint8
        np.testing.assert_array_equal(image, expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_every_sample(packed, workers):
    fmt, out, files = packed
    ds = DATASET_CLASS[fmt](out)
    ds[0]  # a handle opened in the parent first: workers must not use it
    loader = paddle.io.DataLoader(
        ds,
        batch_size=4,
        shuffle=False,
        num_workers=workers,
        use_shared_memory=workers > 0,
    )
    seen_images, seen_labels = [], []
    for images, labels in loader:
        assert tuple(images.shape[1:]) == SHAPE
        seen_images.extend(images.numpy())
        seen_labels.extend(labels.numpy().ravel().tolist())
    paths = sorted(files)
    assert seen_labels == [expected_label(p) for p in paths]
    for image, rel in zip(seen_images, paths, strict=True):
        decoded = cv2.imdecode(np.frombuffer(files[rel], np.uint8), cv2.IMREAD_COLOR)
        np.testing.assert_array_equal(image, cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB))


def shard_data_file(fmt: str, out: Path, name: str) -> Path:
    return out / f"{name}.rec" if fmt == "recordio" else out / name / "data.mdb"


def test_verify_passes_and_catches_a_flipped_byte(packed):
    fmt, out, files = packed
    assert verify(out) == []
    assert verify(out, deep=True) == []
    index = rows(out)
    victim = index[len(index) // 2]
    shard = json.loads((out / "meta.json").read_text())["shards"][victim["shard"]]["name"]
    path = shard_data_file(fmt, out, shard)
    handles.close_all()
    blob = bytearray(path.read_bytes())
    data = files[victim["path"]]
    at = bytes(blob).find(data)
    assert at >= 0
    blob[at + len(data) // 2] ^= 0x55
    path.write_bytes(bytes(blob))
    problems = verify(out)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{shard} sample {victim['id']} ")
    assert "CRC-32" in problems[0]
