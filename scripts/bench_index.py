"""Scale benchmark: open a 10,000,000-sample dataset, bytes per sample, memory per worker.

Writes a synthetic dataset directory (meta.json, index.jsonl, index.parquet and one small real
LMDB shard that every id maps onto modulo its size), then measures in fresh processes:
- the time `LmdbDataset(path)` takes to open (index from index.parquet),
- the resident bytes per sample the open dataset adds to the main process (pyarrow's
  libraries are loaded before the first reading: they are a fixed cost, not a per-sample one),
- the unique (private, not shared) memory each of 4 paddle.io.DataLoader workers adds after
  reading samples spread over the whole id range.
Targets: open < 3 s, < 64 bytes per sample, < 50 MB per worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_synthetic(root: Path, n: int) -> None:
    """A dataset of `n` samples whose index is real and whose image bytes are shared."""
    from packer.writers.lmdb import open_lmdb_for_writing
    from readers.formats.lmdb import NUM_SAMPLES_KEY, image_key, label_key
    from readers.index import fingerprint

    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 1000, n)
    crc = rng.integers(0, 2**32, n, dtype=np.uint64)
    nbytes = rng.integers(2000, 60000, n)
    with open(root / "index.jsonl", "w") as f:
        step = 200_000
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            f.write(
                "".join(
                    f'{{"id":{i},"path":"c{labels[i]}/img_{i:08d}.jpg","label":{labels[i]},'
                    f'"shard":0,"key":"image-{i + 1:09d}","nbytes":{nbytes[i]},"width":64,'
                    f'"height":64,"channels":3,"format":"jpeg","crc32":{crc[i]}}}\n'
                    for i in range(lo, hi)
                )
            )
    ids = np.arange(n, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "path": pa.array([f"c{labels[i]}/img_{i:08d}.jpg" for i in range(n)]),
            "label_json": pa.array(labels.astype(str)),
            "label_int": labels.astype(np.int64),
            "shard": np.zeros(n, np.int32),
            "key": pa.array([f"image-{i + 1:09d}" for i in range(n)]),
            "offset": pa.nulls(n, pa.int64()),
            "nbytes": nbytes.astype(np.int64),
            "width": np.full(n, 64, np.int32),
            "height": np.full(n, 64, np.int32),
            "channels": np.full(n, 3, np.int32),
            "format": pa.array(["jpeg"] * n),
            "crc32": crc.astype(np.uint32),
        }
    )
    pq.write_table(table, root / "index.parquet", row_group_size=1 << 20)
    del table
    # one real shard holding `n` keys would take minutes to write; the reads in the
    # benchmark use only the index, so the shard holds a few records.
    env = open_lmdb_for_writing(str(root / "shard-00000"), 1 << 24)
    with env.begin(write=True) as txn:
        for local in range(1, 101):
            txn.put(image_key(local), b"x" * 100)
            txn.put(label_key(local), b"0")
        txn.put(NUM_SAMPLES_KEY, str(n).encode())
    env.close()
    meta = {
        "format": "lmdb",
        "version": 1,
        "num_samples": n,
        "num_shards": 1,
        "shards": [{"name": "shard-00000", "first": 0, "count": n, "bytes": int(nbytes.sum())}],
        "classes": None,
        "label_source": "synthetic",
        "label_kind": "int",
        "index_fingerprint": fingerprint(root / "index.jsonl"),
    }
    (root / "meta.json").write_text(json.dumps(meta))


CHILD = r"""
import gc, json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
import paddle
import pyarrow.parquet  # loaded before measuring: a fixed cost, not a per-sample one
from readers import LmdbDataset

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def uss(pid):
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total

class Touch(paddle.io.Dataset):
    # reads the index entries of sample i the way __getitem__ does, and reports its memory
    def __init__(self, ds):
        self.ds = ds
    def __len__(self):
        return len(self.ds)
    def __getitem__(self, i):
        index = self.ds.index
        shard = index.shard_of(i)
        return np.array([index.labels[i], int(index.crc32[i]), int(index.nbytes[i]), shard,
                         os.getpid(), uss(os.getpid())], np.int64)

gc.collect()
before = rss()
t = time.perf_counter()
ds = LmdbDataset(sys.argv[1])
opened = time.perf_counter() - t
gc.collect()
after = rss()
n = len(ds)
sampler = paddle.io.BatchSampler(
    sampler=list(np.linspace(0, n - 1, 4 * 64 * 20).astype(np.int64).tolist()), batch_size=64)
loader = paddle.io.DataLoader(Touch(ds), batch_sampler=sampler, num_workers=4,
                              use_shared_memory=True)
last = {}
for batch in loader:
    for row in batch.numpy():
        last[int(row[4])] = int(row[5])
print(json.dumps({"open_s": opened, "bytes_per_sample": (after - before) / n,
                  "worker_uss_mb": sorted(v / 2**20 for v in last.values())}))
"""


def measure(root: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    benchlib.add_output_arguments(parser, "bench_index")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp) / "synthetic.lmdb"
        t = time.perf_counter()
        write_synthetic(root, args.samples)
        print(
            f"wrote a {args.samples:,}-sample index in {time.perf_counter() - t:.0f} s",
            file=sys.stderr,
        )
        runs = [measure(root) for _ in range(args.runs)]
    open_s = statistics.median(r["open_s"] for r in runs)  # type: ignore[misc]
    per_sample = statistics.median(r["bytes_per_sample"] for r in runs)  # type: ignore[misc]
    worker = statistics.median(max(r["worker_uss_mb"]) for r in runs)  # type: ignore[misc]
    rows = [
        ("open the dataset", f"{open_s:.2f} s", "< 3 s", open_s < 3),
        ("resident bytes per sample", f"{per_sample:.1f} B", "< 64 B", per_sample < 64),
        ("unique memory per worker (max of 4)", f"{worker:.1f} MB", "< 50 MB", worker < 50),
    ]
    lines = [
        f"### Index at scale: {args.samples:,} samples (median of {args.runs} runs)",
        "",
        "| measure | result | target | met |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {'yes' if d else 'NO'} |" for a, b, c, d in rows],
    ]
    text = "\n".join(lines)
    print(text)
    benchlib.save_results(args, "bench_index", text + "\n")


if __name__ == "__main__":
    main()
