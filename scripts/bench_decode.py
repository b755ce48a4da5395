"""Decoding less: PNG vs raw vs raw+lz4 vs raw+zstd pixels read back through paddle's DataLoader.

Packs the oxygen icons resized to 64x64 PNG (8,813 real images; demo shapes when Debian's
oxygen-icon-theme is not installed) into LMDB four ways: ``packer build`` as they are (PNG),
``--encode raw``, ``--encode raw --compress lz4`` and ``--encode raw --compress zstd``. The
page cache is warm (the data is read once first, and BENCH_TMP may put it on /dev/shm): what is
timed is the CPU's work per image, which is where a PNG's decode is the ceiling.

Rows, side by side in one run, each the median of ``--runs`` runs (rows alternate within a
run, so the shared machine's load hits each alike):
- one process: every sample's stored bytes read and decoded to RGB (``decode_stored``),
  microseconds per image: the decode bound of each form;
- one process, CPU time: what a DataLoader worker does per sample (``ds[i]`` for each sample
  of a batch of 64, then paddle's default collate), microseconds per sample, the least of the
  runs: load from other work changes it far less than the loader's images/s;
- ``paddle.io.DataLoader(ds, batch_size=64, num_workers=2)`` over the whole dataset, default
  collate, images/s from the first batch to the last (a fresh loader per run).
Target: raw+lz4 >= 2x the PNG build, and >= 0.9x uncompressed raw, through the
DataLoader. ``--out DIR`` writes DIR/bench_decode.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib

BATCH = 64
WORKERS = 2
BUILDS = {  # name -> (encode, compress)
    "PNG (--encode keep)": ("keep", "none"),
    "raw": ("raw", "none"),
    "raw + lz4": ("raw", "lz4"),
    "raw + zstd": ("raw", "zstd"),
}


def build_all(src: Path, tmp: Path) -> dict[str, Path]:
    """Each of `BUILDS` packed from `src` (LMDB): name -> OUT."""
    from packer.build import build
    from packer.config import BuildConfig, usable_cores
    from packer.transform import Transform

    out = {}
    for n, (name, (encode, compress)) in enumerate(BUILDS.items()):
        path = tmp / f"build{n}.lmdb"
        summary = build(
            BuildConfig(
                src=src,
                out=path,
                workers=usable_cores(),
                progress=False,
                transform=Transform(encode=encode, compress=compress),
            ),
            log=lambda _m: None,
        )
        benchlib.eprint(f"{name}: {summary.line()}")
        out[name] = path
    return out


def decode_us(path: Path) -> float:
    """Microseconds per image to read and decode every sample in this process."""
    from readers import open_dataset

    ds = open_dataset(path, decode="bytes")
    stored = [ds[i][0] for i in range(len(ds))]
    start = time.perf_counter()
    for i, data in enumerate(stored):
        ds.decode_stored(data, i, "rgb")
    return (time.perf_counter() - start) / len(stored) * 1e6


def worker_us(path: Path) -> float:
    """CPU microseconds per sample of a DataLoader worker's work, in this process.

    Each batch of 64 read as a worker reads it (``ds[i]``: the stored bytes read, decompressed
    and decoded) and put together by paddle's default collate; process CPU time, which other
    work on the machine changes far less than it changes a loader's images/s.
    """
    from paddle.io.dataloader.collate import default_collate_fn

    from readers import open_dataset

    ds = open_dataset(path)
    n = len(ds)
    start = time.process_time()
    for lo in range(0, n, BATCH):
        default_collate_fn([ds[i] for i in range(lo, min(n, lo + BATCH))])
    return (time.process_time() - start) / n * 1e6


def loader_rate(path: Path) -> float:
    """Images/s through a fresh DataLoader(batch_size=64, num_workers=2), first batch to last."""
    import paddle

    from readers import open_dataset

    ds = open_dataset(path)
    loader = paddle.io.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=WORKERS)
    count, start = 0, 0.0
    for n, (images, _labels) in enumerate(loader):
        if n == 0:
            start = time.perf_counter()  # the workers are up and running
        else:
            count += int(images.shape[0])
    return count / (time.perf_counter() - start)


def stored_mb(path: Path) -> float:
    from readers.index import load_index

    return float(load_index(path).nbytes.sum()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit", type=int, default=None, help="icons to use (default: all)")
    benchlib.add_output_arguments(parser, "bench_decode")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    base = Path(tempfile.mkdtemp(prefix="packer-decode-", dir=os.environ.get("BENCH_TMP")))
    try:
        _count, what = benchlib.icon_tree(base / "src", size=64, limit=args.limit)
        outs = build_all(base / "src", base)
        sizes = {name: stored_mb(path) for name, path in outs.items()}
        for path in outs.values():  # warm: every page read once
            for f in path.rglob("*.mdb"):
                f.read_bytes()
        us: dict[str, list[float]] = {name: [] for name in outs}
        cpu: dict[str, list[float]] = {name: [] for name in outs}
        rates: dict[str, list[float]] = {name: [] for name in outs}
        for run in range(args.runs):
            for name, path in outs.items():
                us[name].append(decode_us(path))
                cpu[name].append(worker_us(path))
                rates[name].append(loader_rate(path))
            benchlib.eprint(f"run {run + 1}/{args.runs} done")
        med_us = {k: statistics.median(v) for k, v in us.items()}
        least_cpu = {k: min(v) for k, v in cpu.items()}  # the least: load inflates it least
        med = {k: statistics.median(v) for k, v in rates.items()}
        png, raw = med["PNG (--encode keep)"], med["raw"]
        lines = [
            f"### Decoding less: {what}, LMDB, warm cache, median of {args.runs} runs, "
            f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f} at the end",
            "",
            f"| stored as | MB stored | decode, one process (us/image) | worker CPU, one "
            f"process (us/sample) | DataLoader bs={BATCH} workers={WORKERS} (images/s) "
            "| vs PNG | vs raw |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in outs:
            lines.append(
                f"| {name} | {sizes[name]:.1f} | {med_us[name]:.1f} | {least_cpu[name]:.1f} "
                f"| {med[name]:,.0f} | {med[name] / png:.2f}x | {med[name] / raw:.2f}x |"
            )
        lz4 = med["raw + lz4"]
        cpu_raw, cpu_lz4 = least_cpu["raw"], least_cpu["raw + lz4"]
        lines += [
            "",
            f"- raw + lz4 vs PNG through the DataLoader: {lz4 / png:.2f}x (target >= 2x)",
            f"- raw + lz4 vs raw through the DataLoader: {lz4 / raw:.2f}x (target >= 0.9x)",
            f"- worker CPU per sample (read, decompress, decode, collate; the least of "
            f"{args.runs} runs in one process): raw {cpu_raw:.1f} us, raw + lz4 {cpu_lz4:.1f} "
            f"us (+{cpu_lz4 - cpu_raw:.1f} us); PNG {least_cpu['PNG (--encode keep)']:.1f} us",
        ]
        text = "\n".join(lines)
        print(text)
        benchlib.save_results(args, "bench_decode", text + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
