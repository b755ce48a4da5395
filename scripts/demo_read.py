"""Read a packed dataset and the same loose files through paddle.io.DataLoader, timed fairly,
and say where packing pays and where it does not.

Fair: every timing runs in a fresh process (a process's first DataLoader pays start-up costs
that its later ones do not), the two sources alternate within each round, and each figure is
the median of ``--rounds`` rounds. Both sources decode with OpenCV to RGB, in a shuffled order
(loose files: ``shuffle=True``; packed: ``ChunkShuffleBatchSampler``), ``--workers`` workers,
batch 64, timed from the first batch (worker start-up left out). The rows:

- warm: the source's files read into the page cache just before (loose files' best case),
  three epochs per timing;
- cold: the data's pages (both sources') evicted first (``pagecache.make_cold``, checked
  with ``mincore``); the files' metadata stays cached;
- emulated hard disk: cold, and the disk throttled to 100 MiB/s and 300 IOPS (a blkio cgroup,
  ``benchlib.Throttle``: root only; the row says why when it is skipped), ``--slow-batches``
  batches of the order;
- training step: a simulated step of ``--step-ms`` ms per batch (a sleep, the same for both),
  on the slowest storage above; the share of the run spent waiting for the next batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
import coldwarm
import pagecache

BATCH = 64
WARM_EPOCHS = 3
"""Epochs per warm timing (a cold one is one epoch: the second would be warm)."""
NOISY = 1.5
"""A row whose largest per-round ratio exceeds its smallest this many times is called noisy."""
SOURCES = ("packed", "loose")
WARM, COLD, SLOW = "warm", "cold", "on an emulated HDD"


# --------------------------------------------------------------------------- child: one timing


def loose_files(root: Path) -> Any:
    """The baseline: one file open and decode per sample, the same OpenCV decode."""
    import cv2
    import numpy as np
    import paddle

    class LooseFiles(paddle.io.Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            classes = sorted(p.name for p in root.iterdir() if p.is_dir())
            self.items = [
                (str(p), i) for i, c in enumerate(classes) for p in sorted((root / c).iterdir())
            ]

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int) -> tuple[Any, int]:
            path, label = self.items[i]
            image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
            return cv2.cvtColor(image, cv2.COLOR_BGR2RGB), label

    return LooseFiles()


class FirstBatches:
    """The first `n` batches of a batch sampler, drawn lazily (the sampler's read-ahead hints
    are given as the loader reaches each chunk, not all at once before the data is evicted)."""

    def __init__(self, batches: Any, n: int) -> None:
        self.batches, self.n = batches, min(n, len(batches))

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return itertools.islice(iter(self.batches), self.n)


class Epochs:
    """`n` epochs of a batch sampler as one pass (a warm pass of one epoch lasts a fraction of a
    second, and a busy moment of the machine would decide it)."""

    def __init__(self, batches: Any, n: int) -> None:
        self.batches, self.n = batches, n

    def __len__(self) -> int:
        return self.n * len(self.batches)

    def __iter__(self) -> Any:
        for epoch in range(self.n):
            if hasattr(self.batches, "set_epoch"):
                self.batches.set_epoch(epoch + 1)
            yield from self.batches


def time_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Read one source under one condition in this fresh process; samples, seconds, waits."""
    warnings.filterwarnings("ignore")
    import numpy as np
    import paddle

    from readers import ChunkShuffleBatchSampler, LmdbDataset

    paddle.set_device("cpu")
    packed, loose = Path(spec["packed"]), Path(spec["loose"])
    if spec["source"] == "packed":
        ds: Any = LmdbDataset(packed)
        batches: Any = ChunkShuffleBatchSampler(ds, batch_size=BATCH, rank=0, world_size=1)
        batches.set_epoch(spec["round"])
    else:
        ds = loose_files(loose)
        ids = np.random.default_rng(spec["round"]).permutation(len(ds)).tolist()
        batches = [ids[s : s + BATCH] for s in range(0, len(ids), BATCH)]
    if spec["batches"]:
        batches = FirstBatches(batches, spec["batches"])
    if spec["condition"] == WARM:
        batches = Epochs(batches, WARM_EPOCHS)
    result: dict[str, Any] = {"cached": 0.0}
    if spec["condition"] == WARM:
        own = packed if spec["source"] == "packed" else loose
        files = [f for f in benchlib.files_under(own) if not f.endswith((".json", ".jsonl"))]
        coldwarm.make_warm(files)
    else:
        data = benchlib.files_under(packed) + benchlib.files_under(loose)
        result["cached"] = pagecache.make_cold(data)
    benchlib.Throttle.of(spec["cgroup"]).join()  # workers inherit it
    loader = paddle.io.DataLoader(ds, batch_sampler=batches, num_workers=spec["workers"])
    step = spec["step_ms"] / 1000
    it = iter(loader)
    next(it)  # worker start-up and the first batch left out
    samples, waited = 0, 0.0
    start = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            images, _labels = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - asked
        samples += images.shape[0]
        if step:
            time.sleep(step)  # the training step, the same for both sources
    result.update(samples=samples, seconds=time.perf_counter() - start, waited=waited)
    return result


