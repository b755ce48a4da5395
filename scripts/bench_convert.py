"""Convert speed: ``packer convert`` of a packed LMDB to RecordIO vs ``cp -r`` of the same bytes.

A ~35k-sample LMDB dataset of small generated JPEGs is written through `packer.repack` (no
build: the records are synthesised), then, interleaved in one process with the page cache in
the same state for all (each run after the other, warm), the median of 3 runs of
``packer convert IN OUT --format recordio`` (the console command, start-up included), of ``cp
-r`` of IN's shard directories, and of ``cp -r`` followed by ``sync`` of the copied files.

convert writes durably (every shard, index and meta file is fsynced before OUT is renamed into
place), as ``cp -r`` alone does not: ``cp -r`` + ``sync FILES`` (fsync of each copied file) is
the comparison of equal durability, and the target (convert <= 1.5x cp) is judged by
it; the ratio to ``cp -r`` alone is printed too. The convert's CPU time (user + system) is
printed per record, and the time of a 10-sample convert (the command's start-up: Python,
numpy, pyarrow, typer) apart from the rest. The commands run with a bytecode cache in the
benchmark's temporary directory (as an installed package has its .pyc), so no run compiles
packer's sources.

``--cold`` evicts IN's pages from the page cache before every timed ``cp`` and convert (the
libraries stay warm: the convert's mapped libraries and bytecode are pinned in memory), so both
read IN from the disk; ``--slow-disk`` (root) also throttles the disk's reads to an emulated
hard disk (100 MiB/s, 300 IOPS, as bench_read.py's), where copying is I/O-bound for both.
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import shlex
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
sys.path.insert(0, str(ROOT / "scripts"))

import benchlib
import pagecache

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


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run `cmd`; return its wall-clock seconds and its CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def copy_and_sync(shards: list[Path], into: Path) -> list[str]:
    """``cp -r SHARDS INTO && sync`` of every copied file and directory, as one shell command."""
    copied = [into / s.name for s in shards]
    files = [str(into)] + [str(c) for c in copied]
    files += [str(c / p.name) for s, c in zip(shards, copied, strict=True) for p in s.iterdir()]
    script = 'cp -r "$@" && sync -- ' + " ".join(map(shlex.quote, files))
    return ["sh", "-c", script, "sh", *map(str, shards), str(into)]


def main() -> None:
    """Run the comparison and print the medians and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=35_000)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tmp", type=Path, default=None)
    benchlib.add_output_arguments(parser, "bench_convert")
    parser.add_argument("--cold", action="store_true", help="evict IN before each timed copy")
    parser.add_argument("--slow-disk", action="store_true", help="--cold on an emulated HDD")
    args = parser.parse_args()
    args.cold = args.cold or args.slow_disk
    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.tmp))
    try:
        src, tiny = tmp / "in.lmdb", tmp / "tiny.lmdb"
        payload = synthesise(src, args.count, args.size)
        synthesise(tiny, 10, args.size)  # its convert is the command's start-up, nearly
        shards = sorted(p for p in src.iterdir() if p.is_dir())
        packer = [sys.executable, "-c", "from packer.cli import main; main()"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        convert = [*packer, "convert", str(src), "--format", "recordio", "--no-progress"]
        start = [*packer, "convert", str(tiny), "--format", "recordio", "--no-progress"]
        timed([*convert, str(tmp / "warm.rec")], env)  # fills the bytecode cache
        timed(["cp", "-r", *map(str, shards), str(tmp / "warm")])  # same page cache for all
        inputs = [str(f) for s in shards for f in sorted(s.iterdir())]
        pinned, throttle, cached = None, None, 0.0
        if args.cold:
            for name in ("packer.cli", "packer.convert", "pyarrow.parquet"):
                importlib.import_module(name)  # maps the convert's libraries, pinned below
            libs = pagecache.mapped_files(exclude=inputs)
            libs += [str(f) for f in (tmp / "pycache").rglob("*.pyc")]
            pinned = pagecache.Pinned(libs)
        if args.slow_disk:
            throttle = benchlib.Throttle(tmp)
            if throttle.group is None:
                raise SystemExit(f"--slow-disk: {throttle.why}")
            throttle.join()

        def cold() -> None:
            nonlocal cached
            if args.cold:
                cached = max(cached, pagecache.make_cold(inputs))

        convert_s, convert_cpu, cp_s, sync_s, start_s = [], [], [], [], []
        for run in range(args.runs):
            copy, synced, out = tmp / f"copy{run}", tmp / f"synced{run}", tmp / f"out{run}.rec"
            copy.mkdir()
            synced.mkdir()
            cold()
            cp_s.append(timed(["cp", "-r", *map(str, shards), str(copy)])[0])
            cold()
            sync_s.append(timed(copy_and_sync(shards, synced))[0])
            cold()
            wall, cpu = timed([*convert, str(out)], env)
            convert_s.append(wall)
            convert_cpu.append(cpu)
            start_s.append(timed([*start, str(tmp / f"tiny{run}.rec")], env)[0])
            for path in (out, copy, synced, tmp / f"tiny{run}.rec"):
                shutil.rmtree(path)
        if pinned is not None:
            pinned.close()
        c, p, q, t = (statistics.median(x) for x in (convert_s, cp_s, sync_s, start_s))
        state = "warm page cache"
        if args.cold:
            state = f"IN evicted before each copy (at most {cached:.2%} still cached), "
            state += f"libraries pinned ({pinned.locked / 1e6:.0f} MB)" if pinned else ""
        if throttle is not None:
            state += f"; emulated hard disk: {throttle.why}"
        cpu = statistics.median(convert_cpu)
        text = (
            f"{args.count} samples, {payload / 1e6:.0f} MB stored, {state}: "
            f"packer convert lmdb->recordio "
            f"{c:.2f} s ({cpu:.2f} s CPU, {cpu / args.count * 1e6:.1f} us/record with start-up), "
            f"cp -r {p:.2f} s, cp -r + sync {q:.2f} s (medians of {args.runs}): "
            f"{c / q:.2f}x cp -r + sync (target <= 1.5x), {c / p:.2f}x cp -r; start-up (a "
            f"10-sample convert) {t:.2f} s, the rest {c - t:.2f} s = "
            f"{(c - t) / q:.2f}x cp -r + sync"
        )
        print(text)
        benchlib.save_results(args, "bench_convert", f"### Convert speed\n\n{text}\n")
    finally:
        if throttle is not None:
            throttle.remove()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
