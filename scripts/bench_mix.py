"""Read speed of a weighted 2-dataset mixture vs one dataset, through the chunked sampler, cold.

Packs the oxygen icons resized to 64x64 PNG (demo shapes when Debian's oxygen-icon-theme is not
installed; ``--images`` of them) three times: all of them as one LMDB, and its two halves as an
LMDB and a RecordIO dataset. Then times, side by side in one run (rows alternate, fresh
workers, the data's pages evicted before each row), ``paddle.io.DataLoader(ds,
batch_sampler=ChunkShuffleBatchSampler(...), num_workers=2)`` for:

- ``single``: the whole LMDB, plain chunked sampler (each sample once);
- ``mixture 1:3``: ``ConcatDataset([lmdb half, recordio half])`` with ``weights=[1, 3]`` and
  ``epoch_samples`` = all images (so half B is read 1.5 times and half A 0.5 times an epoch);
- ``mixture 1:3, mix=batch``: the same with every batch holding 16 + 48 samples.

Storage: an emulated hard disk (blkio cgroup v1 throttle of 100 MiB/s and 300 IOPS on the data's
disk; root), else this machine's disk, cold. Each figure is the median of ``--runs`` runs; the
ratio is the median of the per-run ratios (the shared machine's load drifts). Target:
the mixture >= 0.8x the single dataset's samples/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_read
import benchlib
import pagecache

BATCH = 64
ROWS = ("single", "mixture 1:3", "mixture 1:3, mix=batch")


class Child(bench_read.Child):
    """Times the rows in a fresh process that joins the throttle after its imports."""

    def dataset(self, fmt: str, **options: Any) -> Any:
        from readers import ConcatDataset, open_dataset

        if fmt == "single":
            return open_dataset(self.spec["single"])
        return ConcatDataset([open_dataset(p) for p in self.spec["halves"]])

    def mixed_loader(self, row: str) -> Any:
        from readers import ChunkShuffleBatchSampler

        ds = self.dataset("single" if row == "single" else "halves")
        mix: dict[str, Any] = {}
        if row != "single":
            mix = {"weights": [1, 3], "epoch_samples": len(ds)}
            if row.endswith("mix=batch"):
                mix["mix"] = "batch"
        sampler = ChunkShuffleBatchSampler(ds, batch_size=BATCH, rank=0, world_size=1, **mix)
        sampler.set_epoch(int(self.rng.integers(1, 1000)))
        return self.paddle.io.DataLoader(
            ds, batch_sampler=sampler, num_workers=self.spec["workers"]
        )

    def run(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from readers.io import handles

        results: dict[str, list[dict[str, Any]]] = {r: [] for r in ROWS}
        pinned = pagecache.Pinned(pagecache.mapped_files(exclude=self.data_files))
        self.throttle.join()
        for run in range(self.spec["runs"]):
            for row in ROWS:
                handles.close_all()
                result: dict[str, Any] = {"cached": pagecache.make_cold(self.data_files)}
                result["samples_per_s"] = self.epoch(self.mixed_loader(row), result)
                results[row].append(result)
                benchlib.eprint(
                    f"  run {run + 1}: {row:24} {result['samples_per_s']:8,.0f} samples/s, "
                    f"{result['bytes'] / max(1, result['requests']) / 1024:,.0f} KB/request"
                )
        pinned.close()
        return [{"name": r, "runs": rs} for r, rs in results.items()]


def table(rows: list[dict[str, Any]], storage: str) -> str:
    med = benchlib.median
    base = next(r for r in rows if r["name"] == "single")["runs"]
    lines = [
        f"#### {storage}",
        "",
        "| dataset | samples/s | vs single (paired per run) | mean request | runs |",
        "|---|---:|---:|---:|---|",
    ]
    ratios = {}
    for row in rows:
        rates = [r["samples_per_s"] for r in row["runs"]]
        vs = med(
            [
                a["samples_per_s"] / b["samples_per_s"]
                for a, b in zip(row["runs"], base, strict=True)
            ]
        )
        ratios[row["name"]] = vs
        kb = med([r["bytes"] / max(1, r["requests"]) / 1024 for r in row["runs"]])
        shown = ", ".join(f"{x:,.0f}" for x in rates)
        lines.append(
            f"| {row['name']} | {med(rates):,.0f} | {benchlib.ratio(vs)} | {kb:.0f} KB | {shown} |"
        )
    cached = max(r["cached"] for row in rows for r in row["runs"])
    lines += ["", f"Data still cached when a row started: at most {cached:.2%} of its bytes.", ""]
    lines += ["| target | result | met |", "|---|---:|---|"]
    for name in ROWS[1:]:
        value = ratios[name]
        met = "yes" if value >= 0.8 else "NO"
        lines.append(f"| {storage}: {name} >= 0.8x single | {value:.2f}x | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=4000, help="at most this many icons")
    parser.add_argument("--no-slow-disk", action="store_true")
    benchlib.add_output_arguments(parser, "bench_mix")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_spec = json.loads(args.child[0].read_text())
        args.child[1].write_text(json.dumps(Child(child_spec).run()))
        return
    started = time.perf_counter()
    from packer.build import build
    from packer.config import BuildConfig, usable_cores

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        _, what = benchlib.icon_tree(tmp / "src", limit=args.images)
        files = sorted(p for p in (tmp / "src").rglob("*.png"))
        halves = [tmp / "half-a", tmp / "half-b"]
        for k, half in enumerate(halves):  # every other image, so both halves span all classes
            for p in files[k::2]:
                dst = half / p.relative_to(tmp / "src")
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(p, dst)
        outs = {
            "single": (tmp / "src", "lmdb"),
            "a": (halves[0], "lmdb"),
            "b": (halves[1], "recordio"),
        }
        for key, (src, fmt) in outs.items():
            out = tmp / f"{key}.{fmt}"
            build(
                BuildConfig(src=src, out=out, format=fmt, workers=usable_cores(), progress=False),
                log=lambda _m: None,
            )
        os.sync()
        disk = benchlib.whole_disk(tmp)
        if disk is None:
            sys.exit(f"{tmp} is not on a block device; set BENCH_TMP to a directory on a disk")
        packed = [tmp / "single.lmdb", tmp / "a.lmdb", tmp / "b.recordio"]
        spec: dict[str, Any] = {
            "src": str(tmp / "src"),
            "single": str(packed[0]),
            "halves": [str(p) for p in packed[1:]],
            "packed_files": [f for p in packed for f in benchlib.files_under(p)],
            "workers": args.workers,
            "runs": args.runs,
            "disk": disk[0],
        }
        throttle = None if args.no_slow_disk else benchlib.Throttle(tmp)
        slow = throttle is not None and throttle.group is not None
        storage = bench_read.SLOW if slow else bench_read.FAST
        try:
            cgroup = str(throttle.group) if slow and throttle is not None else ""
            rows = benchlib.run_child(Path(__file__), spec | {"cgroup": cgroup}, tmp)
        finally:
            if throttle is not None:
                throttle.remove()
    text = (
        f"### Mixture read speed: {what}, batch {BATCH}, num_workers={args.workers}, median of "
        f"{args.runs} runs; {os.cpu_count()} CPUs, {time.perf_counter() - started:.0f} s in all"
        f"\n\n{table(rows, storage)}\n"
    )
    if throttle is not None and not slow:
        text += f"\nEmulated hard disk skipped: {throttle.why}.\n"
    print(text)
    benchlib.save_results(args, "bench_mix", text)


if __name__ == "__main__":
    main()
