"""A zoo of bad and unusual inputs, built in both formats: exact reason codes, every good image
packed once with its original bytes, the index telling the truth, and verify passing."""

from __future__ import annotations

import io
import json
import os
import struct
import unicodedata
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

import packer.build
from packer import prepare as prepare_module
from packer import source
from packer.build import build
from packer.config import BuildConfig
from packer.prepare import prepare_record
from packer.probe import exif_orientation, image_size, probe_header
from packer.problems import NOTE_REASONS, Note, Problem
from packer.records import Record
from packer.scan import name_collisions
from packer.source import read_source
from packer.transform import Transform, apply_orientation
from packer.verify import verify
from readers import open_dataset
from readers.formats.images import sniff_format
from readers.formats.layout import WARNINGS_NAME

FORMATS = ("lmdb", "recordio")
RNG = np.random.default_rng(7)

# --------------------------------------------------------------------------------------------
# Images written from the format specifications (PNG chunks, JPEG APP1), not through our code


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(
    width: int,
    height: int,
    *,
    color_type: int,
    depth: int = 8,
    palette: bytes = b"",
    trns: bytes | None = None,
    exif: bytes | None = None,
    rows: bytes | None = None,
) -> bytes:
    """A PNG: IHDR, [eXIf], [PLTE], [tRNS], one IDAT of filter-0 rows, IEND."""
    samples = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    row_bytes = (width * samples * depth + 7) // 8
    if rows is None:
        raw = RNG.integers(0, 256, (height, row_bytes), dtype=np.uint8)
        if color_type == 3:
            raw %= max(1, len(palette) // 3)
        rows = b"".join(b"\x00" + r.tobytes() for r in raw)
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0))
    if exif is not None:
        out += png_chunk(b"eXIf", exif)
    if palette:
        out += png_chunk(b"PLTE", palette)
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    out += png_chunk(b"IDAT", zlib.compress(rows))
    return out + png_chunk(b"IEND", b"")


def tiff_orientation(orientation: int) -> bytes:
    """A big-endian TIFF header whose IFD0 holds only the Orientation tag (0x0112, SHORT)."""
    entry = struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)
    return b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 1) + entry + struct.pack(">I", 0)


