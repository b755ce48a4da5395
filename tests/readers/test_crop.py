"""`RandomResizedCropDraft`: paddle's RandomResizedCrop with the box drawn from the index's
size before decoding, the JPEG decoded at the reduction the box affords."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paddle
import pytest
from paddle.vision.transforms import RandomResizedCrop

from readers import ShardStream, open_dataset
from readers.draft import crop_scale, scaled_size
from readers.transforms import DecodePlan, DecodePlanner, RandomResizedCropDraft, is_planner
from tests.readers.test_draft import cmyk_jpeg, jpeg, pack, psnr, smooth, with_orientation

# sizes with every path of paddle's box: found in a few tries, the fallback for very wide and
# very tall images (ratio clamped), and the whole image
SIZES = [(600, 800), (333, 97), (97, 333), (10, 1000), (1000, 10), (224, 224), (5, 7), (1, 1)]


def paddle_box(crop: RandomResizedCrop, height: int, width: int) -> tuple[int, int, int, int]:
    """paddle's own box for an image of `height` x `width` (dynamic mode)."""
    box = crop._dynamic_get_param(np.zeros((height, width, 1), np.uint8))
    return tuple(int(v) for v in box)  # type: ignore[return-value]


def seed_all(seed: int) -> None:
    """Seed the global generators paddle's transforms draw from (what its workers seed)."""
    np.random.seed(seed)  # noqa: NPY002
    random.seed(seed)


def test_the_box_is_paddles_box_from_the_same_random_state() -> None:
    for scale, ratio in (((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.9), (0.5, 3.0))):
        ours = RandomResizedCropDraft(224, scale=scale, ratio=ratio)
        theirs = RandomResizedCrop(224, scale=scale, ratio=ratio)
        for h, w in SIZES:
            for seed in range(40):
                seed_all(seed)
                plan = ours.plan(h, w)
                seed_all(seed)
                assert plan.box == paddle_box(theirs, h, w), (h, w, seed)


def test_the_random_streams_advance_as_paddles_do() -> None:
    ours, theirs = RandomResizedCropDraft(64), RandomResizedCrop(64)
    seed_all(7)
    mine = [ours.plan(h, w).box for h, w in SIZES * 5]
    after_mine = (np.random.uniform(), random.random())  # noqa: NPY002
    seed_all(7)
    paddles = [paddle_box(theirs, h, w) for h, w in SIZES * 5]
    assert mine == paddles
    assert (np.random.uniform(), random.random()) == after_mine  # noqa: NPY002


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical
    distribution functions."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / a.size
    fb = np.searchsorted(np.sort(b), grid, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))


@pytest.mark.parametrize(("height", "width"), [(600, 800), (333, 97)])
def test_area_and_aspect_are_distributed_as_paddles(height: int, width: int) -> None:
    """Over many draws from independent seeds, area fraction and log-aspect of our boxes and
    of paddle's agree (two-sample KS at alpha = 0.001), and so do their quantiles."""
    n = 4000
    ours, theirs = RandomResizedCropDraft(224), RandomResizedCrop(224)
    seed_all(1)
    a = np.array([ours.plan(height, width).box[2:] for _ in range(n)], dtype=np.float64)
    seed_all(2)
    b = np.array([paddle_box(theirs, height, width)[2:] for _ in range(n)], dtype=np.float64)
    critical = np.sqrt(-np.log(0.001 / 2) / 2) * np.sqrt(2 / n)
    for stat in (
        lambda x: x[:, 0] * x[:, 1] / (height * width),  # area fraction
        lambda x: np.log(x[:, 1] / x[:, 0]),  # log aspect (width / height)
    ):
        sa, sb = stat(a), stat(b)
        assert ks_statistic(sa, sb) < critical
        q = [0.05, 0.25, 0.5, 0.75, 0.95]
        np.testing.assert_allclose(np.quantile(sa, q), np.quantile(sb, q), atol=0.04)
    # the test tells a different distribution apart: another ratio range
    skewed = RandomResizedCropDraft(224, ratio=(3 / 4, 1.5))
    seed_all(1)
    c = np.array([skewed.plan(height, width).box[2:] for _ in range(n)], dtype=np.float64)
    assert ks_statistic(np.log(c[:, 1] / c[:, 0]), np.log(b[:, 1] / b[:, 0])) > critical


