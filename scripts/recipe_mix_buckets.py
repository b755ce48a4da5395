"""Recipe: PaddleOCR-style training on a synthetic and a real dataset mixed by ratio, in width
buckets, under ``paddle.distributed.launch``; interrupted mid-epoch and resumed on another
number of processes (GPUs), with a check that the epoch saw every drawn sample once.

Each epoch reads half of the synthetic set and all of the real one (PaddleOCR's
``ratio_list: [0.5, 1.0]``): the sampler draws exactly 150 + 120 samples, the next epoch the
other half of the synthetic set, and buckets them by the index's widths.

Runs on the CPU build of paddle (gloo). The steps, from the repository root::

    python scripts/recipe_mix_buckets.py make-data /tmp/recipe            # two small datasets
    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/recipe/log \\
        scripts/recipe_mix_buckets.py train /tmp/recipe --stop-after 4    # 2 ranks, 4 steps
    python scripts/recipe_mix_buckets.py train /tmp/recipe --resume       # 1 process: the rest
    python scripts/recipe_mix_buckets.py check /tmp/recipe                # every draw once

On GPUs the same ``train`` command runs under ``--gpus 0,1,...`` (or ``--devices``); resume
with any other count, for example ``--nproc_per_node 3`` for the second command.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEIGHT = 32
BATCH = 8  # samples per batch in the widest bucket (scale_batch: narrower buckets hold more)
RATIO_LIST = (0.5, 1.0)  # PaddleOCR's ratio_list: the part of each dataset read per epoch


# ------------------------------------------------------------------ data


def make_lines(src: Path, count: int, *, seed: int, widths: tuple[int, int]) -> None:
    """`count` text-line-like images (dark strokes on a light background) of varied widths,
    and a PaddleOCR list file ``labels.txt`` (``path<TAB>text``)."""
    import cv2

    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    src.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        text = "".join(rng.choice(alphabet, int(rng.integers(2, 16))))
        width = int(np.clip(len(text) * rng.integers(10, 20), *widths))
        image = np.full((HEIGHT, width, 3), 230, dtype=np.uint8)
        cv2.putText(image, text, (2, HEIGHT - 9), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (20, 20, 20))
        name = f"img_{i:05d}.jpg"
        ok, buf = cv2.imencode(".jpg", image)
        assert ok
        (src / name).write_bytes(buf.tobytes())
        lines.append(f"{name}\t{text}\n")
    (src / "labels.txt").write_text("".join(lines))


def make_data(root: Path) -> None:
    """A synthetic set (LMDB, many short and long lines) and a "real" one (RecordIO)."""
    from packer.build import build
    from packer.config import BuildConfig

    for name, fmt, count, seed, widths in (
        ("synth", "lmdb", 300, 1, (24, 320)),
        ("real", "recordio", 120, 2, (60, 200)),
    ):
        src = root / "src" / name
        make_lines(src, count, seed=seed, widths=widths)
        out = root / f"{name}.{'lmdb' if fmt == 'lmdb' else 'rec'}"
        build(BuildConfig(src=src, out=out, format=fmt, labels=str(src / "labels.txt")))
        print(f"{out}: {count} samples")


def open_mix(root: Path) -> Any:
    """The two datasets as one: ids 0..299 synthetic, 300..419 real."""
    from readers import ConcatDataset, open_dataset

    return ConcatDataset([open_dataset(root / "synth.lmdb"), open_dataset(root / "real.rec")])


def make_sampler(ds: Any) -> Any:
    """Width buckets over each epoch's draws: ``RATIO_LIST[i]`` of source ``i``, exactly."""
    from readers import BucketBatchSampler

    # PaddleOCR's ratio_list as weights: source i gives ratio_i * len_i samples per epoch.
    sizes = np.diff(ds.offsets)
    weights = [r * int(n) for r, n in zip(RATIO_LIST, sizes, strict=True)]
    # 4 quantile buckets of the widths in the index (no decode); narrow buckets hold more
    # lines so that batch x width stays about constant (multi-scale OCR).
    return BucketBatchSampler(
        ds,
        BATCH,
        key="width",
        buckets=4,
        scale_batch=True,
        seed=0,
        weights=weights,
        epoch_samples=round(sum(weights)),
    )