def with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """`jpeg` with an APP1 Exif segment carrying the orientation, right after SOI."""
    body = b"Exif\x00\x00" + tiff_orientation(orientation)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def cv_encode(image: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def pil_encode(image: Image.Image, fmt: str) -> bytes:
    f = io.BytesIO()
    image.save(f, fmt)
    return f.getvalue()


def pixels(width: int, height: int, channels: int = 3, dtype: Any = np.uint8) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    high = 256 if dtype == np.uint8 else 65536
    return RNG.integers(0, high, shape, dtype=dtype)


def patched_jpeg_size(jpeg: bytes, width: int, height: int) -> bytes:
    """A JPEG whose SOF claims another size (the rest of the file unchanged)."""
    pos = 2
    while True:
        marker = jpeg[pos + 1]
        (length,) = struct.unpack_from(">H", jpeg, pos + 2)
        if marker in (0xC0, 0xC1, 0xC2):
            return jpeg[: pos + 5] + struct.pack(">HH", height, width) + jpeg[pos + 9 :]
        pos += 2 + length


NFC = unicodedata.normalize("NFC", "caf\u00e9.png")
NFD = unicodedata.normalize("NFD", "caf\u00e9.png")

# Every good image of the zoo: relative path -> bytes (each must be packed once, unchanged).
GOOD: dict[str, bytes] = {
    "plain/ok.png": cv_encode(pixels(9, 7), ".png"),
    "plain/ok.jpg": cv_encode(pixels(9, 7), ".jpg"),
    "plain/ok.bmp": cv_encode(pixels(5, 4), ".bmp"),
    "plain/ok.webp": cv_encode(pixels(6, 5), ".webp"),
    "plain/ok.tiff": cv_encode(pixels(6, 3), ".tiff"),
    "plain/ok.ppm": cv_encode(pixels(4, 6), ".ppm"),
    "plain/ok.pgm": cv_encode(pixels(4, 6, 1), ".pgm"),
    "png/rgb16.png": cv_encode(pixels(7, 5, 3, np.uint16), ".png"),
    "png/gray16.png": png(6, 4, color_type=0, depth=16),
    "png/gray16_trns.png": png(6, 4, color_type=0, depth=16, trns=b"\x00\x05"),
    "png/palette.png": png(8, 3, color_type=3, palette=bytes(range(12))),
    "png/palette_trns.png": png(8, 3, color_type=3, palette=bytes(range(12)), trns=b"\x00\x80"),
    "png/rgba.png": png(5, 5, color_type=6),
    "png/gray.png": png(5, 3, color_type=0),
    "png/gray_alpha.png": png(5, 3, color_type=4),
    "png/gray_trns.png": png(5, 3, color_type=0, trns=b"\x00\x07"),
    "png/rgb_trns.png": png(5, 3, color_type=2, trns=b"\x00\x01\x00\x02\x00\x03"),
    "png/gray1bit.png": png(9, 2, color_type=0, depth=1),
    "png/orient8.png": png(6, 4, color_type=2, exif=tiff_orientation(8)),
    "jpeg/gray.jpg": cv_encode(pixels(8, 6, 1), ".jpg"),
    "jpeg/cmyk.jpg": pil_encode(Image.fromarray(pixels(8, 6)).convert("CMYK"), "JPEG"),
    "jpeg/orient6.jpg": with_exif_orientation(cv_encode(pixels(10, 4), ".jpg"), 6),
    "jpeg/orient3.jpg": with_exif_orientation(cv_encode(pixels(10, 4), ".jpg"), 3),
    "jpeg/orient1.jpg": with_exif_orientation(cv_encode(pixels(10, 4), ".jpg"), 1),
    "mismatch/really_png.jpg": cv_encode(pixels(4, 4), ".png"),
    "mismatch/really_jpeg.png": cv_encode(pixels(4, 4), ".jpg"),
    "mismatch/no_extension": cv_encode(pixels(4, 4), ".png"),
    "case/A.png": cv_encode(pixels(3, 3), ".png"),
    "case/a.png": cv_encode(pixels(3, 3), ".png"),
    f"unicode/{NFC}": cv_encode(pixels(3, 3), ".png"),
    f"unicode/{NFD}": cv_encode(pixels(3, 3), ".png"),
}
# Replaced after the scan, before the read: packed in the state it is read in.
REWRITTEN = ("late/rewritten.png", cv_encode(pixels(11, 13), ".png"))

# Every bad input: relative path -> bytes, and the reason code it must get.
BAD: dict[str, tuple[bytes, str]] = {
    "bad/empty.png": (b"", "empty"),
    "bad/garbage.jpg": (b"not an image at all", "not_image"),
    "bad/cut.jpg": (GOOD["plain/ok.jpg"][:-40], "truncated"),
    "bomb/huge.png": (png(100_000, 100_000, color_type=0, rows=b"\x00" * 64), "too_many_pixels"),
    "bomb/huge.jpg": (patched_jpeg_size(GOOD["plain/ok.jpg"], 60_000, 60_000), "too_many_pixels"),
    "bomb/huge.bmp": (
        GOOD["plain/ok.bmp"][:18] + struct.pack("<ii", 40_000, 40_000) + GOOD["plain/ok.bmp"][26:],
        "too_many_pixels",
    ),
    "bomb/zero.png": (png(0, 5, color_type=0, rows=b""), "undecodable"),
}
# Present at the scan, gone (or no longer a file) at the read.
VANISHING = {"late/vanished.png": "unreadable", "late/now_a_fifo.png": "not_regular"}

# The notes (packed with a caveat) that the zoo must produce: path -> reason.
NOTES = {
    "jpeg/orient6.jpg": "exif_orientation",
    "jpeg/orient3.jpg": "exif_orientation",
    "png/orient8.png": "exif_orientation",
    "mismatch/really_png.jpg": "extension_mismatch",
    "mismatch/really_jpeg.png": "extension_mismatch",
    "case/a.png": "name_collision",
    f"unicode/{sorted([NFC, NFD])[1]}": "name_collision",
}


def write_zoo(src: Path) -> None:
    for rel, data in {**GOOD, **{k: v for k, (v, _) in BAD.items()}}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    for rel in [REWRITTEN[0], *VANISHING]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(GOOD["plain/ok.png"])


PLAN_LABELS = packer.build.plan_labels


def after_scan(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """Run `change` once the build has planned its inputs and before it reads any of them."""

    def plan_then_change(*args: Any, **kwargs: Any) -> Any:
        plan = PLAN_LABELS(*args, **kwargs)
        change()
        return plan

    monkeypatch.setattr(packer.build, "plan_labels", plan_then_change)


def disturb(src: Path) -> None:
    (src / REWRITTEN[0]).write_bytes(REWRITTEN[1])
    (src / "late/vanished.png").unlink()
    (src / "late/now_a_fifo.png").unlink()
    os.mkfifo(src / "late/now_a_fifo.png")


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def build_zoo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, **options: Any
) -> tuple[Path, Path]:
    src = tmp_path / "src"
    if not src.exists():
        write_zoo(src)
    else:  # a second build of the same tree: undo the first one's disturbance
        for rel in [REWRITTEN[0], *VANISHING]:
            (src / rel).unlink(missing_ok=True)
            (src / rel).write_bytes(GOOD["plain/ok.png"])
    out = tmp_path / f"out-{fmt}-{len(list(tmp_path.iterdir()))}"
    after_scan(monkeypatch, lambda: disturb(src))
    build(BuildConfig(src=src, out=out, format=fmt, labels="none", **options))
    return src, out


# --------------------------------------------------------------------------------------------
# The zoo, built in both formats


@pytest.mark.parametrize("fmt", FORMATS)
def test_zoo_reasons_bytes_and_verify(tmp_path, monkeypatch, fmt):
    _src, out = build_zoo(tmp_path, monkeypatch, fmt)

    errors = {e["path"]: e["reason"] for e in jsonl(out / "errors.jsonl")}
    assert errors == {**{k: reason for k, (_, reason) in BAD.items()}, **VANISHING}
    messages = {e["path"]: e["message"] for e in jsonl(out / "errors.jsonl")}
    assert messages["late/vanished.png"] == "vanished after the scan"
    assert "100000x100000 = 10000000000 pixels" in messages["bomb/huge.png"]

    expected = {**GOOD, REWRITTEN[0]: REWRITTEN[1]}
    rows = jsonl(out / "index.jsonl")
    assert sorted(r["path"] for r in rows) == sorted(expected)  # each exactly once
    ds = open_dataset(out, decode="bytes")
    for row in rows:
        data = expected[row["path"]]
        assert ds.read_bytes(row["id"]) == data  # the original bytes
        assert row["crc32"] == zlib.crc32(data)
        assert row["format"] == sniff_format(data[:16])
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        channels = 1 if image.ndim == 2 else image.shape[2]
        assert (row["width"], row["height"], row["channels"]) == (
            image.shape[1],
            image.shape[0],
            channels,
        ), row["path"]
    assert verify(out) == []
    assert verify(out, deep=True) == []


def test_zoo_index_is_the_same_without_decode_check(tmp_path, monkeypatch):
    """The header probe answers what the decode answers: channels of CMYK JPEG, palette and
    gray+alpha PNG, tRNS, 16-bit."""
    _, decoded = build_zoo(tmp_path, monkeypatch, "lmdb")
    _, probed = build_zoo(tmp_path, monkeypatch, "lmdb", decode_check=False)
    fields = ("path", "width", "height", "channels", "format", "nbytes", "crc32")
    a = [{k: r[k] for k in fields} for r in jsonl(decoded / "index.jsonl")]
    b = [{k: r[k] for k in fields} for r in jsonl(probed / "index.jsonl")]
    assert a == b
    # without a decode, an undecodable image that the header cannot expose is packed; none of
    # the zoo's bad inputs is of that kind, so the errors agree as well
    assert jsonl(decoded / "errors.jsonl") == jsonl(probed / "errors.jsonl")


def test_zoo_notes_from_prepare_and_name_collisions(tmp_path):
    src = tmp_path / "src"
    write_zoo(src)
    notes: dict[str, str] = {}
    for rel in sorted(GOOD):
        item = prepare_record(rel, str(src / rel), None)
        assert isinstance(item, Record), rel
        assert item.data == GOOD[rel]
        for note in item.notes:
            assert isinstance(note, Note)
            notes[note.path] = note.reason
    for note in name_collisions(sorted(GOOD)):
        notes[note.path] = note.reason
    assert notes == NOTES
    assert set(notes.values()) <= NOTE_REASONS


@pytest.mark.parametrize("fmt", FORMATS)
def test_zoo_notes_are_listed_in_warnings_jsonl(tmp_path, monkeypatch, fmt):
    _, out = build_zoo(tmp_path, monkeypatch, fmt)
    warnings_path = out / WARNINGS_NAME
    assert warnings_path.exists()
    found = jsonl(warnings_path)
    assert {w["path"]: w["reason"] for w in found} == NOTES
    rows = {r["path"]: r["id"] for r in jsonl(out / "index.jsonl")}
    for w in found:
        assert w["packed"] is True
        if w["reason"] != "name_collision":  # found per record: its sample id is known
            assert w["id"] == rows[w["path"]]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_errors"] == len(BAD) + len(VANISHING)  # skipped inputs only


# --------------------------------------------------------------------------------------------
# Each policy on its own


def test_extension_mismatch_is_packed_by_content():
    item = prepare_bytes("x/really_png.jpg", GOOD["mismatch/really_png.jpg"])
    assert isinstance(item, Record)
    assert item.format == "png"
    assert [(n.reason, n.message) for n in item.notes] == [
        (
            "extension_mismatch",
            "the name says JPEG but the content is PNG; packed as PNG (the index's format)",
        )
    ]
    assert prepare_bytes("x/ok.jpe", GOOD["plain/ok.jpg"]).notes == ()  # type: ignore[union-attr]
    assert prepare_bytes("x/ok.bin", GOOD["plain/ok.jpg"]).notes == ()  # type: ignore[union-attr]


_tmp_counter = iter(range(10**6))


def prepare_bytes(rel: str, data: bytes, **kwargs: Any) -> Record | Problem:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"f{next(_tmp_counter)}"
        path.write_bytes(data)
        return prepare_record(rel, str(path), None, **kwargs)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".webp", ".tiff", ".ppm", ".pgm"])
