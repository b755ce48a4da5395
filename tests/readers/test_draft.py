"""``draft=``: JPEGs decoded at the smallest DCT scale that keeps the requested size, chosen
from the index's width/height; everything else, and ``draft=None``, as before."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest
from PIL import Image

from readers import ShardStream, open_dataset
from readers.decode import DECODE_MODES, RGB_DIRECT, decode_image, decode_sample, reduced_flags
from readers.draft import (
    DRAFT_SCALES,
    check_draft,
    draft_scale,
    jpeg_orientation,
    scaled_size,
)
from tests.conftest import build_packed

# --- images ----------------------------------------------------------------------------------


def smooth(
    height: int, width: int, *, seed: int = 0, channels: int = 3, cell: int = 16
) -> np.ndarray:
    """A smooth image (a random grid of `cell` pixels upsampled): resizing it aliases little,
    so a reduced decode is close to a full decode resized."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 256, (height // cell + 2, width // cell + 2, channels), dtype=np.uint8)
    image = cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)
    return image if image.ndim == 3 else image[:, :, np.newaxis]


def jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def cmyk_jpeg(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(out, "JPEG", quality=90)
    return out.getvalue()


def with_orientation(data: bytes, orientation: int, *, little: bool = False) -> bytes:
    """`data` (a JPEG) with an APP1 Exif segment holding only the orientation, after SOI."""
    end = "<" if little else ">"
    entry = struct.pack(end + "HHIHH", 0x0112, 3, 1, orientation, 0)
    tiff = (b"II" if little else b"MM") + struct.pack(end + "HI", 42, 8)
    tiff += struct.pack(end + "H", 1) + entry + struct.pack(end + "I", 0)
    body = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + data[2:]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if err == 0 else 10 * np.log10(255.0**2 / err)


def pack(tmp_path: Path, files: dict[str, bytes], fmt: str) -> Path:
    """`files` (name -> bytes) in one class folder, packed in `fmt`; ids in name order."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (src / "c" / name).write_bytes(data)
    return build_packed(src, tmp_path / f"out.{fmt}", fmt)


# --- the scale choice ------------------------------------------------------------------------


def test_opencv_reduced_sizes_are_the_ceiling_of_the_scaled_size() -> None:
    """What draft_scale relies on: IMREAD_REDUCED_* gives ceil(H/s) x ceil(W/s), odd sizes
    included."""
    rng = np.random.default_rng(0)
    for w in range(1, 34):
        for h in (1, 2, 7, 8, 9, 15, 17, 31):
            data = jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for s in DRAFT_SCALES:
                assert decode_image(data, "rgb", scale=s).shape[:2] == scaled_size(h, w, s)
                assert decode_image(data, "gray", scale=s).shape == (*scaled_size(h, w, s), 1)


def pil_jpeg(rgb: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def test_a_reduced_rgb_decode_is_the_bgr_decode_converted() -> None:
    """A reduced ``rgb`` decode asks libjpeg for RGB itself (OpenCV's IMREAD_COLOR_RGB, where
    it has it) and skips the conversion; the pixels are exactly those of the BGR decode
    converted, and so are those of the table used where OpenCV lacks the flag: on colour,
    gray, CMYK, progressive, 4:4:4 and 4:2:2 JPEGs and every EXIF orientation."""
    image = smooth(75, 118, seed=4)
    cases = {
        "420": jpeg(image),
        "gray": jpeg(image[:, :, 0]),
        "cmyk": cmyk_jpeg(image),
        "progressive": pil_jpeg(image, progressive=True),
        "444": pil_jpeg(image, subsampling=0),
        "422": pil_jpeg(image, subsampling=1),
    }
    cases |= {f"orientation {o}": with_orientation(jpeg(image), o) for o in range(2, 9)}
    fallback = reduced_flags(None)
    for name, data in cases.items():
        buf = np.frombuffer(data, dtype=np.uint8)
        for s in DRAFT_SCALES:
            expected = cv2.cvtColor(decode_image(data, "bgr", scale=s), cv2.COLOR_BGR2RGB)
            got = decode_image(data, "rgb", scale=s)
            assert got.shape == expected.shape, (name, s)
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} at 1/{s}")
            flags, convert = fallback["rgb", s]
            assert convert
            slow = cv2.cvtColor(cv2.imdecode(buf, flags), cv2.COLOR_BGR2RGB)
            np.testing.assert_array_equal(slow, expected, err_msg=f"{name} at 1/{s}")
    if RGB_DIRECT is not None:  # the direct path is what the reads take here
        assert not any(convert for (mode, _), (_, convert) in reduced_flags(RGB_DIRECT).items())


def reference_scale(h: int, w: int, draft: int | tuple[int, int]) -> int:
    """The largest s in 8, 4, 2, 1 whose ceil-scaled size keeps `draft` (1 always does)."""
    for s in (8, 4, 2):
        sh, sw = -(-h // s), -(-w // s)
        if isinstance(draft, int):
            if min(sh, sw) >= draft:
                return s
        elif sh >= draft[0] and sw >= draft[1]:
            return s
    return 1


@pytest.mark.parametrize("target", [1, 3, 5, 224])
def test_draft_scale_on_every_boundary(target: int) -> None:
    # ceil(x / s) >= S exactly when x > s * (S - 1): the boundary of each scale
    for s in DRAFT_SCALES:
        edge = s * (target - 1)
        for short in (edge - 1, edge, edge + 1, edge + 2):
            if short < 1:
                continue
            for long in (short, short + 1, 2 * short + 1):
                for h, w in ((short, long), (long, short)):
                    got = draft_scale(h, w, target)
                    assert got == reference_scale(h, w, target), (h, w, target)
                    assert min(scaled_size(h, w, got)) >= min(target, short)
        if target > 1:
            assert draft_scale(edge, edge, target) < s  # ceil(edge / s) = S - 1: too small
        assert draft_scale(edge + 1, edge + 1, target) >= s  # ceil = S: kept
    assert draft_scale(1200, 1900, 256) == 4  # 300 x 475
    assert draft_scale(1200, 1900, (512, 512)) == 2  # 600 x 950
    assert draft_scale(100, 100, 256) == 1  # already smaller: full size
    assert draft_scale(100, 100, None) == 1


def test_draft_scale_of_both_sides_on_every_boundary() -> None:
    for s in DRAFT_SCALES:
        for req_h, req_w in ((3, 5), (5, 3), (4, 4)):
            for h in (s * (req_h - 1), s * (req_h - 1) + 1):
                for w in (s * (req_w - 1), s * (req_w - 1) + 1):
                    got = draft_scale(h, w, (req_h, req_w))
                    assert got == reference_scale(h, w, (req_h, req_w))
                    sh, sw = scaled_size(h, w, got)
                    assert sh >= min(req_h, h)
                    assert sw >= min(req_w, w)


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "256", (1,), (0, 5), (5, 0), (1, 2, 3)])
def test_a_bad_draft_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="draft="):
        check_draft(bad)
    assert check_draft((np.int64(3), 4)) == (3, 4)
    assert check_draft([224, 224]) == (224, 224)


def test_jpeg_orientation_is_read_from_the_exif_segment_only() -> None:
    data = jpeg(smooth(8, 12))
    assert jpeg_orientation(data) == 1
    for o in range(1, 9):
        assert jpeg_orientation(with_orientation(data, o)) == o
        assert jpeg_orientation(with_orientation(data, o, little=True)) == o
    assert jpeg_orientation(with_orientation(data, 6)[:30]) == 1  # cut: none readable
    assert jpeg_orientation(b"\xff\xd8") == 1


# --- through the datasets --------------------------------------------------------------------


def test_draft_none_is_byte_identical_to_a_plain_decode(tmp_path: Path, fmt: str) -> None:
    """draft=None is the old path: every mode gives what decode_sample of the stored bytes
    gives, and the index's sizes are not even loaded."""
    files = {
        "a.jpg": jpeg(smooth(40, 60)),
        "b.jpg": with_orientation(jpeg(smooth(30, 50, seed=1)), 6),
        "c.jpg": jpeg(smooth(33, 17, seed=2, channels=1)),
        "d.jpg": cmyk_jpeg(smooth(24, 40, seed=3)),
        "e.png": cv2.imencode(".png", smooth(20, 30))[1].tobytes(),
    }
    out = pack(tmp_path, files, fmt)
    for mode in DECODE_MODES:
        ds = open_dataset(out, decode=mode)
        assert ds.draft is None
        assert ds._sizes is None
        for i in range(len(ds)):
            expected = decode_sample(ds.read_bytes(i), mode)
            got = ds[i][0]
            if mode == "bytes":
                assert got == expected
            else:
                assert got.dtype == expected.dtype
                np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("target", [3, 5])
def test_the_draft_bound_holds_on_every_scale_boundary(
    tmp_path: Path, fmt: str, target: int
) -> None:
    """Real JPEGs at each boundary size: the returned shorter side is >= the draft (or the
    whole image when smaller), at the largest scale that keeps it."""
    sizes = []
    for s in DRAFT_SCALES:
        edge = s * (target - 1)
        sizes += [(edge, edge + 3), (edge + 1, edge + 4), (edge + 5, edge + 1)]
    sizes += [(1, 1), (2, 9)]  # smaller than any draft
    files = {f"{n:02d}.jpg": jpeg(smooth(h, w, seed=n)) for n, (h, w) in enumerate(sizes)}
    ds = open_dataset(pack(tmp_path, files, fmt), draft=target)
    for n, (h, w) in enumerate(sizes):
        image = ds[n][0]
        s = reference_scale(h, w, target)
        assert image.shape == (*scaled_size(h, w, s), 3), (h, w)
        assert min(image.shape[:2]) >= min(target, h, w)
        if s < 8:  # the next larger reduction would break the bound
            assert min(scaled_size(h, w, 2 * s)) < target or (s == 1 and min(h, w) < target)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientations_5_to_8_swap_height_and_width_before_the_choice(
    tmp_path: Path, fmt: str, orientation: int
) -> None:
    """The request is of the image as returned: stored 40 x 80 with orientation 6 comes back
    80 x 40, so (18, 36) cannot be met at 1/2 (40 x 20) although the stored grid would be
    (20 x 40); unchanged returns the stored grid and decides on it."""
    stored = jpeg(smooth(40, 80))
    out = pack(tmp_path, {"a.jpg": with_orientation(stored, orientation)}, fmt)
    swapped = orientation >= 5
    for mode in ("rgb", "bgr", "gray"):
        full = open_dataset(out, decode=mode)[0][0]
        assert full.shape[:2] == ((80, 40) if swapped else (40, 80))
        image = open_dataset(out, decode=mode, draft=(18, 36))[0][0]
        assert image.shape[0] >= 18, (mode, image.shape)
        assert image.shape[1] >= 36, (mode, image.shape)
        assert image.shape[:2] == ((80, 40) if swapped else (20, 40))
        assert image.shape[2] == full.shape[2]
        # one side asked: the orientation cannot matter
        assert open_dataset(out, decode=mode, draft=10)[0][0].shape[:2] == (
            (20, 10) if swapped else (10, 20)
        )
    image = open_dataset(out, decode="unchanged", draft=(18, 36))[0][0]
    assert image.shape[:2] == (20, 40)  # the stored grid, not rotated


def test_gray_and_cmyk_jpegs_keep_the_channels_of_a_full_decode(tmp_path: Path, fmt: str) -> None:
    files = {
        "gray.jpg": jpeg(smooth(64, 96, channels=1)),
        "cmyk.jpg": cmyk_jpeg(smooth(64, 96, seed=1)),
        "rgb.jpg": jpeg(smooth(64, 96, seed=2)),
    }
    out = pack(tmp_path, files, fmt)
    for mode in ("rgb", "bgr", "gray", "unchanged"):
        full = open_dataset(out, decode=mode)
        small = open_dataset(out, decode=mode, draft=16)  # 64 / 4 = 16
        for i in range(len(full)):
            a, b = full[i][0], small[i][0]
            assert b.shape == (16, 24, a.shape[2]), (mode, i, a.shape, b.shape)
            assert b.dtype == a.dtype
            down = cv2.resize(a, (24, 16), interpolation=cv2.INTER_AREA).reshape(b.shape)
            assert psnr(down, b) > 30, (mode, i)


def test_other_formats_and_small_images_decode_at_full_size(tmp_path: Path, fmt: str) -> None:
    files = {
        "a.png": cv2.imencode(".png", smooth(64, 64))[1].tobytes(),
        "b.bmp": cv2.imencode(".bmp", smooth(64, 64))[1].tobytes(),
        "c.jpg": jpeg(smooth(20, 30)),
    }
    out = pack(tmp_path, files, fmt)
    plain, drafted = open_dataset(out), open_dataset(out, draft=16)
    for i in range(len(plain)):
        np.testing.assert_array_equal(plain[i][0], drafted[i][0])
    assert open_dataset(out, decode="bytes", draft=4)[2][0] == plain.read_bytes(2)


def test_raw_records_are_not_drafted(tmp_path: Path, fmt: str) -> None:
    from packer.transform import Transform

    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "a.jpg").write_bytes(jpeg(smooth(64, 64)))
    out = build_packed(src, tmp_path / "raw", fmt, transform=Transform(encode="raw"))
    np.testing.assert_array_equal(open_dataset(out, draft=8)[0][0], open_dataset(out)[0][0])


