"""Read orders on cold storage: sequential vs chunked (the sampler's defaults) vs fully random.

Writes a packed dataset of at least 2 GB (each format) with packer's own shard writers, then,
for each format and order, drops the shard files' pages from the page cache
(posix_fadvise DONTNEED) and reads the stored bytes of samples in that order for a fixed time,
in a fresh process: samples/s. Orders:
- sequential: ChunkShuffleSampler(shuffle=False) (ids ascending, with prefetch hints)
- chunked:    ChunkShuffleSampler with its defaults (chunk_size=64, window=8)
- random:     a uniform random permutation, no hints (what paddle's RandomSampler does)

Storage: this machine's disk as it is, and an emulated hard disk (a blkio cgroup v1 throttle
of 100 MB/s and 300 IOPS on the disk holding the data; needs root and the blkio controller,
skipped with a message otherwise). Targets: slow disk: chunked >= 10x random and
within 1.3x of sequential; fast disk: chunked >= 0.9x sequential.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CGROUP_ROOT = Path("/sys/fs/cgroup/blkio")


def write_dataset(out: Path, fmt: str, *, total_bytes: int, record_bytes: int) -> int:
    """A packed dataset of incompressible JPEG-sized records; returns the sample count."""
    from packer.formats import FORMATS
    from packer.records import Record
    from packer.writers import ShardPart, merge_parts
    from readers.formats.layout import META_NAME
    from readers.index import fingerprint

    rng = np.random.default_rng(0)
    side = int((record_bytes / 3) ** 0.5)
    pool = []
    for _ in range(64):
        image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        ok, buf = cv2.imencode(".png", image)
        assert ok
        pool.append(buf.tobytes())
    n = total_bytes // len(pool[0])
    per_shard = (512 << 20) // len(pool[0])
    out.mkdir(parents=True)
    numbers = []
    for number, first in enumerate(range(0, n, per_shard)):
        part = ShardPart(out, number, FORMATS[fmt].writer, first_id=first)
        for i in range(first, min(n, first + per_shard)):
            data = pool[i % len(pool)]
            part.add(Record(f"c/{i:08d}.png", i % 10, data, "png", side, side, 3, zlib.crc32(data)))
        part.finish([])
        numbers.append(number)
    merged = merge_parts(out, numbers)
    meta = {
        "format": fmt,
        "version": 1,
        "num_samples": n,
        "num_shards": len(merged.shards),
        "shards": merged.shards,
        "classes": None,
        "label_source": "synthetic",
        "label_kind": merged.label_kind,
        "index_fingerprint": fingerprint(out / "index.jsonl"),
    }
    (out / META_NAME).write_text(json.dumps(meta))
    return n


CHILD = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
from readers import ChunkShuffleSampler, open_dataset
path, order, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
ds = open_dataset(path, decode="bytes")
for root, _, files in os.walk(path):
    for name in files:
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
if order == "random":
    ids = iter(np.random.default_rng(1).permutation(len(ds)).tolist())
elif order.startswith("chunked:"):  # chunked:CHUNK_SIZE:WINDOW, for the sweep of defaults
    _, chunk, window = order.split(":")
    ids = iter(ChunkShuffleSampler(ds, chunk_size=int(chunk), window=int(window), seed=1,
                                   rank=0, world_size=1))
else:
    ids = iter(ChunkShuffleSampler(ds, shuffle=order == "chunked", seed=1, rank=0, world_size=1))
n = 0
nbytes = 0
start = time.perf_counter()
deadline = start + seconds
for i in ids:
    nbytes += len(ds.read_bytes(i))
    n += 1
    if n % 16 == 0 and time.perf_counter() > deadline:
        break
elapsed = time.perf_counter() - start
print(json.dumps({"samples_per_s": n / elapsed, "mb_per_s": nbytes / elapsed / 1e6, "n": n}))
"""


