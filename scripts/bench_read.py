"""Read speed as a user gets it: packed datasets vs loose files through paddle's DataLoader, cold.

Packs the oxygen icons resized to 64x64 PNG (8,813 real images; demo shapes when Debian's
oxygen-icon-theme is not installed) in every registered format, then times, side by side in
one run, ``paddle.io.DataLoader(ds, batch_size=64, num_workers=2)`` with the default collate:

- loose files: a DatasetFolder over the PNGs (OpenCV RGB decode), shuffle=False and True;
- each format's dataset: plain DataLoader shuffle=False and shuffle=True (no project sampler:
  paddle's BatchSampler), ChunkShuffleBatchSampler, and staged (``cache_dir=`` on /dev/shm,
  copied once per run from the cold disk; the copy's seconds are shown apart);
- the decode bound: the stored bytes held in RAM, decoded the same way through the same
  DataLoader, timed right after each chunked-sampler row in the same process (the shared
  machine's load drifts; the target's ratio is taken per run from these paired values).

Storage: this machine's disk, cold (the data's pages evicted before each row and checked gone
with mincore; fresh workers; the libraries held in memory: ``pagecache``), and an emulated
hard disk (blkio cgroup v1 throttle of 100 MiB/s and 300 IOPS on the data's disk; root). On
the emulated disk, random orders (shuffle=True, loose or packed) read a random subset of
``--subset`` batches per run: a whole epoch at 300 IOPS takes minutes. Each figure is the
median of ``--runs`` runs; rows alternate within each run. ``--out DIR`` writes
DIR/bench_read.md; BENCH_TMP names the parent of the temporary data.

``--cold-vs-warm``: the cold vs warm passes instead (see `coldwarm`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib
import coldwarm
import pagecache
from readreport import BATCH, BOUND, FAST, LOOSE, ORDERS, SLOW, storage_table, summary, targets


def _rgb(path: str) -> Any:
    import numpy as np

    from readers.decode import decode_sample

    return decode_sample(np.fromfile(path, dtype=np.uint8), "rgb")


class InMemory:
    """The decode bound: the stored bytes in RAM, decoded like the packed datasets do."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from readers.decode import decode_sample

        return decode_sample(self.blobs[i], "rgb"), 0


