"""How read-ahead hints reach the disk: request sizes and samples/s of a cold sequential pass.

Packs the oxygen icons (resized to 64x64 PNG; demo shapes when the theme is not installed) in
every registered format, then, per format and hint mechanism, in a fresh process: drops the
page cache (``echo 3 > /proc/sys/vm/drop_caches``), reads every sample's stored bytes in id
order, and reports samples/s, the mean size of the disk's read requests (/sys/block/DISK/stat,
every process's reads on that disk while the pass ran) and of the bios the pass submitted (the
blkio cgroup's counters: this pass only). Mechanisms, each hinting chunks of 64 samples two
chunks ahead of the reads (as the samplers do), except ``none`` and ``detector``:

- none:          no hint (a DataLoader with no project sampler before read-ahead detection)
- fadvise-range: one posix_fadvise(WILLNEED) over the chunk's first..last byte (the old hint)
- fadvise:       ``dataset.prefetch``: the chunk's coalesced extents, in pieces (readers.readahead)
- madvise:       madvise(MADV_WILLNEED) of the same extents on the dataset's own mapping
- pread:         one pread of each extent just before the chunk is read (blocking)
- detector:      ``dataset[i]`` in id order: the dataset's own read-ahead, no caller hints
- sampler:       ChunkShuffleSampler's shuffled order with its own hints (``dataset.prefetch``)

Default storage: the emulated hard disk (blkio cgroup v1 throttle, 100 MiB/s and 300 IOPS;
root); ``--fast`` adds this machine's disk as it is. ``--out DIR`` writes bench_readahead.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib
import pagecache

MODES = ("none", "fadvise-range", "fadvise", "madvise", "pread", "detector", "sampler")
CHUNK = 64
AHEAD = 2


# --------------------------------------------------------------------------- child


def _mapping(path: str) -> tuple[int, int] | None:
    """(address, file offset) of this process's mapping of `path`, from /proc/self/maps."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == real:
                return int(parts[0].split("-")[0], 16), int(parts[2], 16)
    return None


class Hinter:
    """One mechanism's hint of samples ``[lo, hi)`` (one shard: the benchmark packs one)."""

    def __init__(self, ds: Any, mode: str) -> None:
        self.ds, self.mode = ds, mode
        path = ds._byte_ranges(0, 0, 1)[0][0]
        self.fd = os.open(path, os.O_RDONLY)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.map = _mapping(path)

    def __call__(self, lo: int, hi: int) -> None:
        if self.mode == "fadvise-range":
            _, begin, end = self.ds._byte_range(0, lo, hi)
            os.posix_fadvise(self.fd, begin, end - begin, os.POSIX_FADV_WILLNEED)
        elif self.mode == "fadvise":
            self.ds.prefetch(lo, hi)
        elif self.mode == "madvise":
            assert self.map is not None, "the dataset's file is not mapped"
            address, offset = self.map
            for _, begin, end in self.ds._byte_ranges(0, lo, hi):
                start = address + begin - offset
                page = start - start % mmap.PAGESIZE
                self.libc.madvise(page, end - begin + start - page, mmap.MADV_WILLNEED)
        elif self.mode == "pread":
            for _, begin, end in self.ds._byte_ranges(0, lo, hi):
                os.pread(self.fd, end - begin, begin)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from readers import open_dataset

    ds = open_dataset(spec["path"], decode="bytes")
    n, mode = len(ds), spec["mode"]
    ds.read_bytes(0)  # open the shard (its mapping) before the clock starts
    hint = Hinter(ds, mode)
    if mode == "sampler":
        from readers import ChunkShuffleSampler

        sampler = ChunkShuffleSampler(ds, seed=1, rank=0, world_size=1)
        sampler.set_epoch(spec.get("run", 0) + 1)
        order = iter(sampler)  # its hints go to ds.prefetch as the pass goes
    ds[0]  # every code path of the pass runs once before the page cache is dropped
    hint(0, 1)
    throttle = benchlib.Throttle.of(spec.get("cgroup"))
    throttle.join()  # only the pass is throttled: imports and setup ran at full speed
    cold = pagecache.drop_caches()
    if not cold:
        pagecache.evict(benchlib.files_under(Path(spec["path"])))
    disk0, cg0 = benchlib.disk_reads(spec["disk"]), throttle.reads()
    start = time.perf_counter()
    if mode == "detector":
        for i in range(n):
            ds[i]
    elif mode == "sampler":
        for i in order:
            ds.read_bytes(i)
    else:
        unhinted = 0  # the first chunk not hinted yet
        for lo in range(0, n, CHUNK):
            if mode == "pread":
                hint(lo, min(n, lo + CHUNK))
            elif mode != "none":
                while unhinted <= min(n - 1, lo + AHEAD * CHUNK):
                    hint(unhinted, min(n, unhinted + CHUNK))
                    unhinted += CHUNK
            for i in range(lo, min(n, lo + CHUNK)):
                ds.read_bytes(i)
    seconds = time.perf_counter() - start
    disk1, cg1 = benchlib.disk_reads(spec["disk"]), throttle.reads()
    return {
        "samples_per_s": n / seconds,
        "disk_requests": disk1[0] - disk0[0],
        "disk_bytes": disk1[1] - disk0[1],
        "bios": cg1[1] - cg0[1],
        "bio_bytes": cg1[0] - cg0[0],
        "cold": cold,
    }