def disk_of(path: Path) -> str:
    """``MAJ:MIN`` of the whole disk holding `path` (blkio throttles whole disks)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if (sys_dev / "partition").exists():
        return (sys_dev.resolve().parent / "dev").read_text().strip()
    return f"{major}:{minor}"


def slow_cgroup(path: Path, *, bps: int, iops: int) -> Path | None:
    """A blkio cgroup throttling reads of the disk of `path`, or None (with the reason)."""
    if os.geteuid() != 0:
        print("slow-disk table skipped: the blkio throttle needs root", file=sys.stderr)
        return None
    if not (CGROUP_ROOT / "blkio.throttle.read_bps_device").exists():
        print(
            "slow-disk table skipped: no cgroup v1 blkio controller at /sys/fs/cgroup/blkio",
            file=sys.stderr,
        )
        return None
    group = CGROUP_ROOT / f"packer-bench-{os.getpid()}"
    group.mkdir()
    disk = disk_of(path)
    (group / "blkio.throttle.read_bps_device").write_text(f"{disk} {bps}\n")
    (group / "blkio.throttle.read_iops_device").write_text(f"{disk} {iops}\n")
    return group


def measure(path: Path, order: str, seconds: float, group: Path | None) -> dict[str, float]:
    prefix = ""
    if group is not None:
        prefix = f"echo $$ > {group}/cgroup.procs && exec "
    cmd = f"{prefix}{sys.executable} -c '{CHILD}' {path} {order} {seconds}"
    out = subprocess.run(
        ["bash", "-c", cmd],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def table(title: str, results: dict[tuple[str, str], float], targets: list[str]) -> str:
    lines = [
        f"### {title}",
        "",
        "| format | sequential | chunked | random | chunked / random | sequential / chunked |",
        "|---|---|---|---|---|---|",
    ]
    for fmt in ("lmdb", "recordio"):
        seq, chk, rnd = (results[(fmt, o)] for o in ("sequential", "chunked", "random"))
        lines.append(
            f"| {fmt} | {seq:,.0f} | {chk:,.0f} | {rnd:,.0f} | {chk / rnd:.1f}x | "
            f"{seq / chk:.2f}x |"
        )
    lines += ["", "samples/s (median of runs); " + "; ".join(targets)]
    return "\n".join(lines)


SWEEP = ((8, 8), (16, 8), (64, 8), (256, 8), (64, 1), (64, 32))


def sweep(path: Path, seconds: float, runs: int, storage: tuple[str, Path | None]) -> str:
    """Cold LMDB samples/s for several (chunk_size, window): the throughput side of the
    choice; the mixing side is the block size, window x chunk_size samples shuffled together."""
    name, group = storage
    lines = [
        f"### Chunk size and window, LMDB, cold, {name} disk",
        "",
        "| chunk_size | window | samples mixed per block | samples/s |",
        "|---|---|---|---|",
    ]
    for chunk, window in SWEEP:
        order = f"chunked:{chunk}:{window}"
        rate = statistics.median(
            measure(path, order, seconds, group)["samples_per_s"] for _ in range(runs)
        )
        print(f"sweep {order}: {rate:,.0f}/s", file=sys.stderr)
        lines.append(f"| {chunk} | {window} | {chunk * window:,} | {rate:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=2.0, help="dataset size per format")
    parser.add_argument("--record-kb", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0, help="read time per measure")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bps", type=int, default=100 << 20)
    parser.add_argument("--iops", type=int, default=300)
    benchlib.add_output_arguments(parser, "bench_orders")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also time LMDB over chunk sizes and windows (how the defaults were chosen)",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="packer-orders-", dir=os.environ.get("BENCH_TMP")))
    group = None
    try:
        paths = {}
        for fmt in ("lmdb", "recordio"):
            paths[fmt] = base / f"orders.{fmt}"
            n = write_dataset(
                paths[fmt], fmt, total_bytes=int(args.gb * 1e9), record_bytes=args.record_kb * 1000
            )
            print(f"wrote {fmt}: {n:,} samples", file=sys.stderr)
        os.sync()
        sections = []
        storages = [("fast", None)]
        group = slow_cgroup(base, bps=args.bps, iops=args.iops)
        if group is not None:
            storages.append(("slow", group))
        for storage, cg in storages:
            results = {}
            for fmt in ("lmdb", "recordio"):
                for order in ("sequential", "chunked", "random"):
                    runs = [
                        measure(paths[fmt], order, args.seconds, cg)["samples_per_s"]
                        for _ in range(args.runs)
                    ]
                    results[(fmt, order)] = statistics.median(runs)
                    print(
                        f"{storage} {fmt} {order}: {results[(fmt, order)]:,.0f}/s", file=sys.stderr
                    )
            if storage == "fast":
                sections.append(
                    table(
                        "Cold reads, this machine's disk",
                        results,
                        ["target: chunked >= 0.9x sequential"],
                    )
                )
            else:
                sections.append(
                    table(
                        f"Cold reads, emulated hard disk ({args.bps >> 20} MB/s, {args.iops} IOPS)",
                        results,
                        ["targets: chunked >= 10x random, sequential/chunked <= 1.3"],
                    )
                )
        if args.sweep:
            sections.append(sweep(paths["lmdb"], args.seconds, args.runs, storages[-1]))
        text = "\n\n".join(sections)
        print(text)
        benchlib.save_results(args, "bench_orders", text + "\n")
    finally:
        if group is not None:
            group.rmdir()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
