"""Decoding less on large photos: ``draft=`` and the crop planned before decoding, vs a full
decode followed by the same transform.

Photos: Debian's mate-backgrounds wallpapers (``apt-get install mate-backgrounds``; the JPEG
photos under /usr/share/backgrounds/mate/), cut into ``--crops`` boxes each with sides drawn
from 900-2400 px (clamped to the photo) and re-encoded at JPEG quality 90, packed with
``packer build`` (LMDB). Each image is then read through the dataset in this process (the
page cache warm, so the figures are decode + transform) with, side by side in each run:

- eval: paddle's ``Resize(256)`` + ``CenterCrop(224)``, plain vs ``draft=256``;
- train: paddle's ``RandomResizedCrop(224)`` after a full decode vs
  ``readers.transforms.RandomResizedCropDraft(224)`` (the same boxes: both seeded alike).

Each figure is the median over ``--runs`` runs of the ms per image; the rows alternate within
a run (the shared machine's load drifts). PSNR compares each drafted output with the
full-decode output of the same image (and the same box). ``--out DIR`` writes
DIR/bench_photos.md; BENCH_TMP names the parent of the temporary data.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHOTOS = Path("/usr/share/backgrounds/mate")
SIDES = (900, 2400)


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def write_photos(dst: Path, *, crops: int, seed: int = 0) -> int:
    """Cut every JPEG photo under `PHOTOS` into `crops` boxes (sides 900-2400 px) saved at
    quality 90 under ``dst/<folder>/``; returns how many."""
    import cv2

    sources = sorted(p for p in PHOTOS.rglob("*.jpg") if p.is_file())
    if not sources:
        raise SystemExit(f"no photos under {PHOTOS}: apt-get install mate-backgrounds")
    rng = np.random.default_rng(seed)
    count = 0
    for path in sources:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            continue
        folder = dst / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(crops):
            h = int(rng.integers(SIDES[0], min(SIDES[1], image.shape[0]) + 1))
            w = int(rng.integers(SIDES[0], min(SIDES[1], image.shape[1]) + 1))
            top = int(rng.integers(0, image.shape[0] - h + 1))
            left = int(rng.integers(0, image.shape[1] - w + 1))
            box = image[top : top + h, left : left + w]
            cv2.imwrite(str(folder / f"{path.stem}_{n}.jpg"), box, [cv2.IMWRITE_JPEG_QUALITY, 90])
            count += 1
    return count


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if err == 0 else float(10 * np.log10(255.0**2 / err))


def read_all(ds: Any, seed: int) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """Wall seconds per image reading every sample of `ds`, each sample's CPU seconds, and
    the outputs; sample i is seeded with ``(seed, i)``, so a random transform draws the same
    box in every row."""
    out = []
    cpu = np.zeros(len(ds))
    start = time.perf_counter()
    for i in range(len(ds)):
        np.random.seed(seed * 100_003 + i)  # noqa: NPY002 - paddle's transforms draw from it
        random.seed(seed * 100_003 + i)
        begin = time.process_time()
        out.append(ds[i][0])
        cpu[i] = time.process_time() - begin
    return (time.perf_counter() - start) / len(ds), cpu, out


def speedups(full: list[np.ndarray], fast: list[np.ndarray], pick: np.ndarray) -> float:
    """The median over runs of each run's CPU-time ratio, over the samples in `pick`."""
    return statistics.median(
        float(a[pick].sum() / b[pick].sum()) for a, b in zip(full, fast, strict=True)
    )


