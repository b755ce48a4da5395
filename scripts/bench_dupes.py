"""Benchmark of ``packer dupes``: the exact pass at 10^6 index rows, and near-copy recall.

Exact pass: a synthetic 1,000,000-row index (the crc32 and nbytes columns as `load_index`
gives them) with 10,000 planted groups of 2-3 identical records and 1,000 planted decoys
(rows with the same size and CRC-32 as another but other bytes). Timed: the candidate search
(`exact_candidates`: one sort of a 64-bit key) and the confirmation (`confirm_candidates`:
BLAKE2b of each candidate's bytes, served from memory here, so the time is the hashing and
the bookkeeping, not a disk). Checked: every planted group is found, no decoy is grouped.
Also timed: `load_index` of a 10^6-row index.parquet with the columns dupes loads, and the
near pass's grouping of 10^6 hashes (the decoding, per image, is in the near table).

Near copies: real photos-like images are the oxygen icons (256x256 PNG, Debian's
oxygen-icon-theme) on white, else smooth synthetic images. Each original gets planted copies
(half size; 0.7 size re-encoded as JPEG q75; JPEG q90 at full size; a quarter size); recall is
the share of (original, copy) pairs put in one group, false groups are groups among the
distinct originals alone. Measured for dHash and pHash at thresholds 0..3.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchlib

from packer.dupes import confirm_candidates, exact_candidates
from packer.nearhash import HASHES, MAX_THRESHOLD, group_near

ICONS = Path("/usr/share/icons/oxygen/base/256x256")


def synthetic_index(n: int, groups: int, decoys: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """crc32, nbytes and the planted structure: {row: content id} for the rows that share."""
    rng = np.random.default_rng(0)
    crc = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    nbytes = rng.integers(2000, 60000, n).astype(np.uint32)
    rows = rng.permutation(n)
    content: dict[int, int] = {}
    at = 0
    for g in range(groups):
        size = 2 + g % 2
        members = rows[at : at + size]
        at += size
        crc[members], nbytes[members] = crc[members[0]], nbytes[members[0]]
        for r in members.tolist():
            content[r] = g
    for d in range(decoys):  # same key as a random row, other bytes
        a, b = rows[at], rows[at + 1]
        at += 2
        crc[b], nbytes[b] = crc[a], nbytes[a]
        content[int(a)], content[int(b)] = groups + 2 * d, groups + 2 * d + 1
    return crc, nbytes, content


def bench_exact(n: int, groups: int, decoys: int) -> list[str]:
    crc, nbytes, content = synthetic_index(n, groups, decoys)
    blobs: dict[int, bytes] = {}
    rng = np.random.default_rng(1)

    def read(row: int) -> bytes:
        c = content[row]
        if c not in blobs:
            blobs[c] = rng.bytes(int(nbytes[row]))
        return blobs[c]

    for r in content:  # make the bytes before the clock starts: reading is not what is timed
        read(r)
    t = time.perf_counter()
    runs = exact_candidates(crc, nbytes)
    t_candidates = time.perf_counter() - t
    t = time.perf_counter()
    found = confirm_candidates(runs, read)
    t_confirm = time.perf_counter() - t
    assert len(found) == groups, (len(found), groups)
    assert all(len({content[int(r)] for r in g}) == 1 for g, _ in found)
    hashed = sum(len(r) for r in runs)
    mb = sum(int(nbytes[r]) for run in runs for r in run.tolist()) / 1e6
    return [
        f"| candidate search ({n:,} rows) | {t_candidates:.2f} s | {len(runs):,} runs |",
        f"| confirm: BLAKE2b of {hashed:,} candidates ({mb:.0f} MB) | {t_confirm:.2f} s | "
        f"{len(found):,} groups, {decoys:,} decoys rejected |",
    ]


def bench_load(n: int) -> str:
    from bench_index import write_synthetic

    from readers.index import load_index

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp) / "synthetic.lmdb"
        write_synthetic(root, n)
        t = time.perf_counter()
        index = load_index(root, extra=("path", "width", "height", "format"))
        took = time.perf_counter() - t
        assert len(index) == n
    return f"| load_index with path, width, height, format ({n:,} rows) | {took:.2f} s | |"


def bench_group_near(n: int) -> str:
    """`group_near` on `n` random hashes with 1,000 planted pairs 2 bits apart."""
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
    hashes[:1000] = hashes[1000:2000] ^ np.uint64(0b101)
    t = time.perf_counter()
    groups = group_near(hashes, 2)
    took = time.perf_counter() - t
    what = f"near grouping (group_near, {n:,} hashes, threshold 2)"
    return f"| {what} | {took:.2f} s | {len(groups):,} groups |"


def originals(limit: int) -> tuple[list[np.ndarray], str]:
    # the theme holds one picture under several names (links): each picture once
    icons = sorted({p.resolve() for p in ICONS.rglob("*.png")}) if ICONS.is_dir() else []
    images = []
    for path in icons[:limit]:
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if image is None or image.ndim != 3 or image.shape[2] != 4:
            continue
        alpha = image[:, :, 3:4].astype(np.float32) / 255
        images.append((image[:, :, :3] * alpha + 255 * (1 - alpha)).astype(np.uint8))
    if images:
        return images, f"{len(images)} oxygen icons 256x256 on white"
    return smooth(limit), f"{limit} smooth synthetic images 256x256"


def smooth(n: int) -> list[np.ndarray]:
    """`n` distinct images: random 6x6 colours blown up to 256x256 (bicubic)."""
    rng = np.random.default_rng(0)
    images = []
    for _ in range(n):
        low = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        images.append(cv2.resize(low, (256, 256), interpolation=cv2.INTER_CUBIC))
    return images


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)


COPIES = {
    "half size": lambda im: cv2.resize(im, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA),
    "0.7 size, JPEG q75": lambda im: _jpeg(
        cv2.resize(im, None, fx=0.7, fy=0.7, interpolation=cv2.INTER_AREA), 75
    ),
    "JPEG q90": lambda im: _jpeg(im, 90),
    "quarter size": lambda im: cv2.resize(im, None, fx=0.25, fy=0.25, interpolation=cv2.INTER_AREA),
}


def bench_near(limit: int) -> list[str]:
    images, what = originals(limit)
    n = len(images)
    gray = [cv2.cvtColor(im, cv2.COLOR_BGR2GRAY) for im in images]
    copies = {
        name: [cv2.cvtColor(f(im), cv2.COLOR_BGR2GRAY) for im in images]
        for name, f in COPIES.items()
    }
    lines = [
        f"Near copies: {what}; {len(COPIES)} planted copies of each ({', '.join(COPIES)}).",
        "",
        "| hash | threshold | recall (pairs found) | "
        + " | ".join(f"recall: {c}" for c in COPIES)
        + " | groups among the originals | groups among 2,000 distinct smooth images"
        + " | hash time per image |",
        "|---|---|---|" + "---|" * len(COPIES) + "---|---|---|",
    ]
    for name, fn in HASHES.items():
        t = time.perf_counter()
        base = np.array([fn(g) for g in gray], dtype=np.uint64)
        per_image = (time.perf_counter() - t) / n
        distinct = np.array(
            [fn(cv2.cvtColor(im, cv2.COLOR_BGR2GRAY)) for im in smooth(2000)], dtype=np.uint64
        )
        planted = {c: np.array([fn(g) for g in ims], dtype=np.uint64) for c, ims in copies.items()}
        for threshold in range(MAX_THRESHOLD + 1):
            hashes = np.concatenate([base, *planted.values()])
            group_of = np.full(len(hashes), -1)
            for k, g in enumerate(group_near(hashes, threshold)):
                group_of[g] = k
            per_copy = []
            for c in range(len(COPIES)):
                rows = np.arange(n) + n * (c + 1)
                per_copy.append(
                    float(np.mean((group_of[:n] >= 0) & (group_of[:n] == group_of[rows])))
                )
            false = len(group_near(base, threshold))
            lines.append(
                f"| {name} | {threshold} | {np.mean(per_copy):.1%} | "
                + " | ".join(f"{r:.1%}" for r in per_copy)
                + f" | {false} | {len(group_near(distinct, threshold))}"
                + f" | {per_image * 1e6:.0f} us |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--decoys", type=int, default=1_000)
    parser.add_argument("--icons", type=int, default=600)
    benchlib.add_output_arguments(parser, "bench_dupes")
    args = parser.parse_args()
    lines = [
        f"### packer dupes: exact pass on {args.rows:,} index rows",
        "",
        "| step | time | result |",
        "|---|---|---|",
        *bench_exact(args.rows, args.groups, args.decoys),
        bench_load(args.rows),
        bench_group_near(args.rows),
        "",
        *bench_near(args.icons),
    ]
    text = "\n".join(lines)
    print(text)
    benchlib.save_results(args, "bench_dupes", text + "\n")


if __name__ == "__main__":
    main()
