"""Write the built-in sample dataset: small PNG and JPEG images of drawn shapes in class folders.

Deterministic for a given --seed: the same command writes the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

CLASSES = (
    "circle",
    "square",
    "triangle",
    "cross",
    "ring",
    "hbars",
    "vbars",
    "diagonal",
    "dots",
    "star",
)


def draw(kind: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """One noisy image of shape `kind`."""
    image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
    color = tuple(int(c) for c in rng.integers(120, 256, 3))
    c = size // 2 + int(rng.integers(-size // 8, size // 8 + 1))
    r = size // 4 + int(rng.integers(-size // 16, size // 16 + 1))
    t = max(1, size // 24)
    if kind == "circle":
        cv2.circle(image, (c, c), r, color, -1)
    elif kind == "square":
        cv2.rectangle(image, (c - r, c - r), (c + r, c + r), color, -1)
    elif kind == "triangle":
        pts = np.array([[c, c - r], [c - r, c + r], [c + r, c + r]], np.int32)
        cv2.fillPoly(image, [pts], color)
    elif kind == "cross":
        cv2.line(image, (c - r, c - r), (c + r, c + r), color, 2 * t)
        cv2.line(image, (c - r, c + r), (c + r, c - r), color, 2 * t)
    elif kind == "ring":
        cv2.circle(image, (c, c), r, color, 2 * t)
    elif kind == "hbars":
        for y in range(t, size, 4 * t):
            cv2.rectangle(image, (0, y), (size, y + t), color, -1)
    elif kind == "vbars":
        for x in range(t, size, 4 * t):
            cv2.rectangle(image, (x, 0), (x + t, size), color, -1)
    elif kind == "diagonal":
        cv2.line(image, (0, 0), (size, size), color, 3 * t)
    elif kind == "dots":
        for _ in range(12):
            x, y = (int(v) for v in rng.integers(0, size, 2))
            cv2.circle(image, (x, y), 2 * t, color, -1)
    else:
        angles = np.linspace(0, 2 * np.pi, 11)[:-1] - np.pi / 2
        radii = np.where(np.arange(10) % 2 == 0, r, r // 2)
        pts = np.stack([c + radii * np.cos(angles), c + radii * np.sin(angles)], 1)
        cv2.fillPoly(image, [pts.astype(np.int32)], color)
    noise = rng.normal(0, 12, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


def write_demo(out: Path, *, per_class: int, size: int, seed: int) -> int:
    """Write `per_class` images for each class under `out`; return how many were written."""
    rng = np.random.default_rng(seed)
    count = 0
    for kind in CLASSES:
        folder = out / kind
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = draw(kind, rng, size)
            if i % 3 == 2:
                ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
                name = f"{kind}_{i:05d}.jpg"
            else:
                ok, buf = cv2.imencode(".png", image)
                name = f"{kind}_{i:05d}.png"
            assert ok
            (folder / name).write_bytes(buf.tobytes())
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = write_demo(args.out, per_class=args.per_class, size=args.size, seed=args.seed)
    print(f"wrote {n} images in {len(CLASSES)} class folders under {args.out}")


if __name__ == "__main__":
    main()
