"""Inputs that decode wrong are not packed as fine: libjpeg's corrupt-data warnings, float and
32-bit TIFF samples, and datasets whose samples the default reader cannot decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import lmdb
import numpy as np
import pytest

from packer.build import build
from packer.config import BuildConfig
from packer.transform import Transform
from packer.verify import verify
from readers import open_dataset
from tests.conftest import write_tree

RNG = np.random.default_rng(11)


def smooth_jpeg(**params: int) -> bytearray:
    """A 64x48 JPEG of smooth content (so that its scan is long enough to damage)."""
    image = cv2.GaussianBlur(RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8), (7, 7), 0)
    flags = [cv2.IMWRITE_JPEG_QUALITY, 90]
    for key, value in params.items():
        flags += [getattr(cv2, key), value]
    ok, buf = cv2.imencode(".jpg", image, flags)
    assert ok
    return bytearray(buf.tobytes())


def _scan_start(data: bytearray) -> int:
    sos = data.find(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")


def zeroed_jpeg() -> bytes:
    """A JPEG with restart markers whose scan has 120 bytes zeroed in its middle: it still
    ends in EOI, OpenCV returns an image, and libjpeg only warns on stderr."""
    data = smooth_jpeg(IMWRITE_JPEG_RST_INTERVAL=2)
    start = _scan_start(data)
    middle = (start + len(data) - 2) // 2
    data[middle : middle + 120] = bytes(120)
    assert data.endswith(b"\xff\xd9")
    assert cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_UNCHANGED) is not None
    return bytes(data)


def odd_sos_jpeg() -> bytes:
    """A baseline JPEG whose SOS gives Al = 1: libjpeg warns ("Invalid SOS parameters for
    sequential JPEG") and decodes the image whole."""
    data = smooth_jpeg()
    data[_scan_start(data) - 1] = 0x01
    return bytes(data)


def float_tiff() -> bytes:
    ok, buf = cv2.imencode(".tiff", RNG.random((6, 8, 3)).astype(np.float32))
    assert ok
    return buf.tobytes()


def int16_tiff() -> bytes:
    ok, buf = cv2.imencode(".tiff", RNG.integers(0, 30000, (6, 8, 3)).astype(np.int16))
    assert ok
    return buf.tobytes()


def tree_with(tmp_path: Path, extra: dict[str, bytes], count: int = 4) -> Path:
    src = tmp_path / "src"
    write_tree(src, {"a": count, "b": count})
    for rel, data in extra.items():
        (src / rel).write_bytes(data)
    return src


def errors_of(out: Path) -> dict[str, dict[str, Any]]:
    lines = (out / "errors.jsonl").read_text().splitlines()
    return {e["path"]: e for e in map(json.loads, lines)}


def paths_of(out: Path) -> list[str]:
    return [json.loads(line)["path"] for line in (out / "index.jsonl").read_text().splitlines()]


def warnings_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "warnings.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_jpeg_the_decoder_calls_corrupt_is_not_packed(tmp_path, workers):
    # 40 images per class: with two workers they are prepared in the process pool
    src = tree_with(tmp_path, {"a/zeroed.jpg": zeroed_jpeg()}, count=40)
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, workers=workers, progress=False))
    error = errors_of(out)["a/zeroed.jpg"]
    assert error["reason"] == "undecodable"
    assert "decoder reports corrupt data (Corrupt JPEG data:" in error["message"]
    assert "a/zeroed.jpg" not in paths_of(out)
    assert verify(out, deep=True) == []


def test_a_jpeg_with_a_harmless_decoder_warning_is_packed_with_a_note(tmp_path, capfd):
    src = tree_with(tmp_path, {"a/odd_sos.jpg": odd_sos_jpeg()})
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, progress=False))
    notes = [n for n in warnings_of(out) if n["path"] == "a/odd_sos.jpg"]
    assert [n["reason"] for n in notes] == ["decode_warning"]
    assert "Invalid SOS parameters for sequential JPEG" in notes[0]["message"]
    assert "a/odd_sos.jpg" not in errors_of(out)
    # the decoder's message was taken, not printed
    assert "Invalid SOS parameters" not in capfd.readouterr().err


def test_other_stderr_output_during_a_decode_is_passed_on(capfd):
    import os

    from packer.decode_check import _decoder_messages

    with _decoder_messages() as found:
        os.write(2, b"someone else's line\nInvalid SOS parameters for sequential JPEG\n")
    assert found == ["Invalid SOS parameters for sequential JPEG"]
    assert capfd.readouterr().err == "someone else's line\n"


@pytest.mark.parametrize(
    "transform",
    [Transform(), Transform(encode="png"), Transform(short=4)],
    ids=["keep", "png", "resize"],
)
def test_float_tiff_is_refused_with_the_reason(tmp_path, transform):
    src = tree_with(tmp_path, {"a/float.tiff": float_tiff()})
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, transform=transform, progress=False))
    error = errors_of(out)["a/float.tiff"]
    assert error["reason"] == "undecodable"
    assert "float32 samples" in error["message"]
    assert "convert it to 8 or 16 bits" in error["message"]


def test_signed_16_bit_tiff_is_transformed_from_what_imread_gives(tmp_path):
    data = int16_tiff()
    src = tree_with(tmp_path, {"a/signed.tiff": data})
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, transform=Transform(encode="png"), progress=False))
    ds = open_dataset(out)
    i = paths_of(out).index("a/signed.tiff")
    imread = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), 4)
    assert np.array_equal(ds[i][0], imread)  # cv2.COLOR_BGR2RGB is 4


def test_verify_deep_decodes_as_the_default_reader(tmp_path, monkeypatch):
    """A float TIFF packed as it is (the build's check fooled into seeing 8-bit pixels):
    readers' default decode="rgb" cannot read it, so verify --deep reports it."""
    real = cv2.imdecode

    def as_uint8(buf: Any, flags: int) -> Any:
        image = real(buf, flags)
        return image.astype(np.uint8) if image is not None else None

    src = tree_with(tmp_path, {"a/float.tiff": float_tiff()})
    out = tmp_path / "out"
    monkeypatch.setattr(cv2, "imdecode", as_uint8)
    build(BuildConfig(src=src, out=out, progress=False))
    monkeypatch.undo()
    assert "a/float.tiff" not in errors_of(out)
    problems = verify(out, deep=True)
    assert len(problems) == 1
    assert "a/float.tiff" in problems[0]
    assert 'does not decode as readers decode by default (decode="rgb")' in problems[0]
    assert verify(out) == []


def test_verify_deep_of_a_bare_lmdb_decodes_as_the_default_reader(tmp_path):
    bare = tmp_path / "bare"
    env = lmdb.open(str(bare), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"image-000000001", float_tiff())
        txn.put(b"label-000000001", b"0")
        txn.put(b"num-samples", b"1")
    env.close()
    problems = verify(bare, deep=True)
    assert len(problems) == 1
    assert "does not decode" in problems[0]