class WithIds:
    """Items ``(image, label, id)``: the recipe records which samples each rank trained on."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[np.ndarray, str, int]:
        image, label = self.dataset[i]
        return image, str(label), int(i)


def pad_batch(
    items: list[tuple[np.ndarray, str, int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images padded to the batch's widest (all of one width bucket, so little padding)."""
    width = max(im.shape[1] for im, _, _ in items)
    images = np.zeros((len(items), 3, HEIGHT, width), dtype=np.float32)
    for j, (im, _, _) in enumerate(items):
        images[j, :, :, : im.shape[1]] = im[:HEIGHT].transpose(2, 0, 1) / 255.0
    targets = np.array([len(text) % 16 for _, text, _ in items], dtype=np.int64)
    ids = np.array([i for _, _, i in items], dtype=np.int64)
    return images, targets, ids


# ------------------------------------------------------------------ training


def train(root: Path, *, stop_after: int | None, resume: bool, epoch: int) -> None:
    import paddle
    import paddle.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    if world > 1:
        dist.init_parallel_env()
    ds = open_mix(root)
    sampler = make_sampler(ds)
    ckpt = root / "ckpt.json"
    model = paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 8, 3, padding=1),
        paddle.nn.ReLU(),
        paddle.nn.AdaptiveAvgPool2D(1),
        paddle.nn.Flatten(),
        paddle.nn.Linear(8, 16),
    )
    start = 0
    if resume:
        saved = json.loads(ckpt.read_text())
        sampler.load_state_dict(saved["sampler"])  # saved with any number of ranks
        model.set_state_dict(paddle.load(str(root / "model.pdparams")))
        epoch, start = saved["sampler"]["epoch"], sampler.start_batch
    else:
        sampler.set_epoch(epoch)
    net = paddle.DataParallel(model) if world > 1 else model
    opt = paddle.optimizer.Adam(parameters=model.parameters(), learning_rate=1e-3)
    loader = paddle.io.DataLoader(
        WithIds(ds), batch_sampler=sampler, num_workers=2, collate_fn=pad_batch
    )
    seen: list[int] = []
    step = start
    for images, targets, ids in loader:
        loss = paddle.nn.functional.cross_entropy(net(images), targets)
        loss.backward()
        opt.step()
        opt.clear_grad()
        seen += ids.numpy().tolist()
        step += 1
        if stop_after is not None and step == stop_after:
            break
    phase = "resumed" if resume else "first"
    out = root / "seen"
    out.mkdir(exist_ok=True)
    (out / f"{phase}-rank{rank}.json").write_text(json.dumps(seen))
    if rank == 0:
        # every rank consumed `step` batches of its share: one state resumes them all
        state = {"sampler": sampler.state_dict(consumed_batches=step)}
        ckpt.write_text(json.dumps(state, indent=1))
        paddle.save(model.state_dict(), str(root / "model.pdparams"))
    print(
        f"rank {rank}/{world}: epoch {epoch}, batches {start}..{step} of {len(sampler)}, "
        f"{len(seen)} samples, buckets {sampler.boundaries} x {sampler.batch_sizes}",
        flush=True,
    )


def check(root: Path) -> None:
    """The first run and the resumed one together saw every sample the epoch drew, none twice
    but padding (a rank's share repeats batches from the start when they do not divide)."""
    ds = open_mix(root)
    sampler = make_sampler(ds)
    sampler.set_epoch(json.loads((root / "ckpt.json").read_text())["sampler"]["epoch"])
    drawn = Counter(sampler.epoch_batches()[0].tolist())  # the epoch, for all ranks together
    seen: Counter[int] = Counter()
    for path in sorted((root / "seen").glob("*.json")):
        ids = json.loads(path.read_text())
        seen.update(ids)
        print(f"{path.name}: {len(ids)} samples")
    missing = sorted((drawn - seen).elements())
    extra = (seen - drawn).total()
    synth = sum(c for i, c in drawn.items() if i < int(ds.offsets[1]))
    print(
        f"{(drawn & seen).total()} of {drawn.total()} drawn samples seen ({synth} synthetic, "
        f"{drawn.total() - synth} real); missing {missing}; repeated {extra} (padding)"
    )
    if missing:
        raise SystemExit("the resumed epoch missed samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make-data").add_argument("root", type=Path)
    t = sub.add_parser("train")
    t.add_argument("root", type=Path)
    t.add_argument("--stop-after", type=int, default=None, help="interrupt after N batches")
    t.add_argument("--resume", action="store_true", help="continue from ROOT/ckpt.json")
    t.add_argument("--epoch", type=int, default=0)
    sub.add_parser("check").add_argument("root", type=Path)
    args = parser.parse_args()
    if args.command == "make-data":
        make_data(args.root)
    elif args.command == "train":
        train(args.root, stop_after=args.stop_after, resume=args.resume, epoch=args.epoch)
    else:
        check(args.root)


if __name__ == "__main__":
    main()
