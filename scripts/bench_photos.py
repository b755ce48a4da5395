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
full-decode output of the same image (and the same box), and every output with an
antialiased reference (the full decode resized with INTER_AREA). A last table times each step
of the eval paths, and a decode at 1/8: the entropy decoding no DCT scale avoids. ``--out
DIR`` writes DIR/bench_photos.md; BENCH_TMP names the parent of the temporary data.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

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
    """min / median / mean / how many under 30 dB."""
    v = np.asarray(values)
    return (
        f"{v.min():.1f} / {np.median(v):.1f} / {v.mean():.1f} / {int((v < 30).sum())} of {v.size}"
    )


def eval_size(h: int, w: int, short: int = 256) -> tuple[int, int]:
    """``(width, height)`` paddle's ``Resize(short)`` resizes an `h` x `w` image to."""
    if w < h:
        return short, int(short * h / w)
    return int(short * w / h), short


def antialiased(ds: Any, run: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The references with an antialiasing filter (INTER_AREA) from the full decode.

    Eval: ``Resize(256)`` + ``CenterCrop(224)``; train: the box sample i drew in `run` (the
    same random state as `read_all`), resized to 224. They say how far each output is from
    the image itself, not from the aliasing of a bilinear resize of the full image.
    """
    import cv2
    from paddle.vision.transforms import CenterCrop

    from readers.transforms import RandomResizedCropDraft

    crop = RandomResizedCropDraft(224, interpolation="area")
    evals, trains = [], []
    for i in range(n):
        image = ds.decode_stored(ds.read_bytes(i), i)
        h, w = image.shape[:2]
        evals.append(
            CenterCrop(224)(cv2.resize(image, eval_size(h, w), interpolation=cv2.INTER_AREA))
        )
        np.random.seed(run * 100_003 + i)  # noqa: NPY002 - as read_all seeds sample i
        random.seed(run * 100_003 + i)
        trains.append(crop(image))
    return evals, trains


STAGES = ("read", "decode full (BGR)", "BGR -> RGB", "decode at draft=256's scale (RGB)")
STAGES += ("decode at 1/8", "eval transform, full", "eval transform, drafted")


def stage_times(ds: Any, scales: np.ndarray, runs: int) -> dict[str, float]:
    """CPU ms per image of each step of the eval paths (and of a decode at 1/8 for every
    image: entropy decoding, which no DCT scale shrinks), median over `runs` of the mean."""
    import cv2
    from paddle.vision.transforms import CenterCrop, Compose, Resize

    from readers.decode import decode_image

    eval_t = Compose([Resize(256), CenterCrop(224)])
    means: dict[str, list[float]] = {name: [] for name in STAGES}
    for _ in range(runs):
        spent = dict.fromkeys(STAGES, 0.0)
        for i, scale in enumerate(scales.tolist()):
            clock = [time.process_time()]
            data = np.frombuffer(ds.read_bytes(i), dtype=np.uint8)
            clock.append(time.process_time())
            bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
            clock.append(time.process_time())
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            clock.append(time.process_time())
            small = decode_image(data, "rgb", scale=scale)
            clock.append(time.process_time())
            decode_image(data, "rgb", scale=8)
            clock.append(time.process_time())
            eval_t(rgb)
            clock.append(time.process_time())
            eval_t(small)
            clock.append(time.process_time())
            for name, a, b in zip(STAGES, clock[:-1], clock[1:], strict=True):
                spent[name] += b - a
        for name in STAGES:
            means[name].append(1e3 * spent[name] / len(scales))
    return {name: statistics.median(v) for name, v in means.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=4, help="boxes cut from each photo")
    parser.add_argument("--runs", type=int, default=7)
    benchlib.add_output_arguments(parser, "bench_photos")
    args = parser.parse_args()

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
        last = args.runs - 1  # outputs holds the last run's
        clean_eval, clean_train = antialiased(datasets["eval full"], last, len(sizes))
        scales = np.array([draft_scale(h, w, 256) for h, w in sizes])
        stages = stage_times(datasets["eval full"], scales, args.runs)

        def vs(row: str, reference: list[np.ndarray]) -> str:
            return psnr_text([psnr(a, b) for a, b in zip(outputs[row], reference, strict=True)])

        every = np.ones(len(sizes), dtype=bool)
        med_cpu = {n: 1e3 * statistics.median(float(c.mean()) for c in cpu[n]) for n in rows}
        med_wall = {n: statistics.median(wall[n]) for n in rows}
        short = sorted(min(s) for s in sizes)
        floor = stages["decode full (BGR)"] / stages["decode at 1/8"]
        lines = [
            "# bench_photos: decoding less on large photos",
            "",
            f"{len(sizes)} JPEGs (quality 90) cut from the mate-backgrounds photos, sides "
            f"{SIDES[0]}-{SIDES[1]} px (shorter side {short[0]}-{short[-1]}, median "
            f"{short[len(short) // 2]}); LMDB, read through the dataset in one process, page "
            f"cache warm. CPU ms per image (decode + transform), median of {args.runs} runs; "
            "speed-up: the median of the runs' ratios (CPU time; wall time in brackets: the "
            "machine is shared). PSNR: min / median / mean / images under 30 dB.",
            "",
            "| transform | full decode | planned / draft | speed-up | PSNR vs the full-decode "
            "output |",
            "|---|---|---|---|---|",
            f"| eval: Resize(256) + CenterCrop(224), draft=256 | {med_cpu['eval full']:.2f} | "
            f"{med_cpu['eval draft']:.2f} | "
            f"{speedups(cpu['eval full'], cpu['eval draft'], every):.2f}x "
            f"({med_wall['eval full'] / med_wall['eval draft']:.2f}x) | "
            f"{vs('eval draft', outputs['eval full'])} |",
            f"| train: RandomResizedCrop(224) vs RandomResizedCropDraft(224) | "
            f"{med_cpu['train full']:.2f} | {med_cpu['train planned']:.2f} | "
            f"{speedups(cpu['train full'], cpu['train planned'], every):.2f}x "
            f"({med_wall['train full'] / med_wall['train planned']:.2f}x) | "
            f"{vs('train planned', outputs['train full'])} |",
            "",
            "Eval speed-up by the scale draft=256 chose: "
            + ", ".join(
                f"1/{s}: {speedups(cpu['eval full'], cpu['eval draft'], scales == s):.2f}x "
                f"({int((scales == s).sum())} images)"
                for s in sorted(set(scales.tolist()))
            )
            + ".",
            "",
            "PSNR against an antialiased reference (the full decode resized with INTER_AREA; "
            "the bilinear resize of the full decode is itself aliased):",
            "",
            "| output | PSNR vs INTER_AREA reference |",
            "|---|---|",
            f"| eval, full decode + bilinear | {vs('eval full', clean_eval)} |",
            f"| eval, draft=256 + bilinear | {vs('eval draft', clean_eval)} |",
            f"| train, full decode + bilinear | {vs('train full', clean_train)} |",
            f"| train, planned + bilinear | {vs('train planned', clean_train)} |",
            "",
            f"Where the eval time goes (CPU ms per image, median of {args.runs} runs, outside "
            "the dataset):",
            "",
            "| step | ms |",
            "|---|---|",
            *(f"| {name} | {ms:.2f} |" for name, ms in stages.items()),
            "",
            f"A decode at 1/8 is {floor:.2f}x cheaper than a full one: entropy decoding, "
            "which is the same at every DCT scale, bounds what any reduction can save.",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        benchlib.save_results(args, "bench_photos", text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