# --------------------------------------------------------------------------- parent


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"a timing failed ({spec['source']}, {spec['condition']}):\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def describe(packed: Path) -> tuple[str, str]:
    """The packed dataset's first sample, read in this process (its handle closed after), and
    its size ("64x64")."""
    warnings.filterwarnings("ignore")
    from readers import LmdbDataset
    from readers.io import handles

    ds = LmdbDataset(packed)
    image, label = ds[0]
    line = f"LmdbDataset: {len(ds)} samples; sample 0: {image.shape} {image.dtype}, label {label}"
    handles.close_all()  # unmapped, so that its pages can be evicted
    return line, "x".join(map(str, image.shape[:2]))


def measure(args: argparse.Namespace, conditions: list[tuple[str, str, int]]) -> dict[Any, Any]:
    """Every (row, source) over the rounds, sources alternating: row -> source -> results."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in range(args.rounds):
        for row, cgroup, step_ms in conditions:
            order = SOURCES if r % 2 == 0 else SOURCES[::-1]
            for source in order:
                spec = {
                    "source": source,
                    "packed": str(args.packed),
                    "loose": str(args.loose),
                    "condition": WARM if row == WARM else COLD,
                    "cgroup": cgroup,
                    "batches": args.slow_batches if cgroup else 0,
                    "step_ms": step_ms,
                    "workers": args.workers,
                    "round": r + 1,
                }
                out.setdefault(row, {}).setdefault(source, []).append(run_child(spec))
    return out


def rate(results: list[dict[str, Any]]) -> float:
    return statistics.median(x["samples"] / x["seconds"] for x in results)


def waiting(results: list[dict[str, Any]]) -> float:
    return statistics.median(x["waited"] / x["seconds"] for x in results)


WHY = {
    WARM: "every read comes from memory, so the time is decoding {size} images, the same work "
    "for both: packing saves disk reads, and here there are none to save",
    COLD: "this disk serves small random reads fast, and only the data's pages were evicted "
    "(the files' metadata stays cached), so a file per sample costs little more",
    SLOW: "the loader kept up even on the emulated hard disk: decoding, not reading, set the pace",
}


def report(args: argparse.Namespace, res: dict[Any, Any], step_row: str, skipped: str) -> None:
    print(
        f"DataLoader(batch {BATCH}, num_workers={args.workers}) on {os.cpu_count()} cores, "
        f"shuffled; median of {args.rounds} rounds, each timing in a fresh process, the sources "
        "alternating"
    )
    print(f"  {'samples/s':22}{'packed':>9}{'loose':>9}{'packed/loose':>14}   (per round)")
    ratios, why, noisy = {}, [], []
    for row, by in res.items():
        if row == "step":
            continue
        p, loose = rate(by["packed"]), rate(by["loose"])
        rounds = [rate([a]) / rate([b]) for a, b in zip(by["packed"], by["loose"], strict=True)]
        ratios[row] = statistics.median(rounds)  # paired within a round: the machine's drift
        each = " ".join(f"{x:.2f}" for x in rounds)
        print(f"  {row:22}{p:9,.0f}{loose:9,.0f}{ratios[row]:13.2f}x   ({each})")
        if ratios[row] < 1.1:
            why.append(f"  {row}, no gain: {WHY[row].format(size=args.size)}")
        if max(rounds) > NOISY * min(rounds):
            noisy.append(row)
            why.append(
                f"  {row}: the rounds disagree ({min(rounds):.2f}x to {max(rounds):.2f}x), so "
                "something else ran on this machine; the median is a rough figure (--rounds 5)"
            )
    if skipped:
        print(f"  {SLOW:22}skipped: {skipped}")
    else:
        print(f"  (emulated HDD: {args.throttled}, the first {args.slow_batches} batches)")
    cold = [x["cached"] for row, by in res.items() if row != WARM for rs in by.values() for x in rs]
    print(f"  (cold rows: at most {max(cold):.2%} of the data still cached when a timing started)")
    print("\n".join(why)) if why else None
    by = res["step"]
    wp, wl = waiting(by["packed"]), waiting(by["loose"])
    print(
        f"Training job, {args.step_ms} ms step per batch ({step_row}): waiting for data "
        f"{wp:.0%} of the time packed, {wl:.0%} with loose files"
    )
    print(headline(ratios, wp, wl, step_row, noisy))


def headline(
    ratios: dict[str, float], wp: float, wl: float, step_row: str, noisy: Sequence[str] = ()
) -> str:
    """One line that claims only what the rows above show, losses included; `noisy` rows
    (their rounds disagree) are marked."""
    mark = {row: " (noisy)" if row in noisy else "" for row in ratios}
    wins = [f"{r:.1f}x {row}{mark[row]}" for row, r in ratios.items() if r >= 1.1]
    rest = [f"{row} {r:.2f}x{mark[row]}" for row, r in ratios.items() if r < 1.1]
    parts = ["packed reads ran " + ", ".join(wins) + " as fast as loose files"] if wins else []
    if wl - wp >= 0.05:
        parts.append(f"a training step waited for data {wp:.0%} of the time, not {wl:.0%}")
    elif wp - wl >= 0.05:
        parts.append(f"a training step waited longer packed ({wp:.0%}) than loose ({wl:.0%})")
    elif wl < 0.05:
        parts.append(f"both kept a training job fed ({step_row})")
    else:
        parts.append(f"a training step waited as long either way ({wp:.0%}, {wl:.0%})")
    if rest:
        parts.append("no gain " + ", ".join(rest) + " (why: above)")
    return "Result: " + "; ".join(parts) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packed", type=Path, nargs="?")
    parser.add_argument("loose", type=Path, nargs="?")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="timings per figure (median)")
    parser.add_argument("--step-ms", type=int, default=20, help="the simulated training step")
    parser.add_argument(
        "--slow-batches", type=int, default=10, help="batches read on the emulated hard disk"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(time_one(json.loads(args.child))))
        return
    if args.packed is None or args.loose is None:
        parser.error("give the packed dataset and the folder of loose files")
    line, args.size = describe(args.packed)
    print(line)
    throttle = benchlib.Throttle(args.packed)
    try:
        conditions = [(WARM, "", 0), (COLD, "", 0)]
        if throttle.group is not None:
            conditions.append((SLOW, str(throttle.group), 0))
        slowest = conditions[-1]
        conditions.append(("step", slowest[1], args.step_ms))
        started = time.perf_counter()
        res = measure(args, conditions)
    finally:
        throttle.remove()
    skipped = "" if throttle.group is not None else throttle.why
    args.throttled = throttle.why
    step_row = slowest[0] + (f", {args.slow_batches} batches" if slowest[1] else "")
    report(args, res, step_row, skipped)
    print(f"({time.perf_counter() - started:.0f} s of timings)")


if __name__ == "__main__":
    main()
