"""Build speed: packer build vs the LMDB script most projects use, and vs tar.

On a generated tree of real-looking images (scripts/make_demo_data.py, default 12,000 images
in 10 class folders, warm page cache), side by side, median of several runs:
- baseline: one process that walks the tree, reads and decodes each image (cv2.imdecode),
  puts it into LMDB and commits every 1,000 (the recipe of most create_lmdb scripts), run as a
  script of its own as packer runs as a command (start-up and imports counted for both);
- packer build --workers 1 and --workers N (default: all cores), with the decode check;
- the same two with --shard-size S, so the tree forms several shards: with several workers,
  each worker process then writes whole shards (the shard task, as the Ray engine does);
- packer build --no-decode-check --workers N, next to `tar -cf` of the same tree;
- in one process, per image of the tree: the full decode the decode check once was
  (``decode_source``: OpenCV, IMREAD_UNCHANGED) and the check a build now makes
  (``check_source``: JPEG at 1/8 scale, PNG by its inflated stream), by format.
Targets: --workers 2 >= 1.5x baseline images/s (several shards);
--no-decode-check <= 1.5x tar's time.  Ratios are of medians of runs interleaved in one
process, so load from other work on the machine hits every case alike; each case's CPU seconds
(all its processes, user + system) and CPU us per image are printed too, which load changes
far less than wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import lmdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def baseline(src: Path, out: Path) -> int:
    """The usual create_lmdb script: decode to check, put, commit every 1000."""
    env = lmdb.open(str(out), map_size=1 << 34)
    txn = env.begin(write=True)
    n = 0
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    for label, cls in enumerate(classes):
        for path in sorted((src / cls).iterdir()):
            data = path.read_bytes()
            if cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) is None:
                continue
            n += 1
            txn.put(b"image-%09d" % n, data)
            txn.put(b"label-%09d" % n, str(label).encode())
            if n % 1000 == 0:
                txn.commit()
                txn = env.begin(write=True)
    txn.put(b"num-samples", str(n).encode())
    txn.commit()
    env.close()
    return n


def check_costs(src: Path, runs: int) -> dict[str, tuple[float, float]]:
    """Per format: (full decode, decode check) microseconds per image, medians of `runs`."""
    from packer.decode_check import check_source, decode_source
    from readers.formats.images import sniff_format

    files: dict[str, list[bytes]] = {}
    for path in sorted(src.rglob("*.*")):
        data = path.read_bytes()
        fmt = sniff_format(data[:32])
        if fmt is not None:
            files.setdefault(fmt, []).append(data)
    costs = {}
    for fmt, blobs in files.items():
        full, cheap = [], []
        for _ in range(runs):
            for fn, times in ((decode_source, full), (check_source, cheap)):
                start = time.perf_counter()
                for data in blobs:
                    fn(data, fmt)
                times.append((time.perf_counter() - start) / len(blobs) * 1e6)
        costs[fmt] = (statistics.median(full), statistics.median(cheap))
    return costs


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children so far."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Wall seconds and CPU seconds (all processes) of one call of `fn`."""
    start, cpu = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - start, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=12000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--shard-size", default="32MiB", help="for the several-shards cases")
    benchlib.add_output_arguments(parser, "bench_build")
    args = parser.parse_args()
    import compileall

    from make_demo_data import CLASSES, write_demo

    for package in ("packer", "readers"):  # bytecode, as an installed packer has it
        compileall.compile_dir(ROOT / package, quiet=1)
    base = Path(tempfile.mkdtemp(prefix="packer-build-", dir=os.environ.get("BENCH_TMP")))
    packer = [sys.executable, "-m", "packer.cli", "build", "--no-progress"]
    try:
        src = base / "src"
        write_demo(src, per_class=args.images // len(CLASSES), size=96, seed=0)
        n = sum(1 for _ in src.rglob("*.*"))
        subprocess.run(["tar", "-cf", os.devnull, "-C", str(base), "src"], check=True)  # warm

        def run_packer(*extra: str) -> None:
            out = base / "out.lmdb"
            subprocess.run(
                [*packer, str(src), str(out), "--overwrite", *extra],
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=ROOT,
            )

        def run_baseline() -> None:  # a script of its own, as packer is a command of its own
            out = base / "baseline.lmdb"
            shutil.rmtree(out, ignore_errors=True)
            script = (
                f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); "
                "from pathlib import Path; from bench_build import baseline; "
                f"baseline(Path({str(src)!r}), Path({str(out)!r}))"
            )
            subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)

        def run_tar() -> None:
            subprocess.run(
                ["tar", "-cf", str(base / "copy.tar"), "-C", str(base), "src"], check=True
            )

        cases = {
            "baseline (decode, commit every 1000)": run_baseline,
            "packer --workers 1": lambda: run_packer("--workers", "1"),
            f"packer --workers {args.workers}": lambda: run_packer("--workers", str(args.workers)),
            f"packer --workers 1 --shard-size {args.shard_size}": lambda: run_packer(
                "--workers", "1", "--shard-size", args.shard_size
            ),
            f"packer --workers {args.workers} --shard-size {args.shard_size}": lambda: run_packer(
                "--workers", str(args.workers), "--shard-size", args.shard_size
            ),
            f"packer --no-decode-check --workers {args.workers}": lambda: run_packer(
                "--no-decode-check", "--workers", str(args.workers)
            ),
            "tar -cf": run_tar,
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        cpus: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.runs):  # interleaved, so drift hits every case alike
            for name, fn in cases.items():
                wall, cpu = timed(fn)
                times[name].append(wall)
                cpus[name].append(cpu)
        costs = check_costs(src, args.runs)
        med = {k: statistics.median(v) for k, v in times.items()}
        base_rate = n / med["baseline (decode, commit every 1000)"]
        one_rate = n / med["packer --workers 1"]
        cpu = {k: min(v) for k, v in cpus.items()}  # the least: what the work needs
        base_name = "baseline (decode, commit every 1000)"
        lines = [
            f"### Build: {n:,} images (96x96 PNG/JPEG), warm cache, median of {args.runs}, "
            f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f} at the end",
            "",
            "Every case is a command of its own (process start-up and imports included). CPU: "
            "user + system seconds of all its processes, the least of the runs, which load "
            "from other work inflates least; CPU us/image is that over the images.",
            "",
            "| method | seconds | images/s | vs baseline | vs packer --workers 1 "
            "| CPU seconds | CPU us/image | CPU vs baseline |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, seconds in med.items():
            rate = n / seconds
            lines.append(
                f"| {name} | {seconds:.2f} | {rate:,.0f} | {rate / base_rate:.2f}x "
                f"| {rate / one_rate:.2f}x | {cpu[name]:.2f} | {cpu[name] / n * 1e6:.0f} "
                f"| {cpu[name] / cpu[base_name]:.2f}x |"
            )
        lines += [
            "",
            f"- CPU per image: baseline {cpu[base_name] / n * 1e6:.0f} us, packer --workers 1 "
            f"{cpu['packer --workers 1'] / n * 1e6:.0f} us, --workers {args.workers} "
            f"{cpu[f'packer --workers {args.workers}'] / n * 1e6:.0f} us (on a quiet machine "
            f"of {args.workers} cores --workers {args.workers} reaches 1.5x the baseline only "
            "when its CPU is well under ~1.3x the baseline's)",
        ]
        par = med[f"packer --workers {args.workers}"]
        multi = med[f"packer --workers {args.workers} --shard-size {args.shard_size}"]
        nodec = med[f"packer --no-decode-check --workers {args.workers}"]
        lines += [
            "",
            f"- --workers {args.workers}, one shard, vs baseline: {n / par / base_rate:.2f}x",
            f"- --workers {args.workers}, --shard-size {args.shard_size} (several shards), vs "
            f"baseline: {n / multi / base_rate:.2f}x (target >= 1.5x)",
            f"- --no-decode-check vs tar -cf: {nodec / med['tar -cf']:.2f}x the time "
            "(target <= 1.5x)",
        ]
        lines += [
            "",
            "| one process, per image | full decode (us) | decode check (us) | cheaper |",
            "|---|---|---|---|",
        ]
        for fmt, (full, cheap) in sorted(costs.items()):
            lines.append(f"| {fmt.upper()} | {full:.0f} | {cheap:.0f} | {full / cheap:.2f}x |")
        text = "\n".join(lines)
        print(text)
        benchlib.save_results(args, "bench_build", text + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
