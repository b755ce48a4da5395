"""Read a packed dataset and the same loose files through paddle.io.DataLoader; print samples/s."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import cv2
import numpy as np

warnings.filterwarnings("ignore", message="No ccache found")
import paddle

from readers import ChunkShuffleBatchSampler, LmdbDataset


class LooseFiles(paddle.io.Dataset):  # type: ignore[misc]
    """The baseline: one file open and decode per sample, the same OpenCV decode."""

    def __init__(self, root: Path) -> None:
        self.root = root
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [
            (str(p), i) for i, c in enumerate(classes) for p in sorted((root / c).iterdir())
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.items[i]
        image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB), label


def evict(root: Path) -> None:
    """Drop the page-cache pages of every file under `root` (cold reads without root)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def samples_per_second(
    dataset: paddle.io.Dataset,
    *,
    workers: int,
    epochs: int,
    cold: bool = False,
) -> float:
    """Median samples/s over `epochs` (after one warm-up epoch).

    Cold runs drop the files' pages before each epoch.
    """
    batches = None
    if isinstance(dataset, LmdbDataset):  # the packed dataset in its cache-friendly order
        batches = ChunkShuffleBatchSampler(dataset, batch_size=64, rank=0, world_size=1)
    loader = paddle.io.DataLoader(
        dataset,
        batch_sampler=batches,
        batch_size=1 if batches else 64,
        shuffle=batches is None,
        num_workers=workers,
        use_shared_memory=True,
        # not persistent: paddle's persistent workers sleep 0.5 s at every epoch start, a large
        # share of these short epochs; and pages a live worker maps cannot be evicted
        persistent_workers=False,
    )
    root = Path(dataset.root) if isinstance(dataset, LmdbDataset) else dataset.root
    rates = []
    for epoch in range(epochs + 1):
        if batches is not None:
            batches.set_epoch(epoch)
        if cold:
            evict(root)
        start = time.perf_counter()
        n = 0
        for images, _labels in loader:
            n += images.shape[0]
        if epoch > 0:  # the first pass starts the workers and warms the cache
            rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("packed", type=Path)
    parser.add_argument("loose", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    paddle.set_device("cpu")
    packed = LmdbDataset(args.packed)
    image, label = packed[0]
    print(
        f"LmdbDataset: {len(packed)} samples; sample 0: {image.shape} {image.dtype}, label {label}"
    )
    rates = {}
    for name, ds in (("LmdbDataset", packed), ("loose files", LooseFiles(args.loose))):
        warm = samples_per_second(ds, workers=args.workers, epochs=args.epochs)
        cold = samples_per_second(ds, workers=args.workers, epochs=args.epochs, cold=True)
        rates[name] = (warm, cold)
    print(
        f"DataLoader(batch_size=64, num_workers={args.workers}) on {os.cpu_count()} cores, "
        f"median of {args.epochs} epochs; LMDB in ChunkShuffleBatchSampler order, loose "
        "files shuffled; cold: the page cache dropped before each epoch"
    )
    print(f"  {'':14}{'warm':>10}{'cold':>10}  samples/s")
    for name, (warm, cold) in rates.items():
        print(f"  {name:14}{warm:10.0f}{cold:10.0f}")
    (lw, lc), (fw, fc) = rates["LmdbDataset"], rates["loose files"]
    print(f"  {'ratio':14}{lw / fw:9.2f}x{lc / fc:9.2f}x")


if __name__ == "__main__":
    main()
