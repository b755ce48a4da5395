"""Perceptual hashes of images (64 bits), candidate pairs by Hamming distance, and the pixel check.

A resized or re-encoded copy of an image keeps its coarse brightness structure, so a hash of a
tiny gray thumbnail stays within a few bits of the original's: mostly 0-3, but up to 8 for a
small icon resized by an odd factor. `near_pairs` finds every pair of hashes within
``radius`` bits (at most `MAX_RADIUS`, 8) without comparing all pairs (multi-index hashing):
the 64 bits are cut into `CANDIDATE_BANDS` bands (eight of 7 bits and one of 8), and two
hashes within 8 bits agree exactly on at least one band (pigeonhole: 8 differing bits cannot
touch all 9 bands), so only hashes that share a band value are compared, on all 64 bits (one
popcount). A bucket holds about N / 128 hashes, so the work grows as N log N (the sorts) plus
9 * N * N / 256 popcounts, all in numpy (no Python loop over buckets or pairs): 0.1 s at 10^4
distinct hashes, 4.6 s at 10^5 (measured on a loaded 2-core VM); the quadratic term rules
beyond that (minutes at 10^6, still less than decoding 10^6 images).

A hash match is only a candidate: distinct pictures that share a layout (document icons, a
folder in six colours) hash alike. `similar` confirms a candidate pair on colour thumbnails,
`fine_difference` measures it again at the smaller image's own size (a caption or a mark that
a thumbnail averages away), and `cliques` groups only images that are confirmed pairwise,
closest pairs first, so that a chain A~B~C never puts A and C together. `group_near`
(connected components of hash matches, four 16-bit bands, at most 3 bits) is kept for
measuring hashes alone; it chains, so it is not what ``packer dupes`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np

BANDS = 4  # `group_near`: four bands of 16 bits
BAND_BITS = 64 // BANDS
MAX_THRESHOLD = BANDS - 1  # the largest distance `group_near`'s banding finds every pair for
# `near_pairs`: 8 bands of 7 bits and one of 8 (the top bits); 9 bands find every pair <= 8 apart
CANDIDATE_BANDS = ((0, 7), (7, 7), (14, 7), (21, 7), (28, 7), (35, 7), (42, 7), (49, 7), (56, 8))
MAX_RADIUS = len(CANDIDATE_BANDS) - 1  # the largest distance `near_pairs` finds every pair for
# measured (scripts/bench_dupes.py): a third of the copies that 3 bits missed lie 4-8 bits from
# their original; the pixel checks, not the hash, keep look-alikes apart
DEFAULT_RADIUS = MAX_RADIUS


def _pack_bits(bits: np.ndarray) -> int:
    """64 booleans -> one unsigned 64-bit integer (first bit most significant)."""
    return int.from_bytes(np.packbits(bits.ravel()).tobytes(), "big")


def dhash(gray: np.ndarray) -> int:
    """The difference hash of a gray image: is each of 8x8 pixels brighter than its left one.

    The image is first shrunk to 9x8 pixels by area averaging.
    """
    small = cv2.resize(_two_d(gray), (9, 8), interpolation=cv2.INTER_AREA).astype(np.int16)
    return _pack_bits(small[:, 1:] > small[:, :-1])


def phash(gray: np.ndarray) -> int:
    """Return the DCT hash (pHash) of a gray image.

    The signs of the 8x8 lowest frequencies of a 32x32 thumbnail against their median (the
    constant term left out of the median).
    """
    small = cv2.resize(_two_d(gray), (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32)
    low = cv2.dct(small)[:8, :8]
    median = float(np.median(low.ravel()[1:]))
    return _pack_bits(low > median)


HASHES: dict[str, Callable[[np.ndarray], int]] = {"dhash": dhash, "phash": phash}
DEFAULT_HASH = "phash"  # measured: scripts/bench_dupes.py (recall on planted copies)


def _two_d(gray: np.ndarray) -> np.ndarray:
    if gray.ndim == 3:
        gray = gray[:, :, 0] if gray.shape[2] == 1 else cv2.cvtColor(gray, cv2.COLOR_BGR2GRAY)
    if gray.dtype != np.uint8:  # 16-bit PNGs: the high byte is what the eye sees
        gray = (gray >> 8).astype(np.uint8) if gray.dtype == np.uint16 else gray.astype(np.uint8)
    return gray


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise distance between uint64 arrays (broadcasting)."""
    out: np.ndarray = np.bitwise_count(np.bitwise_xor(a, b))
    return out


