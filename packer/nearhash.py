"""Perceptual hashes of images (64 bits) and grouping by Hamming distance, near-linearly.

A resized or re-encoded copy of an image keeps its coarse brightness structure, so a hash of a
tiny gray thumbnail stays within a few bits of the original's. `group_near` finds every pair
of hashes within ``threshold`` bits without comparing all pairs: the 64 bits are cut into
``BANDS`` bands of 16 bits, and two hashes within 3 bits agree on at least one band
(pigeonhole), so only hashes that share a band value are compared. With hashes spread over
the 2**16 values of a band, a bucket holds about N / 65536 hashes, so the work grows as
N log N (the sorts) plus N * N / 65536 comparisons per band, done as numpy blocks.
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
    """The DCT hash of a gray image: the signs of the 8x8 lowest frequencies of a 32x32 thumbnail
    against their median (the constant term left out of the median)."""
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


class _Components:
    """Union-find over 0..n-1."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n)

    def find(self, i: int) -> int:
        parent = self.parent
        root = i
        while parent[root] != root:
            root = int(parent[root])
        while parent[i] != root:
            parent[i], i = root, int(parent[i])
        return root

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def _close_pairs(hashes: np.ndarray, members: np.ndarray, threshold: int) -> np.ndarray:
    """Pairs (i, j), i < j, of `members` (indices into `hashes`) within `threshold` bits."""
    found = []
    block = 1024  # a block x m distance matrix at a time: memory stays bounded
    values = hashes[members]
    for start in range(0, len(members), block):
        rows = values[start : start + block, None]
        dist = hamming(rows, values[None, :])
        i, j = np.nonzero(dist <= threshold)
        i = i + start
        keep = i < j
        found.append(np.stack([members[i[keep]], members[j[keep]]], axis=1))
    return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)


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
    components = _Components(len(unique))
    mask = np.uint64((1 << BAND_BITS) - 1)
    for band in range(BANDS):
        values = (unique >> np.uint64(band * BAND_BITS)) & mask
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [len(ordered)]))
        for s, e in zip(starts[ends - starts >= 2], ends[ends - starts >= 2], strict=True):
            for i, j in _close_pairs(unique, order[s:e], threshold):
                components.union(int(i), int(j))
    roots = np.array([components.find(i) for i in range(len(unique))], dtype=np.int64)
    row_roots = roots[inverse.ravel()] if len(unique) else np.empty(0, dtype=np.int64)
    order = np.argsort(row_roots, kind="stable")
    ordered = row_roots[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    groups = [g for g in np.split(order, cuts) if len(g) >= 2]
    return sorted((np.sort(g) for g in groups), key=lambda g: int(g[0]))
