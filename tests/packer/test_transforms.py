"""Pack-time resize and re-encode, and raw pixels that readers return without decoding."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.prepare import prepare_record
from packer.records import Record
from packer.transform import Transform, parse_resize
from readers import open_dataset
from readers.decode import decode_raw
from tests.conftest import encode


def write(tmp_path, name, image, ext):
    path = tmp_path / name
    path.write_bytes(encode(image, ext))
    return str(path)


@pytest.fixture
def photo():
    rng = np.random.default_rng(0)
    # smooth enough that JPEG quality matters little
    return cv2.resize(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), (400, 300))


def test_parse_resize():
    assert parse_resize("256") == (256, None)
    assert parse_resize("640x480") == (None, (640, 480))
    assert parse_resize(None) == (None, None)
    for bad in ("0", "x", "12x", "-3", "1.5"):
        with pytest.raises(ValueError, match="--resize"):
            parse_resize(bad)
    with pytest.raises(ValueError, match="--encode 'webp'"):
        Transform(encode="webp")


@pytest.mark.parametrize(
    ("transform", "size", "fmt"),
    [
        (Transform(short=150), (200, 150), "jpeg"),  # keep -> same format when resized
        (Transform(fit=(100, 100)), (100, 75), "jpeg"),
        (Transform(short=1000), (400, 300), "jpeg"),  # never upscale
        (Transform(short=150, encode="png"), (200, 150), "png"),
        (Transform(encode="raw"), (400, 300), "raw"),
    ],
)
def test_resize_and_encode(tmp_path, photo, transform, size, fmt):
    path = write(tmp_path, "a.jpg", photo, ".jpg")
    record = prepare_record("a.jpg", path, 1, transform=transform)
    assert isinstance(record, Record)
    assert (record.width, record.height, record.channels) == (*size, 3)
    assert record.format == fmt
    if fmt == "raw":
        assert len(record.data) == size[0] * size[1] * 3
        stored = decode_raw(record.data, size[1], size[0], 3, "bgr")
    else:
        stored = cv2.imdecode(np.frombuffer(record.data, np.uint8), cv2.IMREAD_COLOR)
    original = cv2.imread(path, cv2.IMREAD_COLOR)
    expected = cv2.resize(original, size, interpolation=cv2.INTER_AREA)
    assert stored.shape == expected.shape
    assert np.abs(stored.astype(int) - expected.astype(int)).mean() < 4


def test_alpha_sixteen_bit_and_gray_raw(tmp_path):
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (20, 30, 4), dtype=np.uint8)
    deep = rng.integers(0, 65536, (20, 30, 3), dtype=np.uint16)
    gray = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    rec = prepare_record(
        "a.png", write(tmp_path, "a.png", rgba, ".png"), 0, transform=Transform(encode="raw")
    )
    assert rec.channels == 4
    np.testing.assert_array_equal(
        decode_raw(rec.data, 20, 30, 4, "unchanged"), cv2.cvtColor(rgba, cv2.COLOR_BGRA2RGBA)
    )
    rec = prepare_record(
        "d.png", write(tmp_path, "d.png", deep, ".png"), 0, transform=Transform(encode="raw")
    )
    np.testing.assert_array_equal(
        decode_raw(rec.data, 20, 30, 3, "bgr"), (deep >> 8).astype(np.uint8)
    )
    rec = prepare_record(
        "g.png",
        write(tmp_path, "g.png", gray, ".png"),
        0,
        transform=Transform(encode="jpeg", quality=100),
    )
    assert (rec.format, rec.channels) == ("jpeg", 1)
    rec = prepare_record("a.png", str(tmp_path / "a.png"), 0, transform=Transform(encode="jpeg"))
    assert rec.channels == 3  # JPEG has no alpha
    with pytest.raises(ValueError, match="raw bytes, expected"):
        decode_raw(b"\x00" * 10, 2, 2, 3)


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_build_with_raw_pixels_reads_back_without_decoding(tmp_path, fmt):
    rng = np.random.default_rng(2)
    src = tmp_path / "src"
    images = {}
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(3):
            image = rng.integers(0, 256, (10 + i, 14, 3), dtype=np.uint8)
            (src / cls / f"{i}.png").write_bytes(encode(image, ".png"))
            images[f"{cls}/{i}.png"] = image
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, format=fmt, transform=Transform(encode="raw")))
    ds = open_dataset(out)
    bgr = open_dataset(out, decode="bgr")
    gray = open_dataset(out, decode="gray")
    for i, rel in enumerate(sorted(images)):
        image, label = ds[i]
        np.testing.assert_array_equal(image, cv2.cvtColor(images[rel], cv2.COLOR_BGR2RGB))
        np.testing.assert_array_equal(bgr[i][0], images[rel])
        assert gray[i][0].shape == (*images[rel].shape[:2], 1)
        assert label == ("a", "b").index(rel[0])
    meta = ds.index.meta
    assert meta["options"]["encode"] == "raw"
    assert meta["options"]["resize"] is None


def test_build_resized_jpeg_records_options(tmp_path, photo):
    src = tmp_path / "src" / "x"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.png").write_bytes(encode(photo, ".png"))
    out = tmp_path / "out"
    build(
        BuildConfig(
            src=src.parent, out=out, transform=Transform(short=60, encode="jpeg", quality=80)
        )
    )
    ds = open_dataset(out)
    assert ds[0][0].shape == (60, 80, 3)
    options = ds.index.meta["options"]
    assert (options["resize"], options["encode"], options["quality"]) == ("60", "jpeg", 80)
    assert ds.read_bytes(0)[:3] == b"\xff\xd8\xff"


def test_cli_options(tmp_path, photo):
    from typer.testing import CliRunner

    from packer.cli import app

    src = tmp_path / "src" / "x"
    src.mkdir(parents=True)
    (src / "a.png").write_bytes(encode(photo, ".png"))
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(
        app, ["build", str(src.parent), str(out), "--resize", "200x100", "--encode", "raw"]
    )
    assert result.exit_code == 0, result.output
    assert open_dataset(out)[0][0].shape == (100, 133, 3)
    for args, message in (
        (["--resize", "big"], "--resize 'big'"),
        (["--encode", "gif"], "--encode 'gif'"),
        (["--quality", "0"], "--quality 0"),
    ):
        result = runner.invoke(app, ["build", str(src.parent), str(tmp_path / "o2"), *args])
        assert result.exit_code == 2
        assert message in result.output
