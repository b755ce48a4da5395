"""Perceptual hashes of images (64 bits) and grouping by Hamming distance, near-linearly.

A resized or re-encoded copy of an image keeps its coarse brightness structure, so a hash of a
tiny gray thumbnail stays within a few bits of the original's. `group_near` finds every pair
of hashes within ``threshold`` bits without comparing all pairs: the 64 bits are cut into
``BANDS`` bands of 16 bits, and two hashes within 3 bits agree on at least one band
(pigeonhole), so only hashes that share a band value are compared. With hashes spread over
the 2**16 values of a band, a bucket holds about N / 65536 hashes, so the work grows as
N log N (the sorts) plus N * N / 65536 comparisons per band, all in numpy (no Python loop over
buckets or pairs).
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

BANDS = 4
BAND_BITS = 64 // BANDS
MAX_THRESHOLD = BANDS - 1  # the largest distance the banding finds every pair for
DEFAULT_THRESHOLD = 2  # pHash distances of copies come in pairs of bits: 3 finds what 2 does


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


def group_near(hashes: np.ndarray, threshold: int = DEFAULT_THRESHOLD) -> list[np.ndarray]:
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