def _band_pairs(unique: np.ndarray, values: np.ndarray, threshold: int) -> np.ndarray:
    """Pairs (i, j) of positions in `unique` that share a band value and lie within `threshold`.

    Vectorised over all buckets at once: step d compares each hash with the one d places
    after it in its bucket, so the work is the sum of m * m / 2 over buckets of m hashes,
    in numpy, with no Python loop over buckets.
    """
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    lengths = np.diff(np.concatenate((starts, [len(ordered)])))
    # how many hashes follow each position in its bucket
    after = np.repeat(starts + lengths, lengths) - np.arange(len(ordered)) - 1
    active = np.flatnonzero(after >= 1)
    found = []
    d = 1
    while active.size:
        a, b = order[active], order[active + d]
        close = hamming(unique[a], unique[b]) <= threshold
        found.append(np.stack([a[close], b[close]], axis=1))
        d += 1
        active = active[after[active] >= d]
    return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)


def near_pairs(hashes: np.ndarray, radius: int = DEFAULT_RADIUS) -> np.ndarray:
    """Every pair ``(i, j)``, ``i < j``, of positions in `hashes` within `radius` bits.

    Rows with equal hashes are compared once as one hash, then expanded. Sorted by (i, j).

    Raises:
        ValueError: `radius` is above `MAX_RADIUS` (the banding would miss pairs).
    """
    if not 0 <= radius <= MAX_RADIUS:
        raise ValueError(f"radius {radius}: expected 0..{MAX_RADIUS}")
    hashes = np.asarray(hashes, dtype=np.uint64)
    unique, inverse = np.unique(hashes, return_inverse=True)
    inverse = inverse.ravel()
    found = np.concatenate(
        [
            _band_pairs(unique, (unique >> np.uint64(shift)) & np.uint64((1 << bits) - 1), radius)
            for shift, bits in CANDIDATE_BANDS
        ]
    )
    # a pair that shares several bands is found once per band
    low, high = np.minimum(found[:, 0], found[:, 1]), np.maximum(found[:, 0], found[:, 1])
    codes = np.unique(low * len(unique) + high) if len(found) else np.empty(0, dtype=np.int64)
    rows_of: list[list[int]] = [[] for _ in range(len(unique))]
    for row, u in enumerate(inverse.tolist()):
        rows_of[u].append(row)
    n = len(unique)
    out = [(x, y) for code in codes.tolist() for x in rows_of[code // n] for y in rows_of[code % n]]
    for rows in rows_of:  # equal hashes
        out.extend((x, y) for k, x in enumerate(rows) for y in rows[k + 1 :])
    result = np.array(sorted((min(x, y), max(x, y)) for x, y in out), dtype=np.int64)
    return result.reshape(-1, 2)


THUMB_SIDE = 64  # the colour thumbnail `similar` compares (at most this side)
MIN_SIDE = 32  # images smaller than this on their short side are not compared for near copies
MAX_MEAN_DIFF = 12.0  # mean over the compared thumbnail of the largest Y, Cr or Cb difference
MAX_LOCAL_DIFF = 32.0  # the largest 3x3 average of a Y, Cr or Cb signed difference


def flatten(image: np.ndarray) -> np.ndarray:
    """`image` (gray, BGR or BGRA; 8 or 16 bits) as 8-bit BGR, transparency over black."""
    if image.dtype != np.uint8:  # 16-bit PNGs: the high byte is what the eye sees
        image = (
            (image >> 8).astype(np.uint8) if image.dtype == np.uint16 else image.astype(np.uint8)
        )
    if image.ndim == 2 or image.shape[2] == 1:
        return cv2.cvtColor(image.reshape(image.shape[:2]), cv2.COLOR_GRAY2BGR)
    if image.shape[2] in (2, 4):  # gray or BGR + alpha
        colour, alpha = image[:, :, :-1], image[:, :, -1]
        if image.shape[2] == 2:
            colour = cv2.cvtColor(colour, cv2.COLOR_GRAY2BGR)
        if int(alpha.min()) == 255:
            return np.ascontiguousarray(colour)
        return cv2.multiply(colour, cv2.merge([alpha, alpha, alpha]), scale=1 / 255)
    return image


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The `THUMB_SIDE` square thumbnail (uint8 BGR, area-averaged) of a BGR image."""
    return cv2.resize(flatten(image), (THUMB_SIDE, THUMB_SIDE), interpolation=cv2.INTER_AREA)


def compared_side(short_side: int) -> int:
    """The side `similar` compares two images at, from the smaller short side.

    Half of it, rounded down to a power of two, from 16 to `THUMB_SIDE` (32 px -> 16,
    64 -> 32, 128 and more -> 64).
    """
    side = 16
    while side < THUMB_SIDE and 2 * side <= short_side // 2:
        side *= 2
    return side


def similar(a: np.ndarray, b: np.ndarray, short_side: int) -> bool:
    """Whether thumbnails `a` and `b` show the same picture (a copy, resized or re-encoded).

    `short_side` is the smaller of the two images' short sides; they are compared at
    `compared_side` (16, 32 or 64 pixels: each pixel averages 2x2 or more), where a small
    image's JPEG noise averages out and a large image's details still show. The pair must
    agree overall (the mean of the largest channel difference) and everywhere locally (each
    3x3 average of a channel's signed difference): noise averages out locally, a changed
    detail (an emblem, a caption, another colour) does not. Channels are luma and the two
    chroma differences (YCrCb), as JPEG stores them: a JPEG's colour is kept at half
    resolution, and its bleeding at a colour edge, summed over B, G and R, looked like a
    change on small icons.
    """
    side = compared_side(short_side)
    if side != a.shape[0]:
        a = cv2.resize(a, (side, side), interpolation=cv2.INTER_AREA)
        b = cv2.resize(b, (side, side), interpolation=cv2.INTER_AREA)
    diff = _ycrcb(a) - _ycrcb(b)
    mag = np.abs(diff)  # the largest channel: np.maximum, as max(axis=2) is slow on 3 values
    if float(np.maximum(np.maximum(mag[:, :, 0], mag[:, :, 1]), mag[:, :, 2]).mean()) > (
        MAX_MEAN_DIFF
    ):
        return False
    local = cv2.blur(diff, (3, 3), borderType=cv2.BORDER_REFLECT)
    return float(np.abs(local).max()) <= MAX_LOCAL_DIFF


COARSE_SIDE = 16  # `maybe_similar` compares every candidate pair at this side first
# what rounding can add to a difference at COARSE_SIDE: each image's coarse YCrCb differs from
# the average of its finer one by at most 0.5 (its BGR rounded at 16 px) + 0.5 (at 32 px) + 0.5
# + 0.5 (YCrCb rounded at either side; each YCrCb row's coefficients sum to 1 in magnitude)
COARSE_SLACK = 4.0


def coarse_view(thumb: np.ndarray) -> np.ndarray:
    """`maybe_similar`'s view of a `thumbnail`: YCrCb at `COARSE_SIDE`, int16, channels first."""
    small = cv2.resize(thumb, (COARSE_SIDE, COARSE_SIDE), interpolation=cv2.INTER_AREA)
    return np.moveaxis(cv2.cvtColor(small, cv2.COLOR_BGR2YCrCb), 2, 0).astype(np.int16)


def maybe_similar(views: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair ``(a[k], b[k])`` of positions in `views` (`coarse_view`s): can `similar` accept it.

    False only where `similar` rejects the pair at any side (16, 32 or 64), so it filters
    candidates before the per-pair checks, in numpy over all pairs at once. At 16 px, each
    pixel is the average of a block of the finer sides' pixels (area averaging by a whole
    factor), so the mean of the largest channel difference cannot exceed the finer one's, and
    a 3x3 average away from the border is the average of 3x3 averages of the finer difference
    (4 at 32 px, 16 at 64), so it cannot exceed their largest; `COARSE_SLACK` covers rounding.
    """
    keep = np.empty(len(a), dtype=bool)
    mean_bound = (MAX_MEAN_DIFF + COARSE_SLACK) * COARSE_SIDE * COARSE_SIDE
    local_bound = (MAX_LOCAL_DIFF + COARSE_SLACK) * 9
    for start in range(0, len(a), 4096):  # chunks: a few MB of int16 at a time
        diff = views[a[start : start + 4096]] - views[b[start : start + 4096]]
        mag = np.abs(diff)
        largest = np.maximum(np.maximum(mag[:, 0], mag[:, 1]), mag[:, 2])
        rows = diff[:, :, :-2] + diff[:, :, 1:-1] + diff[:, :, 2:]  # 3x3 sums, interior only
        box = rows[:, :, :, :-2] + rows[:, :, :, 1:-1] + rows[:, :, :, 2:]
        keep[start : start + 4096] = (largest.sum(axis=(1, 2)) <= mean_bound) & (
            np.abs(box).max(axis=(1, 2, 3)) <= local_bound
        )
    return keep


FINE_SIDE = 128  # `fine_difference` compares at the smaller image's size, at most this short side
FINE_BLUR = 1.0  # sigma (pixels) of the blur that absorbs resampling and JPEG ringing
MAX_FINE_DIFF = 34.0  # the largest blurred luma difference a copy shows at full size
MAX_LOSSLESS_DIFF = 8.0  # the same, for two lossless images of one size (nothing to explain)


def fine_view(image: np.ndarray) -> np.ndarray:
    """The luma (uint8) of a BGR image, area-averaged to at most `FINE_SIDE` on its short side."""
    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    h, w = gray.shape[:2]
    if min(h, w) > FINE_SIDE:
        scale = FINE_SIDE / min(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        gray = cv2.resize(gray, size, interpolation=cv2.INTER_AREA)
    return gray


def fine_difference(a: np.ndarray, b: np.ndarray) -> float:
    """How far two `fine_view` lumas differ, compared at the smaller one's own size.

    The larger is area-averaged to the smaller's size (what resizing it would give), the
    difference is blurred lightly (`FINE_BLUR`: resampling and JPEG ringing are pixel-sized
    and of both signs, a caption, an emblem or a mark is not), and the largest absolute
    value is returned: 0 for a copy resized the same way, a few levels for a re-encoding.
    """
    if a.shape[0] * a.shape[1] < b.shape[0] * b.shape[1]:
        a, b = b, a
    h, w = b.shape[:2]
    if a.shape[:2] != (h, w):
        a = cv2.resize(a, (w, h), interpolation=cv2.INTER_AREA)
    diff = a.astype(np.float32) - b.astype(np.float32)
    blurred = np.abs(cv2.GaussianBlur(diff, (0, 0), FINE_BLUR, borderType=cv2.BORDER_REFLECT))
    return float(blurred.max())


def _ycrcb(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image, cv2.COLOR_BGR2YCrCb).astype(np.float32)


def cliques(
    pairs: np.ndarray,
    confirm: Callable[[int, int], bool],
    scores: Sequence[float] | None = None,
) -> list[list[int]]:
    """Groups in which every two members are confirmed: no chaining through a middle member.

    `pairs` are the confirmed pairs (graph edges); `confirm(i, j)` checks a pair that is not
    an edge. The edges are taken in order of their `scores` (the closest pair first; ties and
    no scores: in the order given), and an edge merges the two groups of its ends only when
    every member of one is confirmed with every member of the other (complete linkage). So an
    image joins the image it is closest to before looser look-alikes can claim either.
    Each position is in at most one group; groups have >= 2 members, sorted, in order of
    their first member.
    """
    edge_list = [(a, b) for a, b in np.asarray(pairs).reshape(-1, 2).tolist() if a != b]
    edges = {(min(a, b), max(a, b)) for a, b in edge_list}
    if scores is not None:
        order = np.argsort(np.asarray(scores, dtype=np.float64)[: len(edge_list)], kind="stable")
        edge_list = [edge_list[k] for k in order.tolist()]

    def linked(i: int, j: int) -> bool:
        return (min(i, j), max(i, j)) in edges or confirm(i, j)

    group_of: dict[int, list[int]] = {}
    for a, b in edge_list:
        ga, gb = group_of.get(a, [a]), group_of.get(b, [b])
        if ga is gb or not all(linked(i, j) for i in ga for j in gb):
            continue
        merged = ga + gb
        for v in merged:
            group_of[v] = merged
    groups = {id(g): g for g in group_of.values()}.values()
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def _components(n: int, pairs: np.ndarray) -> np.ndarray:
    """The smallest member of each position's connected component (label propagation)."""
    labels = np.arange(n)
    if not len(pairs):
        return labels
    a, b = pairs[:, 0], pairs[:, 1]
    while True:
        low = np.minimum(labels[a], labels[b])
        before = labels.copy()
        np.minimum.at(labels, a, low)
        np.minimum.at(labels, b, low)
        labels = labels[labels]  # pointer jumping: long chains settle in few rounds
        if np.array_equal(labels, before):
            return labels


def group_near(hashes: np.ndarray, threshold: int = 2) -> list[np.ndarray]:
    """Groups of positions in `hashes` (uint64) linked by distances of at most `threshold` bits.

    A group is a connected component: two members may be further apart than `threshold`
    when others lie between them. Each group is sorted; groups come in order of their first
    member.

    Raises:
        ValueError: `threshold` is above `MAX_THRESHOLD` (the banding would miss pairs).
    """
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"threshold {threshold}: expected 0..{MAX_THRESHOLD}")
    hashes = np.asarray(hashes, dtype=np.uint64)
    unique, inverse = np.unique(hashes, return_inverse=True)  # equal hashes: one comparison
    mask = np.uint64((1 << BAND_BITS) - 1)
    pairs = [
        _band_pairs(unique, (unique >> np.uint64(band * BAND_BITS)) & mask, threshold)
        for band in range(BANDS)
    ]
    roots = _components(len(unique), np.concatenate(pairs))
    row_roots = roots[inverse.ravel()]
    shared = np.bincount(row_roots, minlength=len(unique))[row_roots] >= 2
    rows = np.flatnonzero(shared)  # only rows with company: singletons are never split out
    order = rows[np.argsort(row_roots[rows], kind="stable")]
    ordered = row_roots[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    groups = np.split(order, cuts) if len(order) else []
    return sorted((np.sort(g) for g in groups), key=lambda g: int(g[0]))
