"""``packer build --encode raw --compress lz4|zstd``: raw pixels stored compressed, the index's
``compression`` on each record, the same pixels read back (through a real DataLoader) and
checked by ``verify --deep`` as from an uncompressed raw build; ``--compress`` without
``--encode raw`` refused; ``--resume`` and ``packer info`` aware of it."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.info import describe
from packer.verify import verify
from readers import open_dataset
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from tests.conftest import write_tree

runner = CliRunner()
FORMATS = ("lmdb", "recordio")
CODECS = ("lz4", "zstd")


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / INDEX_NAME).read_text().splitlines()]


def packer_build(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["build", str(src), str(out), "--no-progress", *extra])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Smooth images (they compress), PNG and JPEG, colour and grey, and one RGBA PNG."""
    import cv2

    src = tmp_path_factory.mktemp("compress") / "src"
    rng = np.random.default_rng(5)
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(5):
            channels = (3, 1, 4)[i % 3]
            shape = (16 + i, 20, channels) if channels > 1 else (16 + i, 20)
            noise = rng.integers(0, 256, shape, dtype=np.uint8)
            image = cv2.GaussianBlur(noise, (7, 7), 0)
            ext = ".jpg" if channels != 4 and i % 2 else ".png"
            ok, buf = cv2.imencode(ext, image)
            assert ok
            (src / cls / f"{i}{ext}").write_bytes(buf.tobytes())
    return src