def test_draft_is_close_to_a_full_decode_resized(tmp_path: Path, fmt: str) -> None:
    image = smooth(600, 950)
    out = pack(tmp_path, {"a.jpg": jpeg(image)}, fmt)
    full = open_dataset(out)[0][0]
    for draft, scale in ((256, 2), (140, 4), (70, 8)):
        got = open_dataset(out, draft=draft)[0][0]
        assert got.shape[:2] == scaled_size(600, 950, scale)
        down = cv2.resize(full, got.shape[1::-1], interpolation=cv2.INTER_AREA)
        assert psnr(down, got) > 30


def test_draft_in_dataloader_workers_and_shard_stream(tmp_path: Path, fmt: str) -> None:
    files = {f"{n:02d}.jpg": jpeg(smooth(64 + n, 96, seed=n)) for n in range(8)}
    out = pack(tmp_path, files, fmt)
    ds = open_dataset(out, draft=16, transform=lambda im: cv2.resize(im, (8, 8)))
    expected = [ds[i][0] for i in range(len(ds))]
    assert all(open_dataset(out, draft=16)[i][0].shape[0] < 64 for i in range(len(ds)))
    loader = paddle.io.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2)
    got = np.concatenate([batch[0].numpy() for batch in loader])
    np.testing.assert_array_equal(got, np.stack(expected))
    for source in (out, open_dataset(out, draft=16)):
        stream = ShardStream(source, draft=16 if isinstance(source, Path) else None, shuffle=False)
        assert stream.draft == 16
        shapes = [item[0].shape for item in stream]
        assert shapes == [open_dataset(out, draft=16)[i][0].shape for i in range(len(ds))]
    stream = ShardStream(out, draft=16, shuffle=False, transform=lambda im: cv2.resize(im, (8, 8)))
    loader = paddle.io.DataLoader(stream, batch_size=4, num_workers=2)
    got = np.concatenate([batch[0].numpy() for batch in loader])
    assert sorted(map(bytes, got)) == sorted(map(bytes, expected))


def test_a_bare_dataset_decodes_at_full_size(tmp_path: Path) -> None:
    """Without an index there are no sizes: draft= changes nothing."""
    import lmdb

    path = tmp_path / "bare"
    env = lmdb.open(str(path), map_size=1 << 24)
    data = jpeg(smooth(64, 64))
    with env.begin(write=True) as txn:
        txn.put(b"num-samples", b"1")
        txn.put(b"image-000000001", data)
        txn.put(b"label-000000001", b"x")
    env.close()
    np.testing.assert_array_equal(open_dataset(path, draft=8)[0][0], decode_sample(data))