def psnr_text(values: list[float]) -> str:
    v = np.asarray(values)
    return f"{v.min():.1f} / {np.median(v):.1f} / {int((v < 30).sum())} of {v.size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=4, help="boxes cut from each photo")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="write DIR/bench_photos.md")
    args = parser.parse_args()

    import cv2
    from paddle.vision.transforms import CenterCrop, Compose, RandomResizedCrop, Resize

    from packer.build import build
    from packer.config import BuildConfig
    from readers import open_dataset
    from readers.draft import draft_scale
    from readers.transforms import RandomResizedCropDraft

    tmp = Path(tempfile.mkdtemp(prefix="bench_photos-", dir=os.environ.get("BENCH_TMP")))
    try:
        write_photos(tmp / "src", crops=args.crops)
        build(BuildConfig(src=tmp / "src", out=tmp / "out", format="lmdb"))
        out = tmp / "out"
        eval_t = Compose([Resize(256), CenterCrop(224)])
        rows: dict[str, Callable[[], Any]] = {
            "eval full": lambda: open_dataset(out, transform=eval_t),
            "eval draft": lambda: open_dataset(out, transform=eval_t, draft=256),
            "train full": lambda: open_dataset(out, transform=RandomResizedCrop(224)),
            "train planned": lambda: open_dataset(out, transform=RandomResizedCropDraft(224)),
        }
        datasets = {name: make() for name, make in rows.items()}
        index = datasets["eval full"].index
        assert index is not None
        from readers.index import load_index

        sized = load_index(out, extra=("height", "width"))
        sizes = [
            (int(h), int(w))
            for h, w in zip(sized.extra["height"], sized.extra["width"], strict=True)
        ]
        for ds in datasets.values():
            read_all(ds, 0)  # warm: the page cache, the handles, the code
        wall: dict[str, list[float]] = {name: [] for name in rows}
        cpu: dict[str, list[np.ndarray]] = {name: [] for name in rows}
        outputs: dict[str, list[np.ndarray]] = {}
        for run in range(args.runs):
            for name in list(rows) if run % 2 == 0 else list(reversed(rows)):
                seconds, per_sample, outputs[name] = read_all(datasets[name], run)
                wall[name].append(seconds)
                cpu[name].append(per_sample)
            eprint(
                f"run {run + 1}/{args.runs}, CPU ms per image: "
                + ", ".join(f"{name} {1e3 * cpu[name][-1].mean():.2f}" for name in rows)
            )
        # the full decode resized with an antialiasing filter: how far each output is from
        # the image itself, not from the aliasing of a bilinear resize of the full image
        clean = []
        for i in range(len(sizes)):
            image = datasets["eval full"].decode_stored(datasets["eval full"].read_bytes(i), i)
            h, w = image.shape[:2]
            f = 256 / min(h, w)
            size = (max(256, int(w * f)), max(256, int(h * f)))
            clean.append(CenterCrop(224)(cv2.resize(image, size, interpolation=cv2.INTER_AREA)))
        eval_psnr = [
            psnr(a, b) for a, b in zip(outputs["eval draft"], outputs["eval full"], strict=True)
        ]
        full_clean = [psnr(a, b) for a, b in zip(outputs["eval full"], clean, strict=True)]
        draft_clean = [psnr(a, b) for a, b in zip(outputs["eval draft"], clean, strict=True)]
        train_psnr = [
            psnr(a, b) for a, b in zip(outputs["train planned"], outputs["train full"], strict=True)
        ]
        scales = np.array([draft_scale(h, w, 256) for h, w in sizes])
        every = np.ones(len(sizes), dtype=bool)
        med_cpu = {n: 1e3 * statistics.median(float(c.mean()) for c in cpu[n]) for n in rows}
        med_wall = {n: statistics.median(wall[n]) for n in rows}
        short = sorted(min(s) for s in sizes)
        lines = [
            "# bench_photos: decoding less on large photos",
            "",
            f"{len(sizes)} JPEGs (quality 90) cut from the mate-backgrounds photos, sides "
            f"{SIDES[0]}-{SIDES[1]} px (shorter side {short[0]}-{short[-1]}, median "
            f"{short[len(short) // 2]}); LMDB, read through the dataset in one process, page "
            f"cache warm. CPU ms per image (decode + transform), median of {args.runs} runs; "
            "speed-up: the median of the runs' ratios (CPU time; wall time in brackets: the "
            "machine is shared).",
            "",
            "| transform | full decode | planned / draft | speed-up | PSNR vs full: min / "
            "median / below 30 dB |",
            "|---|---|---|---|---|",
            f"| eval: Resize(256) + CenterCrop(224), draft=256 | {med_cpu['eval full']:.2f} | "
            f"{med_cpu['eval draft']:.2f} | "
            f"{speedups(cpu['eval full'], cpu['eval draft'], every):.2f}x "
            f"({med_wall['eval full'] / med_wall['eval draft']:.2f}x) | "
            f"{psnr_text(eval_psnr)} |",
            f"| train: RandomResizedCrop(224) vs RandomResizedCropDraft(224) | "
            f"{med_cpu['train full']:.2f} | {med_cpu['train planned']:.2f} | "
            f"{speedups(cpu['train full'], cpu['train planned'], every):.2f}x "
            f"({med_wall['train full'] / med_wall['train planned']:.2f}x) | "
            f"{psnr_text(train_psnr)} |",
            "",
            "Eval speed-up by the scale draft=256 chose: "
            + ", ".join(
                f"1/{s}: {speedups(cpu['eval full'], cpu['eval draft'], scales == s):.2f}x "
                f"({int((scales == s).sum())} images)"
                for s in sorted(set(scales.tolist()))
            )
            + ".",
            "",
            "Eval PSNR against the full decode resized with INTER_AREA (no aliasing), min / "
            f"median: full decode + bilinear {min(full_clean):.1f} / "
            f"{statistics.median(full_clean):.1f}, draft=256 + bilinear {min(draft_clean):.1f}"
            f" / {statistics.median(draft_clean):.1f}.",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bench_photos.md").write_text(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