def test_image_size_from_the_header_matches_the_decode(ext):
    image = pixels(37, 23, 1 if ext == ".pgm" else 3)
    data = cv_encode(image, ext)
    fmt = sniff_format(data[:16])
    assert fmt is not None
    assert image_size(data, fmt) == (37, 23)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_webp_lossless_and_extended_headers(mode):
    image = Image.fromarray(pixels(29, 17, {"RGB": 3, "RGBA": 4, "L": 1}[mode]))
    for kwargs in ({"lossless": True}, {"quality": 80}):
        f = io.BytesIO()
        image.save(f, "WEBP", **kwargs)
        assert image_size(f.getvalue(), "webp") == (29, 17)


@pytest.mark.parametrize(
    "ext", [".png", ".jpg", ".bmp", ".webp", ".tiff", ".ppm"], ids=lambda e: e[1:]
)
def test_max_pixels_refuses_from_the_header_in_every_format(ext, monkeypatch):
    data = cv_encode(pixels(20, 10), ext)
    decoded: list[bytes] = []
    real = prepare_module._decode_unchanged
    monkeypatch.setattr(prepare_module, "_decode_unchanged", lambda d: decoded.append(d) or real(d))
    check = prepare_module._check_unchanged
    monkeypatch.setattr(
        prepare_module, "_check_unchanged", lambda d, f: decoded.append(d) or check(d, f)
    )
    for transform in (Transform(max_pixels=199), Transform(max_pixels=199, encode="png")):
        item = prepare_bytes(f"a{ext}", data, transform=transform)
        assert isinstance(item, Problem)
        assert item.reason == "too_many_pixels"
        assert "20x10 = 200 pixels, above --max-pixels 199" in item.message
    assert decoded == []  # refused before any decode
    assert isinstance(prepare_bytes(f"a{ext}", data, transform=Transform(max_pixels=200)), Record)
    assert isinstance(prepare_bytes(f"a{ext}", data, transform=Transform(max_pixels=None)), Record)