def test_plans_keep_the_output_size_and_the_box_inside() -> None:
    crop = RandomResizedCropDraft((48, 64))
    seed_all(0)
    for h, w in [*SIZES, (1200, 1900), (3000, 200)]:
        for _ in range(50):
            plan = crop.plan(h, w)
            top, left, bh, bw = plan.box
            assert top >= 0
            assert left >= 0
            assert top + bh <= h
            assert left + bw <= w
            assert plan.scale == crop_scale(bh, bw, 48, 64)
            assert bh >= 48 * plan.scale or plan.scale == 1
            assert bw >= 64 * plan.scale or plan.scale == 1
            if plan.scale < 8:  # the largest reduction that keeps the output size
                assert bh < 96 * plan.scale or bw < 128 * plan.scale
    assert crop_scale(448, 448, 224, 224) == 2
    assert crop_scale(447, 2000, 224, 224) == 1
    assert crop_scale(1792, 1792, 224, 224) == 8


@pytest.mark.parametrize("channels", [1, 3])
def test_on_a_decoded_image_it_is_paddles_transform(channels: int) -> None:
    image = np.random.default_rng(0).integers(0, 256, (120, 90, channels), dtype=np.uint8)
    for interpolation in ("nearest", "bilinear", "area", "bicubic", "lanczos"):
        ours = RandomResizedCropDraft(32, interpolation=interpolation)
        theirs = RandomResizedCrop(32, interpolation=interpolation)
        for seed in range(10):
            seed_all(seed)
            got = ours(image)
            seed_all(seed)
            np.testing.assert_array_equal(got, theirs(image))
            assert got.shape == (32, 32, channels)


@pytest.mark.parametrize("interpolation", ["bilinear", "area", "bicubic"])
def test_a_reduced_decode_gives_the_full_decodes_crop_up_to_scaling(
    interpolation: str,
) -> None:
    # paddle's bilinear resize of the full image samples every ~10th pixel here (box 700 to
    # 64): features of 128 pixels keep that reference itself free of aliasing
    data = jpeg(smooth(700, 900, cell=128))
    from readers.decode import decode_image

    full = decode_image(data)
    crop = RandomResizedCropDraft(64, interpolation=interpolation)
    scales = set()
    for seed in range(30):
        seed_all(seed)
        plan = crop.plan(700, 900)
        scales.add(plan.scale)
        reduced = decode_image(data, scale=plan.scale)
        assert reduced.shape[:2] == scaled_size(700, 900, plan.scale)
        expected = crop.apply(full, plan)  # paddle's crop + resize of the full decode
        # the box is placed to the sub-pixel: a half-pixel slip costs 5-10 dB here
        bound = 40 if interpolation == "area" else 45
        assert psnr(crop.apply(reduced, plan), expected) > bound, (seed, plan)
    assert {2, 4, 8} <= scales
    with pytest.raises(ValueError, match="for a plan of 700x900"):
        crop.apply(full[:-1], plan)


class Recording(RandomResizedCropDraft):
    """Remembers the sizes of the images it was applied to (in this process)."""

    seen: list[tuple[int, ...]]

    def apply(self, image: np.ndarray, plan: DecodePlan) -> Any:
        self.seen = [*getattr(self, "seen", []), image.shape]
        return super().apply(image, plan)


