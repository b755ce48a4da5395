"""Writer speed: ``packer.Writer`` fed image bytes from Python vs ``packer build`` of the files.

The oxygen icon theme's PNGs (/usr/share/icons/oxygen, every size, ~8,800 files; the demo
shapes where it is not installed) are copied into a class-folder tree (one folder per icon
size), so both sides pack the same files with the same labels from a warm page cache:
- ``packer build TREE OUT --workers W`` (the console command);
- a Python script that reads each file of the tree in path order and hands its bytes to
  ``Writer.add(data, label, path=rel)`` (W = 1), or to ``Writer.add_many`` with ``workers=W``.
Both run as processes of their own (start-up and imports counted for both), interleaved, the
median of ``--runs`` (3) each; both decode-check every image. Target: the writer's images/s
>= 0.9x the build's. CPU seconds (user + system, every process) are printed too, which the
load of other work on the machine changes far less than wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

ROOT = Path(__file__).resolve().parent.parent
ICONS = Path("/usr/share/icons/oxygen")

WRITER = """
import sys
from pathlib import Path
import packer

src, out, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
classes = sorted(p.name for p in src.iterdir() if p.is_dir())

def samples():
    for label, name in enumerate(classes):
        for path in sorted((src / name).iterdir()):
            yield path.read_bytes(), label, f"{name}/{path.name}"

with packer.Writer(out, classes=classes, workers=workers, log=lambda m: None) as w:
    if workers > 1:
        ids = w.add_many(samples())
    else:
        ids = [w.add(data, label, path=rel) for data, label, rel in samples()]
print(sum(i is not None for i in ids))
"""


def copy_icons(dst: Path, limit: int | None) -> tuple[int, str]:
    """The icons' PNG files under ``dst/<size>/<category>_<name>.png``; (count, description)."""
    icons = sorted(p for p in ICONS.rglob("*.png") if p.is_file()) if ICONS.is_dir() else []
    if not icons:
        return benchlib.icon_tree(dst, limit=limit)
    n = 0
    for path in icons[:limit]:
        size = path.relative_to(ICONS).parts[1]  # base/<size>/<category>/<name>.png
        folder = dst / size
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{path.parent.name}_{path.name}"
        if not target.exists():
            shutil.copyfile(path, target)
            n += 1
    total = sum(p.stat().st_size for p in dst.rglob("*.png"))
    return n, f"{n:,} oxygen icon PNGs as they are ({total / 1e6:.1f} MB, every size)"


def timed(cmd: list[str], out: Path) -> tuple[float, float, str]:
    """Run `cmd` (which writes `out`); its wall seconds, CPU seconds and stdout."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="pack only this many icons")
    parser.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), help="W of the parallel pair"
    )
    benchlib.add_output_arguments(parser, "bench_writer")
    args = parser.parse_args()
    base = os.environ.get("BENCH_TMP") or None
    with tempfile.TemporaryDirectory(prefix="bench-writer-", dir=base) as tmp:
        tree, out = Path(tmp) / "icons", Path(tmp) / "out.lmdb"
        count, what = copy_icons(tree, args.limit)
        packer_cmd = [str(Path(sys.executable).with_name("packer"))]
        if not Path(packer_cmd[0]).exists():
            packer_cmd = [sys.executable, "-m", "packer.cli"]
        cases: dict[str, list[str]] = {}
        for workers in sorted({1, args.workers}):
            cases[f"packer build --workers {workers}"] = [
                *packer_cmd, "build", str(tree), str(out), "--workers", str(workers),
                "--no-progress",
            ]  # fmt: skip
            how = "add" if workers == 1 else f"add_many, workers={workers}"
            cases[f"Writer ({how})"] = [
                sys.executable, "-c", WRITER, str(tree), str(out), str(workers)
            ]  # fmt: skip
        walls: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        timed(cases[next(iter(cases))], out)  # warm: the page cache, the bytecode
        packed = 0
        for run in range(args.runs):
            for name, cmd in cases.items():
                wall, cpu, said = timed(cmd, out)
                if name.startswith("Writer"):
                    packed = int(said)
                walls[name].append(wall)
                cpus[name].append(cpu)
                benchlib.eprint(f"run {run + 1}: {name}: {wall:.2f} s, {cpu:.2f} s CPU")
    lines = [
        f"### Writer vs packer build: {what}, warm cache, median of {args.runs}",
        "",
        "| method | seconds | images/s | Writer / build | CPU s |",
        "|---|---|---|---|---|",
    ]
    names = list(cases)
    for i in range(0, len(names), 2):
        build_s = benchlib.median(walls[names[i]])
        for name in names[i : i + 2]:
            seconds = benchlib.median(walls[name])
            share = "" if name.startswith("packer") else benchlib.ratio(build_s / seconds)
            lines.append(
                f"| {name} | {seconds:.2f} | {packed / seconds:,.0f} | {share} | "
                f"{benchlib.median(cpus[name]):.2f} |"
            )
    lines += ["", f"{packed:,} of {count:,} files packed by each."]
    text = "\n".join(lines) + "\n"
    print(text)
    benchlib.save_results(args, "bench_writer", text)


if __name__ == "__main__":
    main()
