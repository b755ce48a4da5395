"""Ray engine overhead: packer build --engine local vs --engine ray on this machine.

On a generated tree (scripts/make_demo_data.py, default 4,000 images of 96x96 in 10 class
folders, warm page cache), same options, --workers N (default: all cores), median of 3:
- end to end, as a user runs it: `packer build` in a fresh process, where the Ray engine
  also starts and stops a local Ray instance;
- in one process with Ray already running (as on a cluster, where it is): the engine's own
  cost, at a few and at many shards, and from it the overhead per shard.
Expectation: Ray's overhead is small; this says how small, per shard.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


_WALL = re.compile(r"node\(s\) in ([\d.]+) s")  # the Ray engine's summary lines
_TASKS = re.compile(r"([\d.]+) s in tasks")


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--shards", default="8,80", help="shard counts for the in-process comparison"
    )
    benchlib.add_output_arguments(parser, "bench_ray")
    args = parser.parse_args()
    import ray
    from make_demo_data import CLASSES, write_demo

    from packer.build import build
    from packer.config import BuildConfig

    counts = [int(x) for x in args.shards.split(",")]
    base = Path(tempfile.mkdtemp(prefix="packer-ray-", dir=os.environ.get("BENCH_TMP")))
    try:
        src = base / "src"
        write_demo(src, per_class=args.images // len(CLASSES), size=96, seed=0)
        files = [p for p in src.rglob("*") if p.is_file()]
        n, total = len(files), sum(p.stat().st_size for p in files)
        subprocess.run(["tar", "-cf", os.devnull, "-C", str(base), "src"], check=True)  # warm
        out = base / "out"

        def cli(engine: str, shard_size: int) -> None:
            options = ["--workers", str(args.workers), "--engine", engine]
            options += ["--shard-size", str(shard_size), "--overwrite", "--no-progress"]
            subprocess.run(
                [sys.executable, "-m", "packer.cli", "build", str(src), str(out), *options],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )

        def in_process(engine: str, shard_size: int, log: list[str] | None = None) -> int:
            cfg = BuildConfig(
                src=src,
                out=out,
                overwrite=True,
                progress=False,
                workers=args.workers,
                engine=engine,
                shard_size=shard_size,
            )
            return build(cfg, log=log.append if log is not None else lambda _m: None).shards

        def outside_tasks_ms(shard_size: int) -> float:
            """Median of (wall x CPUs - seconds inside tasks) / shards, from the engine's
            summary: what a shard costs the cluster beyond its own work, plus idle tails."""
            found = []
            for _ in range(args.runs):
                log: list[str] = []
                count = in_process("ray", shard_size, log)
                wall = sum(float(m.group(1)) for m in map(_WALL.search, log) if m)
                inside = sum(float(m.group(1)) for m in map(_TASKS.search, log) if m)
                found.append(1000 * (wall * args.workers - inside) / count)
            return statistics.median(found)

        sizes = {count: -(-total // count) for count in counts}
        e2e_size = sizes[counts[0]]
        e2e = {e: median_time(lambda e=e: cli(e, e2e_size), args.runs) for e in ("local", "ray")}
        # the local engine forks its pool: time it before this process starts Ray's threads
        local = {
            c: median_time(lambda s=s: in_process("local", s), args.runs) for c, s in sizes.items()
        }
        shards = {c: in_process("local", s) for c, s in sizes.items()}
        ray.init(
            address="local",
            num_cpus=args.workers,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        try:
            in_process("ray", sizes[counts[0]])  # workers started and packer imported in them
            remote = {
                c: median_time(lambda s=s: in_process("ray", s), args.runs)
                for c, s in sizes.items()
            }
            outside = {c: outside_tasks_ms(s) for c, s in sizes.items()}
        finally:
            ray.shutdown()

        lines = [
            f"### Ray engine overhead: {n:,} images ({total / 1e6:.1f} MB, 96x96 PNG/JPEG), "
            f"--workers {args.workers}, warm cache, median of {args.runs}",
            "",
            "| run | shards | local s | ray s | ray - local s | per shard ms | "
            "outside tasks per shard ms |",
            "|---|---|---|---|---|---|---|",
        ]
        e2e_diff = e2e["ray"] - e2e["local"]
        startup = e2e_diff - (remote[counts[0]] - local[counts[0]])
        lines.append(
            f"| `packer build` end to end (Ray started and stopped) | {shards[counts[0]]} | "
            f"{e2e['local']:.2f} | {e2e['ray']:.2f} | {e2e_diff:+.2f} | - | - |"
        )
        for c in counts:
            diff = remote[c] - local[c]
            lines.append(
                f"| in process, Ray running | {shards[c]} | {local[c]:.2f} | {remote[c]:.2f} | "
                f"{diff:+.2f} | {1000 * diff / shards[c]:+.1f} | {outside[c]:.1f} |"
            )
        few, many = counts[0], counts[-1]
        slope = (remote[many] - remote[few]) - (local[many] - local[few])
        per_shard = 1000 * slope / max(shards[many] - shards[few], 1)
        lines += [
            "",
            f"- Ray's cost per extra shard (slope from {shards[few]} to {shards[many]} shards, "
            f"over the local engine's): {per_shard:+.1f} ms",
            f"- CPU-slot time outside the tasks (dispatch, results, and the idle tail while the "
            f"last shards finish): {outside[many]:.1f} ms per shard at {shards[many]} shards",
            f"- starting and stopping a local Ray instance: about {startup:.1f} s per build "
            "(none when --ray-address names a running cluster)",
            f"- the local engine: {n / local[few]:,.0f} images/s; the Ray engine with Ray "
            f"running: {n / remote[few]:,.0f} images/s at {shards[few]} shards",
        ]
        text = "\n".join(lines)
        print(text)
        benchlib.save_results(args, "bench_ray", text + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