class ListBatches:
    """A fixed list of batches as a batch sampler (a random subset of an epoch)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)


class Child:
    """Times every row of one storage in a fresh process (it joins the throttle after its
    imports; DataLoader workers inherit the cgroup)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        warnings.filterwarnings("ignore")
        import numpy as np
        import paddle

        import readers.decode  # noqa: F401  (OpenCV's libraries mapped here too: pinned)

        self.np, self.paddle, self.spec = np, paddle, spec
        self.rng = np.random.default_rng(0)
        self.loose = paddle.vision.datasets.DatasetFolder(spec["src"], loader=_rgb)
        loose_files = [p for p, _ in self.loose.samples]
        self.data_files = loose_files + spec["packed_files"]  # made cold before each row
        self.throttle = benchlib.Throttle.of(spec["cgroup"])

    def dataset(self, fmt: str, **options: Any) -> Any:
        from readers import open_dataset

        return open_dataset(self.spec["packed"][fmt], **options)

    def loader(self, ds: Any, order: str, subset: int | None) -> Any:
        workers = self.spec["workers"]
        if order == "chunked sampler":
            from readers import ChunkShuffleBatchSampler

            sampler = ChunkShuffleBatchSampler(ds, batch_size=BATCH, rank=0, world_size=1)
            sampler.set_epoch(int(self.rng.integers(1, 1000)))
            return self.paddle.io.DataLoader(ds, batch_sampler=sampler, num_workers=workers)
        shuffle = order != "shuffle=False"
        if subset is not None:
            ids = self.rng.permutation(len(ds)) if shuffle else self.np.arange(len(ds))
            ids = ids[: subset * BATCH].tolist()
            batches: Any = ListBatches([ids[s : s + BATCH] for s in range(0, len(ids), BATCH)])
            return self.paddle.io.DataLoader(ds, batch_sampler=batches, num_workers=workers)
        return self.paddle.io.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, num_workers=workers)

    def counters(self) -> tuple[int, int]:
        """(requests, bytes) read so far: this process tree's through the throttle, else the
        whole disk's (other processes' reads too)."""
        if self.throttle.group is not None:
            nbytes, ios = self.throttle.reads()
            return ios, nbytes
        return benchlib.disk_reads(self.spec["disk"])

    def epoch(self, loader: Any, result: dict[str, Any] | None = None) -> float:
        """Samples/s of one pass, timed from its first batch (worker start-up left out); the
        reads of the same span go to `result` (requests, bytes)."""
        it = iter(loader)
        next(it)
        before = self.counters()
        start, samples = time.perf_counter(), 0
        for batch in it:
            samples += len(batch[1])
        rate = samples / (time.perf_counter() - start)
        if result is not None:
            after = self.counters()
            result["requests"], result["bytes"] = after[0] - before[0], after[1] - before[1]
        return rate

    def row(self, name: str, order: str) -> dict[str, Any]:
        from readers.io import handles

        handles.close_all()
        slow = self.spec["storage"] == SLOW
        subset = self.spec["subset"] if slow and order == "shuffle=True" else None
        order, result = coldwarm.start_row(order, self.spec["packed_files"], self.data_files)
        if name == LOOSE:
            ds = self.loose
        elif order == "staged":
            cache = Path(self.spec["cache_dir"])
            shutil.rmtree(cache, ignore_errors=True)
            t = time.perf_counter()
            ds = self.dataset(name, cache_dir=cache)
            result["copy_s"] = time.perf_counter() - t
            order = "shuffle=True"
        else:
            ds = self.dataset(name)
        result["samples_per_s"] = self.epoch(self.loader(ds, order, subset), result)
        result["subset"] = subset
        return result

    def load_blobs(self) -> None:
        """The stored bytes in RAM for the decode bound (read before joining the throttle)."""
        ds = self.dataset(next(iter(self.spec["packed"])), decode="bytes")
        self.blobs = [ds.read_bytes(i) for i in range(len(ds))]

    def decode_bound(self) -> float:
        return self.epoch(self.loader(InMemory(self.blobs), "shuffle=False", None))

    def rows(self) -> list[tuple[str, str]]:
        if self.spec.get("cold_vs_warm"):
            return coldwarm.rows(self.spec["packed"])
        rows = [(LOOSE, "shuffle=False"), (LOOSE, "shuffle=True")]
        for fmt in self.spec["packed"]:
            rows += [(fmt, o) for o in ORDERS]
        return rows

    def run(self) -> list[dict[str, Any]]:
        rows = self.rows()
        cold_vs_warm = bool(self.spec.get("cold_vs_warm"))
        results: dict[tuple[str, str], list[dict[str, Any]]] = {r: [] for r in rows}
        bound: list[float] = []
        self.load_blobs()
        pinned = pagecache.Pinned(pagecache.mapped_files(exclude=self.data_files))
        benchlib.eprint(f"  libraries held in memory: {pinned.locked / 2**20:,.0f} MiB")
        self.throttle.join()
        for run in range(self.spec["runs"]):
            for name, order in rows:
                results[(name, order)].append(self.row(name, order))
                r = results[(name, order)][-1]
                if order == "chunked sampler" and not cold_vs_warm:  # paired: just after
                    r["bound"] = self.decode_bound()
                    bound.append(r["bound"])
                benchlib.eprint(
                    f"  {self.spec['storage']} run {run + 1}: {name:9} {order:15} "
                    f"{r['samples_per_s']:8,.0f} samples/s"
                    + (f" (decode bound just after: {r['bound']:,.0f}/s)" if "bound" in r else "")
                )
        pinned.close()
        out: list[dict[str, Any]] = [
            {"name": n, "order": o, "runs": rs} for (n, o), rs in results.items()
        ]
        if bound:
            out.append(
                {"name": BOUND, "order": "shuffle=False, after each chunked row", "runs": bound}
            )
        return out


