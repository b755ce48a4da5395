"""Read speed: packed LMDB/RecordIO vs DatasetFolder over the loose files vs the decode bound.

Generates a tree of small real-looking images (scripts/make_demo_data.py: 64x64 PNG and JPEG
in 10 class folders), packs it with ``packer build`` (LMDB, and RecordIO when the readers have
``RecordIODataset``), then times, side by side in one run, ``paddle.io.DataLoader`` (batch 64,
num_workers 0..cores, use_shared_memory=True, the same OpenCV RGB decode and collate) over:

- ``LmdbDataset`` / ``RecordIODataset`` with ``ChunkShuffleBatchSampler``;
- ``paddle.vision.datasets.DatasetFolder`` over the loose files (``BatchSampler(shuffle=True)``);
- the decode bound: a Dataset over the same encoded bytes held in RAM, decoded the same way by
  the same number of processes.

Each figure is the median of several runs. warm: persistent workers, one epoch of warm-up,
then runs of an epoch (or 10,000 samples, if more) back to back. cold: before each epoch the
files' pages are dropped (posix_fadvise DONTNEED; inodes and directories stay cached, which
favours the loose files), and the epoch runs with fresh workers (a file mapped by a live worker
cannot be evicted), timed from its first batch. slow disk: the cold runs again in a blkio
cgroup v1 throttle of 100 MiB/s and 300 IOPS on the data's disk (needs root; DatasetFolder times
a random subset there, since a whole epoch at 300 IOPS takes minutes).

Targets (issue 6): warm >= 90 % of the decode bound; cold >= 90 % of warm and >= 2x
DatasetFolder cold; slow disk >= 20x DatasetFolder.

``--out DIR`` writes DIR/bench_read.md. BENCH_TMP names the parent of the temporary data.
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
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CGROUP_ROOT = Path("/sys/fs/cgroup/blkio")
SLOW_BPS = 100 * 2**20
SLOW_IOPS = 300
BATCH = 64
MIN_WARM_RUN = 10_000
"""Samples per warm run at least (several epochs of a small dataset)."""
DATASETFOLDER = "DatasetFolder"
DECODE_BOUND = "decode bound"
LOADERS = ("LmdbDataset", "RecordIODataset")


# --------------------------------------------------------------------------- child: measure


def _eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def _cv2_rgb(path: str) -> Any:
    import numpy as np

    from readers.decode import decode_image

    return decode_image(np.fromfile(path, dtype=np.uint8), "rgb")


class InMemory:
    """The decode bound: the encoded bytes in RAM, decoded like the packed datasets do."""

    def __init__(self, blobs: list[bytes], labels: list[int]) -> None:
        self.blobs = blobs
        self.labels = labels

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from readers.decode import decode_image

        return decode_image(self.blobs[i], "rgb"), self.labels[i]


class ListBatches:
    """A fixed list of batches (a random subset) as a batch sampler."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)