# --------------------------------------------------------------------------- parent


def table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| format | hints | samples/s | MB/s (images) | mean disk request | mean bio (this pass) "
        "| bios |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bios = (f"{r['bio_kb']:.0f} KB | {r['bios']:,.0f}") if r["bios"] else "| "
        lines.append(
            f"| {r['format']} | {r['mode']} | {r['samples_per_s']:,.0f} | {r['mb_per_s']:.0f} | "
            f"{r['request_kb']:.0f} KB | {bios} |"
        )
    return "\n".join(lines)


def summarize(fmt: str, mode: str, runs: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    med = benchlib.median
    return {
        "format": fmt,
        "mode": mode,
        "samples_per_s": med([r["samples_per_s"] for r in runs]),
        "mb_per_s": med([r["samples_per_s"] for r in runs]) * nbytes / 1e6,
        "request_kb": med([r["disk_bytes"] / max(1, r["disk_requests"]) / 1024 for r in runs]),
        "bio_kb": med([r["bio_bytes"] / max(1, r["bios"]) / 1024 for r in runs]),
        "bios": med([r["bios"] for r in runs]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="passes per figure (median)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--fast", action="store_true", help="also this machine's disk as it is")
    parser.add_argument("--data", type=Path, help="a directory of packed datasets data.<fmt>")
    benchlib.add_output_arguments(parser, "bench_readahead")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child[0].read_text())
        args.child[1].write_text(json.dumps(child(spec)))
        return
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        if args.data:
            packed = {f: args.data / f"data.{f}" for f in benchlib.formats()}
            what = f"the datasets in {args.data}"
        else:
            _, what = benchlib.icon_tree(tmp / "src")
            packed = benchlib.build_all(tmp / "src", tmp)
        throttle = benchlib.Throttle(tmp)
        disk = benchlib.whole_disk(tmp)
        if disk is None:
            sys.exit(f"{tmp} is not on a block device; set BENCH_TMP to a directory on a disk")
        storages: list[tuple[str, benchlib.Throttle | None]] = []
        if throttle.group:
            storages.append(("emulated hard disk", throttle))
        if args.fast or not storages:
            storages.append(("this machine's disk", None))
        sections = []
        try:
            for storage, th in storages:
                rows = []
                for fmt, path in packed.items():
                    from readers import open_dataset

                    ds = open_dataset(path, decode="bytes")
                    mean = float(ds.index.nbytes.mean()) if ds.index is not None else 0.0
                    for mode in modes:
                        spec = {
                            "path": str(path),
                            "mode": mode,
                            "disk": disk[0],
                            "cgroup": str(th.group) if th is not None and th.group else "",
                        }
                        runs = [
                            benchlib.run_child(Path(__file__), {**spec, "run": k}, tmp)
                            for k in range(args.runs)
                        ]
                        rows.append(summarize(fmt, mode, runs, int(mean)))
                        r = rows[-1]
                        benchlib.eprint(
                            f"{storage} {fmt} {mode}: {r['samples_per_s']:,.0f}/s, disk requests "
                            f"{r['request_kb']:.0f} KB, bios {r['bio_kb']:.0f} KB x {r['bios']:.0f}"
                        )
                note = throttle.why if th is not None else "no throttle"
                sections.append(
                    table(
                        rows,
                        f"Cold pass in id order (sampler: its own order), {storage} ({note}), "
                        f"{what}",
                    )
                    + f"\n\nMedian of {args.runs} passes; chunks of {CHUNK} samples hinted "
                    f"{AHEAD} chunks ahead. Mean disk request: all reads of {disk[0]} during "
                    "the pass (other processes' too); mean bio: this pass's reads as submitted."
                )
        finally:
            throttle.remove()
    text = "\n\n".join(sections)
    print(text)
    benchlib.save_results(args, "bench_readahead", text + "\n")


if __name__ == "__main__":
    main()