# --------------------------------------------------------------------------- parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--subset",
        type=int,
        default=20,
        help="batches of a random order read per run on the emulated hard disk",
    )
    parser.add_argument("--images", type=int, default=None, help="at most this many icons")
    parser.add_argument("--no-slow-disk", action="store_true")
    coldwarm.add_arguments(parser)
    benchlib.add_output_arguments(parser, "bench_read")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_spec = json.loads(args.child[0].read_text())
        args.child[1].write_text(json.dumps(Child(child_spec).run()))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as name:
        tmp = Path(name)
        n, what = benchlib.icon_tree(tmp / "src", limit=args.images)
        packed = benchlib.build_all(tmp / "src", tmp)
        disk = benchlib.whole_disk(tmp)
        if disk is None:
            sys.exit(f"{tmp} is not on a block device; set BENCH_TMP to a directory on a disk")
        record = {}
        for fmt, path in packed.items():
            files = [f for f in benchlib.files_under(path) if not f.endswith((".json", ".jsonl"))]
            record[fmt] = max(os.path.getsize(f) for f in files) / n  # the shard file
        spec: dict[str, Any] = {
            "src": str(tmp / "src"),
            "packed": {f: str(p) for f, p in packed.items()},
            "packed_files": [f for p in packed.values() for f in benchlib.files_under(p)],
            "workers": args.workers,
            "runs": args.runs,
            "subset": args.subset,
            "disk": disk[0],
            "cache_dir": tempfile.mkdtemp(prefix="packer-bench-stage-", dir="/dev/shm"),
            "record_bytes": record,
            "cold_vs_warm": args.cold_vs_warm,
            "disk_bps": args.disk_mibps << 20,
        }
        storages: list[tuple[str, benchlib.Throttle | None]] = []
        if not args.no_fast_disk:
            storages.append((FAST, None))
        throttle = None
        if not args.no_slow_disk:
            throttle = benchlib.Throttle(tmp, bps=args.disk_mibps << 20, iops=args.disk_iops)
        if throttle is not None and throttle.group is not None:
            storages.append((SLOW, throttle))
        res, notes = {}, {}
        try:
            for storage, th in storages:
                sub = {
                    **spec,
                    "storage": storage,
                    "cgroup": str(th.group) if th is not None else "",
                }
                res[storage] = summary(benchlib.run_child(Path(__file__), sub, tmp))
                notes[storage] = (
                    f"Requests: {'this run' if th else 'the whole disk'}'s reads "
                    f"/ I/Os ({th.why if th else 'data evicted before each row'})."
                )
        finally:
            if throttle is not None:
                throttle.remove()
            shutil.rmtree(spec["cache_dir"], ignore_errors=True)
    header = (
        f"### Read speed: {what}, batch {BATCH}, num_workers={args.workers}, median of "
        f"{args.runs} runs (ratios: median of the ratios within each run); {os.cpu_count()} "
        f"CPUs, {time.perf_counter() - started:.0f} s in all"
    )
    if args.cold_vs_warm:
        text = coldwarm.text(header, res, notes)
    else:
        parts = [header] + [storage_table(s, res[s], notes[s]) for s in res]
        text = "\n\n".join([*parts, "#### Targets", targets(res, spec)])
    reclaim = pagecache.proactive_reclaim()
    if reclaim:
        text += f"\n\n{reclaim}: it evicts read-ahead pages before they are read, at times."
    if throttle is not None and throttle.group is None:
        text += f"\n\nEmulated hard disk skipped: {throttle.why}."
    print(text)
    benchlib.save_results(
        args, "bench_read_coldwarm" if args.cold_vs_warm else "bench_read", text + "\n"
    )


if __name__ == "__main__":
    main()
