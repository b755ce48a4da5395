"""Recipe: PaddleOCR-style training on a synthetic and a real dataset together, in width buckets,
under ``paddle.distributed.launch``; interrupted mid-epoch and resumed on another number of
processes (GPUs), with a check that the epoch saw every sample once.

Runs on the CPU build of paddle (gloo). The steps, from the repository root::

    python scripts/recipe_mix_buckets.py make-data /tmp/recipe            # two small datasets
    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/recipe/log \\
        scripts/recipe_mix_buckets.py train /tmp/recipe --stop-after 4    # 2 ranks, 4 steps
    python scripts/recipe_mix_buckets.py train /tmp/recipe --resume       # 1 process: the rest
    python scripts/recipe_mix_buckets.py check /tmp/recipe                # every sample once

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
    from readers import open_dataset

    parts = [open_dataset(root / "synth.lmdb"), open_dataset(root / "real.rec")]
    try:
        from readers.concat import ConcatDataset  # h7's readers.ConcatDataset, once merged
    except ImportError:
        return _Concat(parts)
    return ConcatDataset(parts)


class _Concat:
    """Stand-in for ``readers.ConcatDataset`` until it is merged: ``datasets``, ``offsets``,
    ``shard_bounds``, ``len`` and ``ds[i]``, which is all the samplers use."""

    def __init__(self, datasets: list[Any]) -> None:
        self.datasets = datasets
        self.offsets = np.concatenate([[0], np.cumsum([len(d) for d in datasets])]).astype(int)
        bounds = [d.shard_bounds + o for d, o in zip(datasets, self.offsets, strict=False)]
        self.shard_bounds = np.unique(np.concatenate(bounds))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Any:
        part = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.datasets[part][i - int(self.offsets[part])]


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

    from readers import BucketBatchSampler

    world, rank = dist.get_world_size(), dist.get_rank()
    if world > 1:
        dist.init_parallel_env()
    ds = open_mix(root)
    # Width buckets from the index (no decode): 4 quantile buckets of the mixed widths; narrow
    # buckets hold more lines so that batch x width stays about constant (multi-scale OCR).
    # Weights: once h7's weighted mixing is merged, the synthetic:real ratio is set here
    # (e.g. weights=[1, 3], epoch_samples=...) on the sampler that draws the epoch.
    sampler = BucketBatchSampler(ds, BATCH, key="width", buckets=4, scale_batch=True, seed=0)
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
    """The first run and the resumed one together saw every sample, none twice but padding."""
    ds = open_mix(root)
    counts: Counter[int] = Counter()
    for path in sorted((root / "seen").glob("*.json")):
        ids = json.loads(path.read_text())
        counts.update(ids)
        print(f"{path.name}: {len(ids)} samples")
    missing = sorted(set(range(len(ds))) - set(counts))
    twice = sorted(i for i, c in counts.items() if c > 1)
    print(f"{len(counts)} of {len(ds)} samples seen; missing {missing}; repeated {len(twice)}")
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