def test_max_pixels_option_reaches_meta_and_is_validated(tmp_path):
    from typer.testing import CliRunner

    from packer.cli import app

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "big.png").write_bytes(cv_encode(pixels(30, 30), ".png"))
    (src / "a" / "small.png").write_bytes(cv_encode(pixels(10, 10), ".png"))
    result = CliRunner().invoke(
        app, ["build", str(src), str(tmp_path / "out"), "--max-pixels", "500"]
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["options"]["max_pixels"] == 500
    assert [e["reason"] for e in jsonl(tmp_path / "out" / "errors.jsonl")] == ["too_many_pixels"]
    result = CliRunner().invoke(
        app, ["build", str(src), str(tmp_path / "o2"), "--max-pixels", "-1"]
    )
    assert result.exit_code == 2
    assert "--max-pixels -1" in result.output
    with pytest.raises(ValueError, match="max-pixels"):
        Transform(max_pixels=0)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_matches_opencv(orientation):
    jpeg = with_exif_orientation(cv_encode(pixels(10, 4), ".jpg"), orientation)
    assert exif_orientation(jpeg, "jpeg") == orientation
    stored = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_UNCHANGED)
    shown = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(apply_orientation(stored, orientation), shown)


def test_exif_orientation_is_found_in_png_and_webp_and_absent_elsewhere():
    assert exif_orientation(GOOD["png/orient8.png"], "png") == 8
    assert exif_orientation(GOOD["plain/ok.png"], "png") is None
    assert exif_orientation(GOOD["plain/ok.jpg"], "jpeg") is None
    f = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 5
    Image.fromarray(pixels(6, 4)).save(f, "WEBP", exif=exif.tobytes())
    assert exif_orientation(f.getvalue(), "webp") == 5
    assert exif_orientation(b"\xff\xd8\xff\xe1\x00\x08Exif\x00\x00", "jpeg") is None  # cut short


