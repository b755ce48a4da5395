"""``packer dupes --near``: copies are grouped, look-alikes are not, and groups never chain."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.dupes import find_dupes
from packer.nearhash import (
    MAX_RADIUS,
    cliques,
    coarse_view,
    compared_side,
    hamming,
    maybe_similar,
    near_pairs,
    phash,
    similar,
    thumbnail,
)
from tests.conftest import build_packed, encode

runner = CliRunner()


def _document(k: int) -> np.ndarray:
    """A page of text lines with emblem `k` (a shape in one of six colours) in its corner.

    Twelve of them hash within 2 bits of each other in many pairs: the layout is shared.
    """
    image = np.full((160, 128, 3), 250, dtype=np.uint8)
    for y in range(20, 140, 10):
        cv2.line(image, (16, y), (112, y), (120, 120, 120), 2)
    colour = [(0, 0, 255), (0, 160, 0), (255, 0, 0), (0, 200, 255), (200, 0, 200), (40, 40, 40)]
    if k < 6:
        cv2.circle(image, (96, 128), 18, colour[k], -1)
    else:
        cv2.rectangle(image, (78, 110), (114, 146), colour[k % 6], -1)
    return image


def _gray(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)


def _pack(tmp_path: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return build_packed(tmp_path / "src", tmp_path / "out.lmdb", "lmdb")


def _near(out: Path) -> list[list[str]]:
    report = find_dupes([out], near=True)
    return sorted(sorted(m["path"] for m in g.members) for g in report.groups if g.kind == "near")


def test_distinct_images_whose_hashes_match_are_never_grouped(tmp_path: Path) -> None:
    documents = [_document(k) for k in range(12)]
    hashes = np.array([phash(_gray(d)) for d in documents], dtype=np.uint64)
    # the premise: the hash bands alone would link these (the old --near made one group)
    assert len(near_pairs(hashes, 2)) >= 10
    out = _pack(
        tmp_path, {f"docs/doc_{k:02d}.png": encode(d, ".png") for k, d in enumerate(documents)}
    )
    assert _near(out) == []
    result = runner.invoke(app, ["dupes", str(out), "--near", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["groups"] == []


def _smooth(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    low = rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)
    return cv2.resize(low, (width, height), interpolation=cv2.INTER_CUBIC)


def _jpeg(image: np.ndarray, quality: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def _resized(image: np.ndarray, scale: float) -> np.ndarray:
    return cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)


def test_resized_and_reencoded_copies_are_grouped_with_their_original(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    files: dict[str, bytes] = {}
    photos = [_smooth(rng, 240, 180) for _ in range(6)]
    for k, photo in enumerate(photos):
        files[f"a/photo_{k}.png"] = encode(photo, ".png")
    # JPEG q75 at full size; 60 % as PNG; 80 % as JPEG q85
    files["b/copy_0_q75.jpg"] = _jpeg(photos[0], 75)
    files["b/copy_1_60.png"] = encode(_resized(photos[1], 0.6), ".png")
    files["b/copy_2_80_q85.jpg"] = _jpeg(_resized(photos[2], 0.8), 85)
    # a transparent icon and its JPEG flattened over black
    icon = np.zeros((96, 96, 4), dtype=np.uint8)
    cv2.circle(icon, (48, 48), 36, (30, 140, 250, 255), -1)
    cv2.rectangle(icon, (30, 40), (66, 56), (250, 250, 250, 255), -1)
    files["a/icon.png"] = encode(icon, ".png")
    files["b/icon_flat.jpg"] = _jpeg(np.ascontiguousarray(icon[:, :, :3]), 80)
    # a large JPEG with sharp edges, decoded at 1/8 scale (1030 px is not a multiple of 8)
    page = np.zeros((1030, 1030, 3), dtype=np.uint8)
    cv2.rectangle(page, (80, 60), (950, 980), (245, 245, 245), -1)
    cv2.putText(page, "near", (200, 600), cv2.FONT_HERSHEY_SIMPLEX, 10, (20, 20, 20), 40)
    files["a/page.jpg"] = _jpeg(page, 90)
    files["b/page_55.png"] = encode(_resized(page, 0.55), ".png")
    out = _pack(tmp_path, files)

    assert _near(out) == [
        ["a/icon.png", "b/icon_flat.jpg"],
        ["a/page.jpg", "b/page_55.png"],
        ["a/photo_0.png", "b/copy_0_q75.jpg"],
        ["a/photo_1.png", "b/copy_1_60.png"],
        ["a/photo_2.png", "b/copy_2_80_q85.jpg"],
    ]


def test_a_chain_does_not_merge_its_ends(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = _smooth(rng, 192, 192).astype(np.int16).clip(40, 215)
    lighter, middle, darker = ((base + d).astype(np.uint8) for d in (9, 0, -9))
    thumbs = [thumbnail(x) for x in (lighter, middle, darker)]
    # the premise: each end is confirmed with the middle, the ends are not confirmed together
    assert similar(thumbs[0], thumbs[1], 192)
    assert similar(thumbs[1], thumbs[2], 192)
    assert not similar(thumbs[0], thumbs[2], 192)
    hashes = np.array([phash(_gray(x)) for x in (lighter, middle, darker)], dtype=np.uint64)
    assert near_pairs(hashes, 2).tolist() == [[0, 1], [0, 2], [1, 2]]  # all three candidates
    # the middle is stored at 80 %: two lossless images of one size 9 levels apart are not
    # confirmed at all (nothing explains the difference), a resized one is, by its ends
    out = _pack(
        tmp_path,
        {
            "c/a_lighter.png": encode(lighter, ".png"),
            "c/b_middle.png": encode(_resized(middle, 0.8), ".png"),
            "c/c_darker.png": encode(darker, ".png"),
        },
    )
    # never both ends; and the middle, as close to one end as to the other (two distinct
    # pictures), joins neither rather than the closer by a hair
    assert _near(out) == []


def test_cliques_take_only_members_confirmed_with_every_other() -> None:
    # 0-1, 1-2, 2-3 are confirmed; nothing else: no group may hold two unconfirmed members
    pairs = np.array([[0, 1], [1, 2], [2, 3]])
    groups = cliques(pairs, lambda i, j: False)
    confirmed = {tuple(p) for p in pairs.tolist()}
    for group in groups:
        for k, a in enumerate(group):
            for b in group[k + 1 :]:
                assert (a, b) in confirmed
    assert groups == [[0, 1], [2, 3]]
    # a triangle plus a tail: the triangle is one group, the tail is left alone
    assert cliques(np.array([[0, 1], [0, 2], [1, 2], [2, 3]]), lambda i, j: False) == [[0, 1, 2]]


def test_images_under_32_pixels_are_counted_not_compared(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    tiny = _smooth(rng, 24, 24)
    out = _pack(
        tmp_path,
        {"t/tiny.png": encode(tiny, ".png"), "t/tiny_copy.jpg": _jpeg(tiny, 90)},
    )
    report = find_dupes([out], near=True)
    assert report.groups == []
    assert report.too_small == 2
    assert report.as_json()["near"]["too_small"] == 2
    assert "2 images under 32 px not compared" in report.text()


def _page(mark: int = 0, caption: str = "") -> np.ndarray:
    """A transparent page icon (BGRA, 96 px) with a faint `mark` level '?' and a `caption`."""
    colour = np.zeros((96, 96, 3), dtype=np.uint8)
    alpha = np.zeros((96, 96), dtype=np.uint8)
    cv2.rectangle(colour, (14, 6), (82, 90), (240, 240, 240), -1)
    cv2.rectangle(colour, (14, 6), (82, 90), (150, 150, 150), 1)
    cv2.rectangle(alpha, (14, 6), (82, 90), 255, -1)
    if mark:
        level = (240 - mark,) * 3
        cv2.putText(colour, "?", (34, 66), cv2.FONT_HERSHEY_SIMPLEX, 1.6, level, 5, cv2.LINE_8)
    if caption:
        grey = (120, 120, 120)
        cv2.putText(colour, caption, (20, 84), cv2.FONT_HERSHEY_PLAIN, 0.8, grey, 1, cv2.LINE_8)
    return np.dstack([colour, alpha])


def test_lossless_images_of_one_size_must_match_closely(tmp_path: Path) -> None:
    # a page and the same page with a faint '?' (20 levels): both PNG, one size, so nothing
    # (no resampling, no JPEG) explains the difference; the JPEG copy still joins its original
    plain, marked = _page(), _page(mark=20)
    out = _pack(
        tmp_path,
        {
            "i/empty.png": encode(plain, ".png"),
            "i/unknown.png": encode(marked, ".png"),
            "i/unknown_q80.jpg": _jpeg(np.ascontiguousarray(marked[:, :, :3]), 80),
        },
    )
    assert _near(out) == [["i/unknown.png", "i/unknown_q80.jpg"]]


def test_a_caption_the_thumbnail_averages_away_is_seen_at_full_size(tmp_path: Path) -> None:
    # archive icons that differ by their caption, one of them stored at 90 %: the thumbnails
    # (32 px) agree, the check at the smaller image's own size does not
    rar, seven = _page(caption=".rar"), _page(caption=".7z")
    rar_flat = np.ascontiguousarray(rar[:, :, :3])
    assert similar(thumbnail(rar_flat), thumbnail(np.ascontiguousarray(seven[:, :, :3])), 76)
    out = _pack(
        tmp_path,
        {
            "a/rar.png": encode(rar, ".png"),
            "a/7z_small.png": encode(_resized(seven, 0.9), ".png"),
            "a/rar_small.png": encode(_resized(rar, 0.9), ".png"),
        },
    )
    # the 7z icon is not grouped with the rar icon; rar's resized copy is
    assert _near(out) == [["a/rar.png", "a/rar_small.png"]]


def test_a_small_jpeg_of_a_colourful_icon_is_grouped_despite_its_colour_bleeding(
    tmp_path: Path,
) -> None:
    # saturated colour edges on a 48 px icon: JPEG keeps colour at half resolution, so B, G and
    # R each move a lot at the edges while luma and the chroma averages hardly do
    icon = np.zeros((48, 48, 3), dtype=np.uint8)
    for k, colour in enumerate([(0, 0, 255), (0, 200, 0), (255, 0, 0), (0, 220, 255)]):
        cv2.circle(icon, (12 + 24 * (k % 2), 12 + 24 * (k // 2)), 10, colour, -1)
    cv2.rectangle(icon, (18, 18), (30, 30), (255, 0, 255), -1)
    out = _pack(tmp_path, {"c/dots.png": encode(icon, ".png"), "c/dots_q70.jpg": _jpeg(icon, 70)})
    assert _near(out) == [["c/dots.png", "c/dots_q70.jpg"]]


def test_cliques_join_the_closest_pairs_first() -> None:
    # 1 is confirmed with 0 and with 2, 0 and 2 are not: 1 goes with its closer match, 2,
    # whatever the order of the pairs or how many neighbours each has
    never = lambda i, j: False  # noqa: E731
    assert cliques(np.array([[0, 1], [1, 2]]), never, [5.0, 1.0]) == [[1, 2]]
    assert cliques(np.array([[0, 1], [1, 2]]), never, [1.0, 5.0]) == [[0, 1]]
    # a group takes a newcomer only when it is confirmed with every member
    pairs = np.array([[0, 1], [2, 3], [1, 2], [0, 2]])
    assert cliques(pairs, never, [1.0, 1.0, 2.0, 3.0]) == [[0, 1], [2, 3]]


def test_near_pairs_finds_every_pair_within_8_bits() -> None:
    # clusters of hashes 0-12 bits apart: the 9-band search agrees with comparing all pairs
    rng = np.random.default_rng(7)
    centres = rng.integers(0, 2**63, 40, dtype=np.uint64)
    hashes = []
    for centre in centres.tolist():
        for flips in range(13):
            bits = rng.choice(64, flips, replace=False)
            hashes.append(int(centre) ^ sum(1 << int(b) for b in bits))
    values = np.array(hashes, dtype=np.uint64)
    distance = hamming(values[:, None], values[None, :])
    for radius in (0, 3, 5, MAX_RADIUS):
        i, j = np.nonzero(np.triu(distance <= radius, k=1))
        assert near_pairs(values, radius).tolist() == np.stack([i, j], axis=1).tolist()
    with pytest.raises(ValueError, match=r"radius 9: expected 0\.\.8"):
        near_pairs(values, 9)


def _round_icon(seed: int) -> np.ndarray:
    """A 64 px face-like icon: a disc on white with three smaller discs, colours from `seed`."""
    rng = np.random.default_rng(seed)
    image = np.full((64, 64, 3), 255, dtype=np.uint8)
    cv2.circle(image, (32, 32), 28, tuple(int(x) for x in rng.integers(0, 256, 3)), -1)
    for _ in range(3):
        colour = tuple(int(x) for x in rng.integers(0, 256, 3))
        centre = tuple(int(x) for x in rng.integers(16, 48, 2))
        cv2.circle(image, centre, int(rng.integers(3, 9)), colour, -1)
    return image


def test_a_copy_whose_hash_lies_5_to_8_bits_away_is_grouped(tmp_path: Path) -> None:
    # small icons resized by an odd factor and saved as JPEG: their pHash moves 6 and 8 bits,
    # beyond the 3 bits the old 16-bit bands could find; the pixel checks still confirm them
    files: dict[str, bytes] = {}
    for seed, scale in ((0, 0.65), (16, 0.65)):
        icon = _round_icon(seed)
        copy = cv2.imdecode(np.frombuffer(_jpeg(_resized(icon, scale), 80), np.uint8), 1)
        distance = bin(phash(_gray(icon)) ^ phash(_gray(copy))).count("1")
        assert 5 <= distance <= 8, (seed, distance)  # the premise
        files[f"i/icon_{seed}.png"] = encode(icon, ".png")
        files[f"i/icon_{seed}_copy.jpg"] = _jpeg(_resized(icon, scale), 80)
    out = _pack(tmp_path, files)
    assert _near(out) == [
        ["i/icon_0.png", "i/icon_0_copy.jpg"],
        ["i/icon_16.png", "i/icon_16_copy.jpg"],
    ]


def test_the_coarse_filter_never_drops_a_pair_the_checks_would_accept() -> None:
    # pairs near the checks' limits, at every compared side: whatever `similar` accepts,
    # `maybe_similar` (16 px, in numpy over all pairs) keeps
    rng = np.random.default_rng(3)
    thumbs, pairs, shorts = [], [], []
    for k in range(300):
        base = _smooth(rng, 64, 64).astype(np.int16)
        noise = rng.normal(0, rng.uniform(2, 60), base.shape)
        if k % 2 == 0:  # a local change: a patch of 4-16 px
            y, x, side = *rng.integers(0, 48, 2), rng.integers(4, 17)
            noise[y : y + side, x : x + side] += rng.uniform(-120, 120)
        other = np.clip(base + noise, 0, 255).astype(np.uint8)
        thumbs += [base.astype(np.uint8), other]
        pairs.append((2 * k, 2 * k + 1))
        shorts.append(int(rng.choice([40, 90, 200])))
    views = np.stack([coarse_view(t) for t in thumbs])
    index = np.array(pairs)
    kept = maybe_similar(views, index[:, 0], index[:, 1])
    accepted = np.array(
        [
            similar(
                cv2.resize(thumbs[a], (compared_side(s),) * 2, interpolation=cv2.INTER_AREA),
                cv2.resize(thumbs[b], (compared_side(s),) * 2, interpolation=cv2.INTER_AREA),
                s,
            )
            for (a, b), s in zip(pairs, shorts, strict=True)
        ]
    )
    assert accepted.sum() >= 30  # the premise: both outcomes occur
    assert (~accepted).sum() >= 30
    assert not (accepted & ~kept).any()
    assert (~kept).sum() >= 30  # and the filter does drop pairs


def test_an_image_that_matches_two_distinct_pictures_about_equally_joins_neither(
    tmp_path: Path,
) -> None:
    # a page and the page with a faint '?' (distinct: two lossless images of one size), and a
    # 38 px copy of the marked page: at that size the resampled outline differs from both
    # pages more than the mark does, so it is confirmed with both, as closely; it goes with
    # neither. A 48 px copy of a page with a clearer mark is clearly closer to its original.
    ambiguous = _pack(
        tmp_path / "a",
        {
            "a/plain.png": encode(_page(), ".png"),
            "a/marked.png": encode(_page(mark=20), ".png"),
            "a/marked_38.png": encode(_resized(_page(mark=20), 0.4), ".png"),
        },
    )
    assert _near(ambiguous) == []
    clear = _pack(
        tmp_path / "b",
        {
            "b/plain.png": encode(_page(), ".png"),
            "b/marked.png": encode(_page(mark=30), ".png"),
            "b/marked_48.png": encode(_resized(_page(mark=30), 0.5), ".png"),
        },
    )
    assert _near(clear) == [["b/marked.png", "b/marked_48.png"]]