@pytest.fixture(scope="module")
def builds(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(format, compress) -> OUT, for compress none, lz4 and zstd (with --encode raw)."""
    base = tmp_path_factory.mktemp("builds")
    out = {}
    for fmt in FORMATS:
        for codec in ("none", *CODECS):
            path = base / f"{codec}.{fmt}"
            code, output = packer_build(
                source, path, "--format", fmt, "--encode", "raw", "--compress", codec
            )
            assert code == 0, output
            out[(fmt, codec)] = path
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("codec", CODECS)
def test_index_lines_carry_the_compression_of_the_stored_bytes(builds, fmt, codec):
    plain, squeezed = rows(builds[(fmt, "none")]), rows(builds[(fmt, codec)])
    assert all("compression" not in row for row in plain)
    assert [row["compression"] for row in squeezed] == [codec] * len(plain)
    ds = open_dataset(builds[(fmt, codec)], decode="bytes")
    for i, (row, before) in enumerate(zip(squeezed, plain, strict=True)):
        stored = ds[i][0]
        assert (row["format"], row["width"], row["height"], row["channels"]) == (
            before["format"],
            before["width"],
            before["height"],
            before["channels"],
        )
        # nbytes and crc32 are of the stored (compressed) bytes
        assert row["nbytes"] == len(stored)
        assert row["crc32"] == zlib.crc32(stored)
        raw = open_dataset(builds[(fmt, "none")], decode="bytes")[i][0]
        assert pa.Codec(codec).decompress(stored, len(raw), asbytes=True) == raw
    meta = json.loads((builds[(fmt, codec)] / META_NAME).read_text())
    assert meta["options"]["compress"] == codec
    assert "compress" not in json.loads((builds[(fmt, "none")] / META_NAME).read_text())["options"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_parquet_has_a_compression_column_only_when_compressed(builds, fmt):
    assert "compression" not in pq.read_schema(builds[(fmt, "none")] / INDEX_COLUMNAR_NAME).names
    table = pq.read_table(builds[(fmt, "lz4")] / INDEX_COLUMNAR_NAME)
    assert set(table.column("compression").to_pylist()) == {"lz4"}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("mode", ["rgb", "gray", "unchanged"])
def test_readers_return_the_pixels_of_an_uncompressed_raw_build(builds, fmt, codec, mode):
    plain = open_dataset(builds[(fmt, "none")], decode=mode)
    squeezed = open_dataset(builds[(fmt, codec)], decode=mode)
    assert len(plain) == len(squeezed) == 10
    for i in range(len(plain)):
        (a, la), (b, lb) = plain[i], squeezed[i]
        assert la == lb
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataloader_with_workers_reads_compressed_pixels(builds, fmt):
    paddle = pytest.importorskip("paddle")
    plain = open_dataset(builds[(fmt, "none")])
    expected = [plain[i][0] for i in range(len(plain))]
    ds = open_dataset(builds[(fmt, "lz4")])
    loader = paddle.io.DataLoader(
        ds, batch_size=1, shuffle=False, num_workers=2, collate_fn=lambda batch: batch
    )
    got = [image for batch in loader for image, _label in batch]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("codec", CODECS)
def test_verify_deep_decompresses_and_checks_the_pixels(builds, fmt, codec):
    assert verify(builds[(fmt, codec)], deep=True) == []


def _edit_first_row(out: Path, **changes: Any) -> None:
    lines = (out / INDEX_NAME).read_text().splitlines()
    row = json.loads(lines[0])
    row.update(changes)
    lines[0] = json.dumps(row, separators=(",", ":"))
    (out / INDEX_NAME).write_text("\n".join(lines) + "\n")
    meta = json.loads((out / META_NAME).read_text())
    meta.pop("index_sha256", None)  # the edit is the point: not reported as one
    (out / META_NAME).write_text(json.dumps(meta))
    (out / INDEX_COLUMNAR_NAME).unlink(missing_ok=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("codec", CODECS)
def test_verify_reports_compressed_bytes_that_do_not_give_the_pixels(builds, fmt, codec, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(builds[(fmt, codec)], out)
    height = rows(out)[0]["height"]
    for wrong in (height + 1, height - 1):  # the index's dimensions give another pixel count
        _edit_first_row(out, height=wrong)
        problems = verify(out, deep=True)
        if fmt == "lmdb":  # the shard's wh- key no longer agrees with the index either
            assert problems[1:] == [
                f"shard-00000 sample 0 (image-000000001, {rows(out)[0]['path']}): wh-000000001 "
                f"is b'{rows(out)[0]['width']}_{height}', the index says "
                f"{rows(out)[0]['width']}_{wrong} (width_height)"
            ]
            problems = problems[:1]
        assert len(problems) == 1
        assert "sample 0" in problems[0]
        size = wrong * rows(out)[0]["width"] * rows(out)[0]["channels"]
        assert f"cannot decompress {codec} to {size} bytes" in problems[0]
    _edit_first_row(out, height=height, compression="brotli")
    problems = verify(out)
    assert len(problems) == 1
    assert "compression is 'brotli', expected one of lz4, zstd" in problems[0]


def test_compress_with_another_encode_exits_2_naming_the_fix(source, tmp_path):
    for encode in ("keep", "png", "jpeg"):
        code, output = packer_build(
            source, tmp_path / "out", "--encode", encode, "--compress", "lz4"
        )
        assert code == 2
        assert f"--compress lz4 compresses raw pixels, but --encode is {encode}" in output
        assert "add --encode raw, or drop --compress" in output
    code, output = packer_build(source, tmp_path / "out", "--compress", "zstd")
    assert code == 2
    assert "add --encode raw" in output
    code, output = packer_build(source, tmp_path / "out", "--encode", "raw", "--compress", "gz")
    assert code == 2
    assert "--compress 'gz': expected one of none, lz4, zstd" in output
    assert not (tmp_path / "out").exists()


def test_resume_names_a_compress_that_differs(source, builds, tmp_path):
    import shutil

    for built, now in (("lz4", "none"), ("none", "zstd"), ("lz4", "zstd")):
        out = tmp_path / f"{built}-{now}"
        shutil.copytree(builds[("lmdb", built)], out)
        code, output = packer_build(source, out, "--encode", "raw", "--compress", now, "--resume")
        assert code == 2, output
        assert f"--compress is {built!r} in OUT, {now!r} now" in output
    out = tmp_path / "same"
    shutil.copytree(builds[("lmdb", "zstd")], out)
    code, output = packer_build(source, out, "--encode", "raw", "--compress", "zstd", "--resume")
    assert code == 0, output
    assert "already complete" in output


def test_info_shows_the_stored_size_per_format_and_compression(builds, tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a": 4})  # PNG and JPEG, kept as they are
    kept = tmp_path / "kept"
    assert packer_build(src, kept)[0] == 0
    stored = describe(kept)["stored"]
    by_format = {r["format"]: 0 for r in rows(kept)}
    for r in rows(kept):
        by_format[r["format"]] += r["nbytes"]
    assert {k: v["bytes"] for k, v in stored.items()} == by_format
    assert all("pixel_bytes" not in v for v in stored.values())

    summary = describe(builds[("lmdb", "lz4")])
    all_rows = rows(builds[("lmdb", "lz4")])
    pixels = sum(r["width"] * r["height"] * r["channels"] for r in all_rows)
    assert summary["stored"] == {
        "raw+lz4": {
            "samples": 10,
            "bytes": sum(r["nbytes"] for r in all_rows),
            "pixel_bytes": pixels,
        }
    }
    result = runner.invoke(app, ["info", str(builds[("lmdb", "lz4")])])
    assert result.exit_code == 0
    share = 100 * summary["stored"]["raw+lz4"]["bytes"] / pixels
    assert f"stored:   raw+lz4 10 (0.0 MB, {share:.0f}% of the pixels)" in result.output
    plain = runner.invoke(app, ["info", str(builds[("lmdb", "none")])])
    assert "stored:   raw 10 (0.0 MB)" in plain.output
