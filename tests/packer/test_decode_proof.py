"""The build's cheaper decode check (`packer.decode_check.check_source`: a JPEG decoded at 1/8
scale, a PNG proven by its inflated stream) gives exactly the verdict, message, caveats and
width/height/channels of the full decode (`decode_source`) on a corpus of whole and damaged
files, and takes the cheap path on whole ones."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from packer import decode_check, prepare
from packer.decode_check import Checked, check_source, decode_source
from packer.png_stream import prove_png
from packer.prepare import prepare_record
from packer.problems import Problem
from packer.records import Record

RNG = np.random.default_rng(23)

# --------------------------------------------------------------------------------------------
# PNGs written from the specification (chunks, Adam7 passes), not through OpenCV

SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2))
ADAM7 += ((0, 1, 1, 2),)


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def scanlines(image: np.ndarray, depth: int) -> bytes:
    """Filter-0 rows of `image` (H x W x samples, values < 2**depth)."""
    out = b""
    for row in image:
        if depth < 8:
            bits = np.unpackbits(row.astype(np.uint8).reshape(-1, 1), axis=1)[:, 8 - depth :]
            out += b"\x00" + np.packbits(bits.reshape(-1)).tobytes()
        else:
            out += b"\x00" + row.astype(">u2" if depth == 16 else np.uint8).tobytes()
    return out


def png_rows(width: int, height: int, color_type: int, depth: int, interlace: int) -> bytes:
    top = 4 if color_type == 3 else 1 << depth
    image = RNG.integers(0, top, (height, width, SAMPLES[color_type]))
    if not interlace:
        return scanlines(image, depth)
    return b"".join(
        scanlines(image[y0::dy, x0::dx], depth)
        for x0, y0, dx, dy in ADAM7
        if image[y0::dy, x0::dx].size
    )


def make_png(
    width: int = 13,
    height: int = 11,
    color_type: int = 2,
    depth: int = 8,
    *,
    interlace: int = 0,
    plte: bytes | None = None,
    trns: bytes | None = None,
    rows: bytes | None = None,
    stream: bytes | None = None,
    split: int = 0,
    before_idat: bytes = b"",
) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, interlace)
    if rows is None:
        rows = png_rows(width, height, color_type, depth, interlace)
    if stream is None:
        stream = zlib.compress(rows)
    if color_type == 3 and plte is None:
        plte = bytes(range(12))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + before_idat
    if plte:
        out += chunk(b"PLTE", plte)
    if trns is not None:
        out += chunk(b"tRNS", trns)
    parts = [stream[i : i + split] for i in range(0, len(stream), split)] if split else [stream]
    return out + b"".join(chunk(b"IDAT", p) for p in parts) + chunk(b"IEND", b"")


def chunk_positions(data: bytes) -> list[tuple[int, bytes, int]]:
    """(start, type, body length) of each chunk."""
    pos, found = 8, []
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        found.append((pos, data[pos + 4 : pos + 8], length))
        pos += 12 + length
    return found


def fix_crc(data: bytes, start: int) -> bytes:
    (length,) = struct.unpack_from(">I", data, start)
    end = start + 8 + length
    return data[:end] + struct.pack(">I", zlib.crc32(data[start + 4 : end])) + data[end + 4 :]


def whole_pngs() -> dict[str, bytes]:
    smooth = cv2.GaussianBlur(RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8), (5, 5), 0)
    return {
        "rgb": make_png(),
        "opencv": cv2.imencode(".png", smooth)[1].tobytes(),
        "rgba": make_png(color_type=6),
        "gray": make_png(color_type=0),
        "gray1": make_png(19, color_type=0, depth=1),
        "gray4": make_png(7, color_type=0, depth=4),
        "gray16": make_png(color_type=0, depth=16),
        "rgb16": make_png(depth=16),
        "gray_alpha": make_png(color_type=4),
        "palette": make_png(color_type=3),
        "palette2": make_png(9, color_type=3, depth=2),
        "palette_trns": make_png(color_type=3, trns=b"\x00\x80"),
        "rgb_trns": make_png(trns=b"\x00\x01\x00\x02\x00\x03"),
        "gray_trns": make_png(color_type=0, trns=b"\x00\x07"),
        "interlaced": make_png(17, 9, interlace=1),
        "interlaced_tiny": make_png(3, 2, interlace=1),
        "interlaced_gray2": make_png(11, 5, 0, 2, interlace=1),
        "interlaced_rgba16": make_png(6, 7, 6, 16, interlace=1),
        "many_idat": make_png(split=37),
        "text": make_png(before_idat=chunk(b"tEXt", b"k\x00v")),
        "unknown_ancillary": make_png(before_idat=chunk(b"abCd", b"xyz")),
    }


def damaged_pngs() -> Iterator[tuple[str, bytes]]:
    """Bit flips (in IDAT with its CRC fixed, in IDAT without, anywhere), a bad CRC on each
    chunk, and the hand-made faults: short, long and cut streams, bad filter bytes, a bad
    Adler-32, misplaced and unknown chunks, a missing or bad PLTE, an invalid IHDR."""
    rng = np.random.default_rng(5)
    for name, base in whole_pngs().items():
        chunks = chunk_positions(base)
        idats = [c for c in chunks if c[1] == b"IDAT"]
        for n in range(4):
            start, _kind, length = idats[int(rng.integers(len(idats)))]
            flipped = bytearray(base)
            flipped[start + 8 + int(rng.integers(length))] ^= 1 << int(rng.integers(8))
            yield f"{name}/idat_flip{n}", fix_crc(bytes(flipped), start)
            yield f"{name}/idat_flip_bad_crc{n}", bytes(flipped)
            anywhere = bytearray(base)
            anywhere[8 + int(rng.integers(len(base) - 8))] ^= 1 << int(rng.integers(8))
            yield f"{name}/flip{n}", bytes(anywhere)
        for start, kind, length in chunks:
            bad = bytearray(base)
            bad[start + 8 + length] ^= 0x55
            yield f"{name}/bad_crc_{kind.decode()}@{start}", bytes(bad)
    rows = png_rows(13, 11, 2, 8, 0)
    row_bytes = 1 + 13 * 3
    stream = zlib.compress(rows)
    yield "short_rows", make_png(rows=rows[:-row_bytes])
    yield "long_rows", make_png(rows=rows + rows[:row_bytes])
    for at, value in ((0, 5), (3 * row_bytes, 5), (5 * row_bytes, 255)):
        bad = bytearray(rows)
        bad[at] = value
        yield f"filter_{value}@{at}", make_png(rows=bytes(bad))
    yield "cut_stream", make_png(stream=stream[: len(stream) // 2])
    yield "no_adler", make_png(stream=stream[:-4])
    yield "bad_adler", make_png(stream=stream[:-4] + bytes(4))
    yield "garbage_after_stream", make_png(stream=stream + b"garbage")
    yield "raw_deflate", make_png(stream=stream[2:-4])
    flush = zlib.compressobj()
    yield "no_final_block", make_png(stream=flush.compress(rows) + flush.flush(zlib.Z_SYNC_FLUSH))
    split = make_png(split=40)
    second = [c for c in chunk_positions(split) if c[1] == b"IDAT"][1]
    yield "idat_split_by_text", split[: second[0]] + chunk(b"tEXt", b"a\x00b") + split[second[0] :]
    yield "idat_dropped", split[: second[0]] + split[second[0] + 12 + second[2] :]
    yield "empty_idat", split[: second[0]] + chunk(b"IDAT", b"") + split[second[0] :]
    yield "unknown_critical", make_png(before_idat=chunk(b"ABCD", b"xyz"))
    yield "apng", make_png(before_idat=chunk(b"acTL", struct.pack(">II", 1, 0)))
    yield "palette_missing", make_png(color_type=3, plte=b"")
    yield "palette_bad_length", make_png(color_type=3, plte=bytes(13))
    yield (
        "palette_index_out_of_range",
        make_png(color_type=3, rows=b"".join(b"\x00" + bytes([200] * 13) for _ in range(11))),
    )
    yield "palette_trns_too_long", make_png(color_type=3, trns=bytes(10))
    yield "rgb_with_palette", make_png(plte=bytes(range(12)))
    yield "gray_with_palette", make_png(color_type=0, plte=bytes(range(12)))
    yield "rgba_with_trns", make_png(color_type=6, trns=bytes(6))
    yield "rgb_depth4", make_png(depth=4, rows=b"".join(b"\x00" + bytes(20) for _ in range(11)))
    ihdr = struct.pack(">IIBBBBB", 13, 11, 8, 2, 0, 0, 0)
    rest = chunk(b"IDAT", stream) + chunk(b"IEND", b"")
    sig = b"\x89PNG\r\n\x1a\n"
    yield "two_ihdr", sig + chunk(b"IHDR", ihdr) * 2 + rest
    yield "ihdr_not_first", sig + chunk(b"tEXt", b"a\x00b") + chunk(b"IHDR", ihdr) + rest
    yield "ihdr_long", sig + chunk(b"IHDR", ihdr + b"\x00") + rest
    yield "bad_interlace", sig + chunk(b"IHDR", ihdr[:-1] + b"\x02") + rest
    yield "bad_compression", sig + chunk(b"IHDR", ihdr[:10] + b"\x01" + ihdr[11:]) + rest
    yield "iend_with_body", make_png()[:-12] + chunk(b"IEND", b"x")
    yield "after_iend", make_png() + b"trailing"


# --------------------------------------------------------------------------------------------
# JPEGs: OpenCV's and PIL's encoders, then damaged in their scans


def smooth(height: int, width: int, channels: int = 3) -> np.ndarray:
    noise = RNG.integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = cv2.GaussianBlur(noise, (7, 7), 0)
    return image if channels == 3 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)


def whole_jpegs() -> dict[str, bytes]:
    def cv(image: np.ndarray, *flags: int) -> bytes:
        return cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90, *flags])[1].tobytes()

    def pil(image: Image.Image, **options: Any) -> bytes:
        f = io.BytesIO()
        image.save(f, "JPEG", **options)
        return f.getvalue()

    return {
        "baseline": cv(smooth(48, 64)),
        "odd_size": cv(smooth(37, 53)),
        "gray": cv(smooth(40, 40, 1)),
        "progressive": cv(smooth(48, 64), cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
        "restart": cv(smooth(48, 64), cv2.IMWRITE_JPEG_RST_INTERVAL, 2),
        "444": cv(
            smooth(24, 40), cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444
        ),
        "cmyk": pil(Image.fromarray(smooth(30, 20)).convert("CMYK")),
        "optimized": pil(Image.fromarray(smooth(30, 20)), optimize=True),
    }


def damaged_jpegs() -> Iterator[tuple[str, bytes]]:
    """Bit flips and random bytes in the scan (corrupt Huffman data), zeroed runs, scans cut
    short (EOI appended, so the file is not merely truncated), bytes removed, header bytes."""
    rng = np.random.default_rng(9)
    for name, base in whole_jpegs().items():
        sos = base.find(b"\xff\xda")
        scan = sos + 2 + int.from_bytes(base[sos + 2 : sos + 4], "big")
        for n in range(12):
            flipped = bytearray(base)
            flipped[int(rng.integers(scan, len(base) - 2))] ^= 1 << int(rng.integers(8))
            yield f"{name}/scan_flip{n}", bytes(flipped)
        for n in range(6):
            changed = bytearray(base)
            changed[int(rng.integers(2, len(base) - 2))] = int(rng.integers(256))
            yield f"{name}/byte{n}", bytes(changed)
        for n in range(3):
            zeroed = bytearray(base)
            at, length = int(rng.integers(scan, len(base) - 40)), int(rng.integers(1, 60))
            zeroed[at : at + length] = bytes(length)
            yield f"{name}/zeroed{n}", bytes(zeroed)
        for n in range(3):
            yield f"{name}/cut{n}", base[: int(rng.integers(scan, len(base) - 2))] + b"\xff\xd9"
        for n in range(3):
            at = int(rng.integers(scan, len(base) - 2))
            yield f"{name}/removed{n}", base[:at] + base[at + int(rng.integers(1, 30)) :]


def full(data: bytes, fmt: str) -> Checked:
    """The verdict of today's full decode, in `check_source`'s terms."""
    decoded = decode_source(data, fmt)
    image = decoded.image
    if image is None:
        return Checked(None, decoded.problem)
    channels = 1 if image.ndim == 2 else int(image.shape[2])
    return Checked((int(image.shape[1]), int(image.shape[0]), channels), "", decoded.warnings)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(whole_pngs()))
def test_whole_pngs_are_proven_without_decoding(name: str) -> None:
    data = whole_pngs()[name]
    assert prove_png(data) == full(data, "png").dims


def test_png_verdicts_are_those_of_the_full_decode_on_damaged_files() -> None:
    cases = dict(damaged_pngs())
    differ = {n: (check_source(d, "png"), full(d, "png")) for n, d in cases.items()}
    differ = {n: pair for n, pair in differ.items() if pair[0] != pair[1]}
    assert differ == {}
    refused = [n for n, d in cases.items() if full(d, "png").dims is None]
    proven = [n for n, d in cases.items() if prove_png(d) is not None]
    assert len(refused) > len(cases) / 2  # the corpus is mostly broken ...
    assert not set(refused) & set(proven)  # ... and none of the broken is proven whole
    assert {"empty_idat", "palette_index_out_of_range", "after_iend"} <= set(proven)


@pytest.mark.parametrize("name", sorted(whole_jpegs()))
def test_whole_jpegs_are_checked_at_one_eighth_scale(name: str) -> None:
    data = whole_jpegs()[name]
    reduced = decode_check._reduced_jpeg(data)
    assert reduced is not None
    assert reduced == full(data, "jpeg")


def test_jpeg_verdicts_are_those_of_the_full_decode_on_damaged_files() -> None:
    cases = dict(damaged_jpegs())
    verdicts = {n: (check_source(d, "jpeg"), full(d, "jpeg")) for n, d in cases.items()}
    assert {n: pair for n, pair in verdicts.items() if pair[0] != pair[1]} == {}
    kinds = {
        "refused": sum(v.dims is None for _, v in verdicts.values()),
        "caveat": sum(bool(v.warnings) for _, v in verdicts.values()),
    }
    assert kinds["refused"] > 50  # corrupt data and cut scans, refused with the decoder's reason
    assert any("corrupt data" in v.problem for _, v in verdicts.values())
    assert kinds["caveat"] >= 1  # a whole image with a libjpeg caveat keeps it


def test_prepare_takes_the_cheap_path_and_decodes_only_what_it_cannot_prove(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    decoded: list[str] = []
    real = decode_check.decode_source

    def counting(data: bytes, fmt: str) -> Any:
        decoded.append(fmt)
        return real(data, fmt)

    monkeypatch.setattr(decode_check, "decode_source", counting)
    monkeypatch.setattr(prepare, "decode_source", counting)
    files = {
        "a.png": whole_pngs()["palette_trns"],
        "b.jpg": whole_jpegs()["progressive"],
        "c.png": make_png(plte=bytes(range(12))),  # rare enough to be decoded
        "d.bmp": cv2.imencode(".bmp", smooth(5, 4))[1].tobytes(),
    }
    items = {}
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
        items[rel] = prepare_record(rel, str(tmp_path / rel), None)
    assert decoded == ["png", "bmp"]
    for rel, item in items.items():
        assert isinstance(item, Record)
        dims = full(files[rel], item.format).dims
        assert (item.width, item.height, item.channels) == dims
    (tmp_path / "e.png").write_bytes(make_png(rows=png_rows(13, 10, 2, 8, 0)))  # short
    problem = prepare_record("e.png", str(tmp_path / "e.png"), None)
    assert isinstance(problem, Problem)
    assert problem.reason == "undecodable"
    assert problem.message == "looks like PNG but does not decode"