@pytest.mark.parametrize("fmt", FORMATS)
def test_exif_orientation_kept_readers_rotate_like_imread(tmp_path, fmt):
    """keep: bytes unchanged, index = stored grid; ds[i] = cv2.imread of the loose file (rotated);
    decode='unchanged' = the stored grid."""
    src = tmp_path / "src"
    src.mkdir()
    data = GOOD["jpeg/orient6.jpg"]
    (src / "photo.jpg").write_bytes(data)
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, format=fmt, labels="none"))
    (row,) = jsonl(out / "index.jsonl")
    assert (row["width"], row["height"]) == (10, 4)  # as stored
    image, _ = open_dataset(out)[0]
    loose = cv2.cvtColor(cv2.imread(str(src / "photo.jpg")), cv2.COLOR_BGR2RGB)
    assert image.shape == (10, 4, 3)  # rotated: the index's height and width swapped
    np.testing.assert_array_equal(image, loose)
    stored, _ = open_dataset(out, decode="unchanged")[0]
    assert stored.shape[:2] == (row["height"], row["width"])
    assert open_dataset(out, decode="bytes")[0][0] == data


@pytest.mark.parametrize("encode_as", ["png", "jpeg", "raw"])
def test_exif_orientation_applied_when_re_encoded(tmp_path, encode_as):
    """Re-encoding drops the tag, so the orientation is applied first: the stored image is
    upright, the index gives its size, and readers return the same picture as before."""
    data = GOOD["jpeg/orient6.jpg"]
    item = prepare_bytes("p.jpg", data, transform=Transform(encode=encode_as))
    assert isinstance(item, Record)
    assert (item.width, item.height) == (4, 10)
    assert [n.reason for n in item.notes] == ["exif_orientation"]
    assert "applied at pack time" in item.notes[0].message
    if encode_as == "png":
        shown = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        stored = cv2.imdecode(np.frombuffer(item.data, np.uint8), cv2.IMREAD_COLOR)
        np.testing.assert_array_equal(stored, shown)