def _evict(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _files_under(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


class Epochs:
    """Epoch after epoch of a Child's batch sampler, as one endless batch sampler (paddle's
    persistent workers sleep 0.5 s at every epoch start; warm runs time the steady state)."""

    def __init__(self, child: Child, name: str) -> None:
        self.child, self.name = child, name

    def __iter__(self) -> Any:
        epoch = 0
        while True:
            yield from self.child.batch_sampler(self.name, epoch)
            epoch += 1


class Child:
    """Runs in a fresh process (possibly inside the throttled cgroup) and times loaders."""

    def __init__(self, spec: dict[str, Any]) -> None:
        warnings.filterwarnings("ignore", message="No ccache found")
        import numpy as np
        import paddle

        import readers
        from packer.bench import EndlessBatches, collate

        self.np, self.paddle = np, paddle
        self.EndlessBatches, self.collate = EndlessBatches, collate
        self.spec = spec
        self.rng = np.random.default_rng(0)
        self.sources: dict[str, tuple[Any, Any, list[str]]] = {}
        self.notes: list[str] = []
        for name, path in spec["packed"].items():
            try:
                cls = getattr(readers, name)
            except (AttributeError, ImportError) as exc:
                self.notes.append(f"{name} skipped: readers has no {name} yet ({exc})")
                continue
            self.sources[name] = (cls(path), None, _files_under(Path(path)))
        folder = paddle.vision.datasets.DatasetFolder(spec["src"], loader=_cv2_rgb)
        self.sources[DATASETFOLDER] = (folder, None, [p for p, _ in folder.samples])
        if spec.get("decode_bound"):
            ds = self.sources["LmdbDataset"][0]
            blobs = [ds.read_bytes(i) for i in range(len(ds))]
            labels = [int(x) for x in ds.labels]
            self.sources[DECODE_BOUND] = (InMemory(blobs, labels), None, [])
        from readers import handles

        handles.close_all()  # no mapping in this process may keep evicted pages alive

    def batch_sampler(self, name: str, epoch: int, *, subset: int | None = None) -> Any:
        ds = self.sources[name][0]
        if name in LOADERS:
            from readers import ChunkShuffleBatchSampler

            sampler = ChunkShuffleBatchSampler(ds, batch_size=BATCH, rank=0, world_size=1)
            sampler.set_epoch(epoch)
            return sampler
        order = self.rng.permutation(len(ds))
        if subset is not None:
            order = order[:subset]
        return ListBatches([order[s : s + BATCH].tolist() for s in range(0, len(order), BATCH)])

    def loader(self, name: str, sampler: Any, workers: int, *, persistent: bool) -> Any:
        options: dict[str, Any] = {"batch_sampler": sampler, "collate_fn": self.collate}
        return self.paddle.io.DataLoader(
            self.sources[name][0],
            num_workers=workers,
            use_shared_memory=True,
            persistent_workers=persistent and workers > 0,
            **options,
        )

    def warm(self, name: str, workers: int, runs: int) -> list[float]:
        """Samples/s of `runs` runs (an epoch, or 10,000 samples if more), back to back in one
        endless stream after one epoch of warm-up."""
        n = len(self.sources[name][0])
        per_epoch = -(-n // BATCH)
        per_run = max(per_epoch, -(-MIN_WARM_RUN // BATCH))  # short epochs time too noisily
        loader = self.loader(name, Epochs(self, name), workers, persistent=True)
        it = iter(loader)
        rates = []
        try:
            for _ in range(per_epoch):  # warm-up: the page cache and the workers
                next(it)
            for _ in range(runs):
                start, samples = time.perf_counter(), 0
                for _ in range(per_run):
                    samples += len(next(it)[1])
                rates.append(samples / (time.perf_counter() - start))
        finally:
            stop = getattr(it, "_try_shutdown_all", None)
            if callable(stop):
                stop()
        return rates

    def cold(self, name: str, workers: int, runs: int, *, subset: int | None = None) -> list[float]:
        """Samples/s of `runs` epochs, each after dropping the files' pages, fresh workers."""
        from readers import handles

        files = self.sources[name][2]
        rates = []
        for run in range(runs):
            handles.close_all()
            _evict(files)
            loader = self.loader(
                name, self.batch_sampler(name, run + 1, subset=subset), workers, persistent=False
            )
            it = iter(loader)
            next(it)
            start, samples = time.perf_counter(), 0
            for batch in it:
                samples += len(batch[1])
            rates.append(samples / (time.perf_counter() - start))
            del it, loader
        handles.close_all()
        return rates

    def run(self) -> list[dict[str, Any]]:
        results = []
        runs = self.spec["runs"]
        for mode in self.spec["modes"]:
            for name in self.sources:
                if mode == "warm" or name != DECODE_BOUND:
                    for w in self.spec["workers"]:
                        subset = self.spec.get("subset") if name == DATASETFOLDER else None
                        t = time.perf_counter()
                        if mode == "warm":
                            rates = self.warm(name, w, runs)
                        else:
                            rates = self.cold(name, w, runs, subset=subset)
                        rate = statistics.median(rates)
                        _eprint(
                            f"  {self.spec['storage']:9} {mode:4} {name:15} workers={w}: "
                            f"{rate:8.0f} samples/s ({time.perf_counter() - t:.0f} s)"
                        )
                        results.append(
                            {
                                "loader": name,
                                "storage": self.spec["storage"],
                                "cache": mode,
                                "workers": w,
                                "samples_per_s": rate,
                                "runs": rates,
                                "subset": subset,
                            }
                        )
        return results


def child_main(spec_path: Path, result_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    child = Child(spec)
    results = child.run()
    result_path.write_text(json.dumps({"results": results, "notes": child.notes}))


# --------------------------------------------------------------------------- parent


def measure(spec: dict[str, Any], tmp: Path, *, cgroup: Path | None = None) -> dict[str, Any]:
    """Run a Child in a fresh process (inside `cgroup` when given): its results and notes."""
    tag = spec["storage"].replace(" ", "-")
    spec_path, result_path = tmp / f"spec-{tag}.json", tmp / f"result-{tag}.json"
    spec_path.write_text(json.dumps(spec))

    def join_cgroup() -> None:  # runs in the child before exec: the workers inherit it
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    subprocess.run(
        [sys.executable, __file__, "--child", str(spec_path), str(result_path)],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=join_cgroup if cgroup is not None else None,
    )
    return json.loads(result_path.read_text())  # type: ignore[no-any-return]


def make_throttle(data: Path) -> tuple[Path | None, str]:
    """A blkio cgroup throttling reads of the disk holding `data`; else None and why not."""
    from packer.bench import whole_disk

    if os.geteuid() != 0:
        return None, "not root (a blkio cgroup needs root)"
    if not (CGROUP_ROOT / "blkio.throttle.read_bps_device").exists():
        return None, f"no cgroup v1 blkio controller at {CGROUP_ROOT}"
    disk = whole_disk(os.stat(data).st_dev)
    if disk is None:
        return None, (
            f"{data} is not on a block device (tmpfs or overlay?); set BENCH_TMP to a "
            "directory on a disk"
        )
    name, dev = disk
    group = CGROUP_ROOT / f"packer-bench-read-{os.getpid()}"
    try:
        group.mkdir()
        (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {SLOW_BPS}")
        (group / "blkio.throttle.read_iops_device").write_text(f"{dev} {SLOW_IOPS}")
    except OSError as exc:
        remove_cgroup(group)
        return None, f"cannot set a blkio throttle on {name} ({dev}): {exc}"
    return group, f"{name} ({dev}) throttled to {SLOW_BPS >> 20} MiB/s and {SLOW_IOPS} IOPS"


def cgroup_reads(group: Path) -> tuple[int, int]:
    """(bytes, IOs) read through the cgroup's throttle so far."""
    totals = []
    for name in ("blkio.throttle.io_service_bytes", "blkio.throttle.io_serviced"):
        total = 0
        for line in (group / name).read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "Read":
                total += int(parts[2])
        totals.append(total)
    return totals[0], totals[1]


def remove_cgroup(group: Path) -> None:
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # the child's workers may still be exiting
    _eprint(f"could not remove the cgroup {group}; remove it with rmdir")


def build_all(src: Path, tmp: Path, formats: list[str]) -> dict[str, Path]:
    from packer.build import build
    from packer.config import BuildConfig, usable_cores

    out = {}
    for fmt in formats:
        path = tmp / f"data.{fmt}"
        t = time.perf_counter()
        summary = build(
            BuildConfig(src=src, out=path, format=fmt, workers=usable_cores(), progress=False),
            log=lambda _m: None,
        )
        _eprint(f"{summary.line()} ({time.perf_counter() - t:.1f} s)")
        out[fmt] = path
    return out


def fmt_ratio(x: float | None, pct: bool = False, *, digits: int = 0) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}%}" if pct else f"{x:.2f}x"


def tables(
    results: list[dict[str, Any]], *, workers: list[int], slow_note: str, header: str
) -> str:
    def rate(loader: str, storage: str, cache: str, w: int) -> float | None:
        for r in results:
            if (r["loader"], r["storage"], r["cache"], r["workers"]) == (loader, storage, cache, w):
                return float(r["samples_per_s"])
        return None

    lines = [
        header,
        "",
        "| loader | storage | cache | workers | samples/s | vs DatasetFolder | "
        "vs decode bound | cold / warm |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        name, storage, cache, w = r["loader"], r["storage"], r["cache"], r["workers"]
        folder = rate(DATASETFOLDER, storage, cache, w)
        bound = rate(DECODE_BOUND, "fast disk", "warm", w)
        warm = rate(name, "fast disk", "warm", w)
        value = r["samples_per_s"]
        subset = f" ({r['subset']} samples)" if r.get("subset") else ""
        lines.append(
            f"| {name} | {storage} | {cache}{subset} | {w} | {value:,.0f} | "
            f"{fmt_ratio(value / folder if folder and name != DATASETFOLDER else None)} | "
            f"{fmt_ratio(value / bound if bound and name != DECODE_BOUND else None, True)} | "
            f"{fmt_ratio(value / warm if warm and cache == 'cold' else None, True)} |"
        )

    targets = []
    for name in LOADERS:
        if rate(name, "fast disk", "warm", workers[0]) is None:
            continue
        checks: list[tuple[str, str, float | None, float, bool]] = []
        for w in workers:
            warm = rate(name, "fast disk", "warm", w)
            cold = rate(name, "fast disk", "cold", w)
            bound = rate(DECODE_BOUND, "fast disk", "warm", w)
            folder_cold = rate(DATASETFOLDER, "fast disk", "cold", w)
            slow = rate(name, "slow disk", "cold", w)
            folder_slow = rate(DATASETFOLDER, "slow disk", "cold", w)
            if warm and bound:
                checks.append(("warm / decode bound", ">= 90%", warm / bound, 0.9, True))
            if warm and cold:
                checks.append(("cold / warm", ">= 90%", cold / warm, 0.9, True))
            if cold and folder_cold:
                checks.append(("cold / DatasetFolder cold", ">= 2x", cold / folder_cold, 2, False))
            if slow and folder_slow:
                checks.append(
                    ("slow disk / DatasetFolder", ">= 20x", slow / folder_slow, 20, False)
                )
            for what, goal, value, need, pct in checks:
                if value is not None:
                    targets.append(
                        f"| {name} | {what} | {w} | {fmt_ratio(value, pct, digits=1)} | {goal} | "
                        f"{'yes' if value >= need else 'NO'} |"
                    )
            checks.clear()
    lines += [
        "",
        "| loader | target | workers | result | target | met |",
        "|---|---|---:|---:|---:|---|",
        *sorted(targets, key=lambda t: (t.split("|")[1], t.split("|")[2], t.split("|")[3])),
        "",
        slow_note,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=None, help="default 10000 (quick: 4000)")
    parser.add_argument("--runs", type=int, default=None, help="epochs per figure (default 5)")
    parser.add_argument("--workers", type=str, default=None, help="e.g. 0,2 (default 0..cores)")
    parser.add_argument("--quick", action="store_true", help="4000 images, 3 runs")
    parser.add_argument("--no-slow-disk", action="store_true", help="skip the throttled disk")
    parser.add_argument("--out", type=Path, default=None, help="write bench_read.md here")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return

    from make_demo_data import CLASSES, write_demo

    from packer.config import usable_cores
    from readers.formats import FORMATS

    cores = usable_cores()
    images = args.images or (4000 if args.quick else 10_000)
    runs = args.runs or (3 if args.quick else 5)
    workers = [int(w) for w in args.workers.split(",")] if args.workers else list(range(cores + 1))
    # readers' datasets are checked in the child: importing paddle here would give the build's
    # worker processes paddle's signal handlers (a C++ "traceback" when the pool stops them)
    formats = [f for f in ("lmdb", "recordio") if f in FORMATS]
    loaders = {"lmdb": "LmdbDataset", "recordio": "RecordIODataset"}

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        src = tmp / "src"
        t = time.perf_counter()
        n = write_demo(src, per_class=-(-images // len(CLASSES)), size=64, seed=0)
        _eprint(f"wrote {n} 64x64 PNG/JPEG images in {time.perf_counter() - t:.1f} s")
        packed = build_all(src, tmp, formats)
        spec = {
            "packed": {loaders[f]: str(p) for f, p in packed.items()},
            "src": str(src),
            "workers": workers,
            "runs": runs,
            "storage": "fast disk",
            "modes": ["warm", "cold"],
            "decode_bound": True,
        }
        fast = measure(spec, tmp)
        results, notes = fast["results"], fast["notes"]

        group, why = (None, "skipped (--no-slow-disk)") if args.no_slow_disk else make_throttle(src)
        if group is None:
            slow_note = f"Slow disk: skipped: {why}."
            _eprint(f"slow-disk table skipped: {why}")
        else:
            subset = 10 * BATCH if args.quick else 20 * BATCH
            slow = {
                **spec,
                "storage": "slow disk",
                "modes": ["cold"],
                "workers": [max(workers)],
                "decode_bound": False,
                "subset": subset,
            }
            try:
                results += measure(slow, tmp, cgroup=group)["results"]
                read_bytes, ios = cgroup_reads(group)
            finally:
                remove_cgroup(group)
            slow_note = (
                f"Slow disk: {why} (blkio cgroup v1), cold runs only, num_workers={max(workers)}; "
                f"DatasetFolder reads a random {subset}-sample subset per run. The throttled "
                f"runs read {read_bytes / 2**20:.0f} MiB in {ios:,} I/Os."
            )
    elapsed = time.perf_counter() - started
    cpu = os.cpu_count()
    header = (
        f"### Read speed: {n:,} images 64x64 (2/3 PNG, 1/3 JPEG), batch {BATCH}, "
        f"median of {runs} runs; {cores} usable cores ({cpu} CPUs), {elapsed:.0f} s in all"
    )
    text = tables(results, workers=workers, slow_note=slow_note, header=header)
    if notes:
        text += "\n\n" + "\n".join(f"Note: {x}" for x in notes)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_read.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
