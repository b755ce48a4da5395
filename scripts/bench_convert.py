"""Convert speed: ``packer convert`` of a packed LMDB to RecordIO vs ``cp -r`` of the same bytes.

A ~35k-sample LMDB dataset of small generated JPEGs is written through `packer.repack` (no
build: the records are synthesised), then, interleaved in one process with the page cache in
the same state for both (each run after the other, warm), the median of 3 runs of
``packer convert IN OUT --format recordio`` (the console command, start-up included) and of
``cp -r`` of IN's shard directories. Target (issue 19): convert <= 1.5x cp.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.records import Record
from packer.repack import RepackConfig, RepackSource, repack


def synthesise(out: Path, count: int, size: int) -> int:
    """A packed LMDB of `count` JPEGs of about size x size pixels; return its stored bytes."""
    rng = np.random.default_rng(0)
    bases = []
    for _ in range(16):
        image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        image = cv2.GaussianBlur(image, (5, 5), 0)
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        bases.append(buf.tobytes())
    data = [bases[i % 16][:-2] + i.to_bytes(4, "little") + b"\xff\xd9" for i in range(count)]

    def read(start: int, stop: int) -> Iterator[Record]:
        for i in range(start, stop):
            d = data[i]
            yield Record(f"c{i % 10}/{i:06d}.jpg", i % 10, d, "jpeg", size, size, 3, zlib.crc32(d))

    source = RepackSource([len(d) for d in data], read, "bench", source="synthesised")
    repack(RepackConfig(out, format="lmdb", progress=False), source, log=lambda m: None)
    return sum(len(d) for d in data)


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    """Run the comparison and print the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=35_000)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tmp", type=Path, default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.tmp))
    try:
        src = tmp / "in.lmdb"
        payload = synthesise(src, args.count, args.size)
        shards = sorted(p for p in src.iterdir() if p.is_dir())
        packer = [sys.executable, "-c", "from packer.cli import main; main()"]
        convert_s, cp_s = [], []
        timed(["cp", "-r", *map(str, shards), str(tmp / "warm")])  # same page cache for both
        for run in range(args.runs):
            out, copy = tmp / f"out{run}.rec", tmp / f"copy{run}"
            copy.mkdir()
            cp_s.append(timed(["cp", "-r", *map(str, shards), str(copy)]))
            convert_s.append(
                timed(
                    [
                        *packer,
                        "convert",
                        str(src),
                        str(out),
                        "--format",
                        "recordio",
                        "--no-progress",
                    ]
                )
            )
            shutil.rmtree(out)
            shutil.rmtree(copy)
        c, p = statistics.median(convert_s), statistics.median(cp_s)
        print(
            f"{args.count} samples, {payload / 1e6:.0f} MB stored: packer convert lmdb->recordio "
            f"{c:.2f} s, cp -r {p:.2f} s (medians of {args.runs}): {c / p:.2f}x cp (target <= 1.5x)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