def test_sixteen_bit_png_kept_readers_give_uint8_or_uint16(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "deep.png").write_bytes(GOOD["png/rgb16.png"])
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels="none"))
    (row,) = jsonl(out / "index.jsonl")
    assert (row["width"], row["height"], row["channels"]) == (7, 5, 3)
    assert open_dataset(out)[0][0].dtype == np.uint8
    assert open_dataset(out, decode="unchanged")[0][0].dtype == np.uint16


@pytest.mark.parametrize(
    ("rel", "channels"),
    [
        ("png/palette.png", 3),
        ("png/palette_trns.png", 4),
        ("png/gray_alpha.png", 4),
        ("png/gray_trns.png", 1),
        ("png/rgb_trns.png", 4),
        ("png/gray16_trns.png", 1),
        ("png/rgba.png", 4),
        ("jpeg/cmyk.jpg", 3),
        ("jpeg/gray.jpg", 1),
    ],
)
def test_probe_header_channels_are_what_opencv_returns(rel, channels):
    data = GOOD[rel]
    fmt = sniff_format(data[:16])
    assert fmt is not None
    probed = probe_header(data, fmt)
    assert probed is not None
    assert probed[2] == channels
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert probed == (image.shape[1], image.shape[0], 1 if image.ndim == 2 else image.shape[2])


def test_name_collisions_by_case_and_normalization():
    assert name_collisions(["a.png", "b.png", "A/b.png", "a/b.png.jpg"]) == []
    found = name_collisions(["x/A.png", "x/a.png", "x/B.PNG", "x/b.png", NFC, NFD, "y/\u00c9"])
    first, second = sorted([NFC, NFD])
    assert [(n.path, n.reason) for n in found] == sorted(
        [("x/a.png", "name_collision"), ("x/b.png", "name_collision"), (second, "name_collision")]
    )
    by_path = {n.path: n.message for n in found}
    assert "collides with 'x/A.png' (a name that differs only by letter case)" in by_path["x/a.png"]
    assert f"another Unicode normalization form: {first!a}, {second!a}" in by_path[second]
    # three spellings of one name: the sorted first is packed without a note
    found = name_collisions([NFC, NFD, "CAF\u00c9.png"])
    assert sorted(n.path for n in found) == sorted([NFC, NFD])


def test_read_source_reports_a_file_that_changes_while_read(tmp_path, monkeypatch):
    path = tmp_path / "growing.png"
    path.write_bytes(GOOD["plain/ok.png"])
    real = source.read_all

    def read_then_append(fd: int, size_hint: int) -> bytes:
        data = real(fd, size_hint)
        with open(path, "ab") as f:
            f.write(b"more")
        return data

    monkeypatch.setattr(source, "read_all", read_then_append)
    found = read_source(str(path), "growing.png")
    assert isinstance(found, Problem)
    assert found.reason == "changed"
    assert "changed while being read" in found.message
    monkeypatch.undo()
    assert read_source(str(path), "growing.png") == GOOD["plain/ok.png"] + b"more"


def test_read_source_never_blocks_on_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    found = read_source(str(tmp_path / "pipe.png"), "pipe.png")
    assert isinstance(found, Problem)
    assert found.reason == "not_regular"


@pytest.mark.parametrize("name", ["plain/ok.bmp", "plain/ok.jpg"])
def test_opencv_exceptions_are_undecodable(monkeypatch, name):
    """(A PNG is proven whole without OpenCV: packer.png_stream; the decode check of a BMP
    decodes it, of a JPEG decodes it at 1/8 scale, then in full.)"""

    def boom(*_args: Any) -> None:
        raise cv2.error("bad header")

    monkeypatch.setattr(prepare_module.cv2, "imdecode", boom)
    item = prepare_bytes(name, GOOD[name])
    assert isinstance(item, Problem)
    assert item.reason == "undecodable"


def test_a_record_without_notes_is_unchanged_for_writers():
    item = prepare_bytes("a.png", GOOD["plain/ok.png"])
    assert isinstance(item, Record)
    assert item.notes == ()
    assert Note("a", "extension_mismatch", "m").as_json(3) == {
        "path": "a",
        "reason": "extension_mismatch",
        "message": "m",
        "packed": True,
        "id": 3,
    }