def test_the_dataset_plans_before_decoding(tmp_path: Path, fmt: str) -> None:
    """JPEGs are decoded at the planned reduction; the output is paddle's crop of the full
    decode (same random state) up to scaling; PNGs and small images are exactly paddle's."""
    files = {
        "a.jpg": jpeg(smooth(600, 900, cell=128)),
        "b.jpg": with_orientation(jpeg(smooth(500, 800, seed=1, cell=128)), 6),  # 800 x 500
        "c.jpg": cmyk_jpeg(smooth(400, 700, seed=2, cell=128)),
        "d.jpg": jpeg(smooth(50, 40, seed=3)),  # too small for any reduction
        "e.png": cv2.imencode(".png", smooth(600, 600, seed=4))[1].tobytes(),
    }
    out = pack(tmp_path, files, fmt)
    crop = Recording(48)
    planned = open_dataset(out, transform=crop)
    assert is_planner(planned.transform)
    assert isinstance(crop, DecodePlanner)
    full = open_dataset(out, transform=RandomResizedCrop(48))
    reduced = 0
    for seed in range(12):
        for i in range(len(planned)):
            seed_all(seed)
            got = planned[i][0]
            seed_all(seed)
            expected = full[i][0]
            assert got.shape == expected.shape == (48, 48, 3)
            if i >= 3:
                np.testing.assert_array_equal(got, expected)
            else:
                assert psnr(got, expected) > 30, (seed, i)
            reduced += crop.seen[-1][0] < open_dataset(out)[i][0].shape[0]
    assert reduced > 12  # most draws of the large JPEGs were decoded reduced
    # gray decode: one channel kept
    gray = open_dataset(out, decode="gray", transform=RandomResizedCropDraft(48))
    assert gray[0][0].shape == (48, 48, 1)


def test_same_seeding_as_paddle_in_dataloader_workers(tmp_path: Path, fmt: str) -> None:
    """paddle's DataLoader seeds random and np.random in each worker from the main process's
    np.random: with the same main seed, our crop draws paddle's boxes in the workers too."""
    files = {f"{n:02d}.jpg": jpeg(smooth(300 + 10 * n, 400, seed=n, cell=96)) for n in range(8)}
    files["z.png"] = cv2.imencode(".png", smooth(200, 260))[1].tobytes()
    out = pack(tmp_path, files, fmt)

    def run(transform: Any) -> np.ndarray:
        np.random.seed(123)  # noqa: NPY002 - what the loader draws its workers' seeds from
        ds = open_dataset(out, transform=transform)
        loader = paddle.io.DataLoader(ds, batch_size=3, shuffle=False, num_workers=2)
        return np.concatenate([batch[0].numpy() for batch in loader])

    ours, theirs = run(RandomResizedCropDraft(40)), run(RandomResizedCrop(40))
    assert ours.shape == theirs.shape == (9, 40, 40, 3)
    for a, b in zip(ours, theirs, strict=True):
        assert psnr(a, b) > 30
    np.testing.assert_array_equal(ours[-1], theirs[-1])  # the PNG: decoded in full, exact
    again = run(RandomResizedCropDraft(40))
    np.testing.assert_array_equal(ours, again)


def test_shard_stream_plans_too(tmp_path: Path, fmt: str) -> None:
    files = {f"{n:02d}.jpg": jpeg(smooth(400, 500, seed=n)) for n in range(4)}
    out = pack(tmp_path, files, fmt)
    crop = Recording(32, then=lambda im: im.astype(np.float32) / 255)
    stream = ShardStream(out, transform=crop, shuffle=False)
    items = list(stream)
    assert [item[0].shape for item in items] == [(32, 32, 3)] * 4
    assert items[0][0].dtype == np.float32  # then= ran
    assert any(shape[0] < 400 for shape in crop.seen)  # decoded reduced
    # from a dataset object: its planner transform is the stream's default
    stream = ShardStream(open_dataset(out, transform=Recording(32)), shuffle=False)
    assert [item[0].shape for item in stream] == [(32, 32, 3)] * 4
    loader = paddle.io.DataLoader(ShardStream(out, transform=crop), batch_size=2, num_workers=2)
    assert sum(batch[0].shape[0] for batch in loader) == 4


def test_options_are_checked() -> None:
    for bad in ({"size": 0}, {"size": (3,)}, {"size": 3, "scale": (0.5, 0.1)}):
        with pytest.raises(ValueError, match="expected"):
            RandomResizedCropDraft(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratio="):
        RandomResizedCropDraft(3, ratio=(2.0, 1.0))
    with pytest.raises(ValueError, match="interpolation="):
        RandomResizedCropDraft(3, interpolation="cubic")
    assert "size=(3, 3)" in repr(RandomResizedCropDraft(3))
