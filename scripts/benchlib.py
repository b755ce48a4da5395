"""Shared pieces of the read benchmarks (bench_read.py, bench_readahead.py): the test images,
packing them in every registered format, the emulated hard disk (a blkio cgroup v1 throttle)
and the disk's request counters; the page cache is `pagecache`'s."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CGROUP_ROOT = Path("/sys/fs/cgroup/blkio")
SLOW_BPS = 100 * 2**20
SLOW_IOPS = 300
ICONS = Path("/usr/share/icons/oxygen")
"""Debian's oxygen-icon-theme: 8,813 real PNG icons (``apt-get install oxygen-icon-theme``)."""


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def icon_tree(dst: Path, *, size: int = 64, limit: int | None = None) -> tuple[int, str]:
    """Write the oxygen icons resized to `size` x `size` PNG under ``dst/<category>/``; when the
    theme is not installed, the demo shapes instead. Returns (count, what was written)."""
    import cv2

    icons = sorted(ICONS.rglob("*.png")) if ICONS.is_dir() else []
    if not icons:
        sys.path.insert(0, str(ROOT / "scripts"))
        from make_demo_data import CLASSES, write_demo

        n = write_demo(dst, per_class=-(-(limit or 10_000) // len(CLASSES)), size=size, seed=0)
        return n, f"{n:,} demo images {size}x{size} (oxygen-icon-theme is not installed)"
    n = 0
    for path in icons[:limit]:
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if image is None:
            continue
        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
        folder = dst / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{path.parent.parent.name}_{path.stem}.png"), image)
        n += 1
    return n, f"{n:,} oxygen icons resized to {size}x{size} PNG"


def formats() -> dict[str, str]:
    """Every registered format -> its dataset class name (``readers.formats.REGISTRY``)."""
    from readers.formats import REGISTRY

    return {name: fmt.dataset_name for name, fmt in REGISTRY.items()}


def build_all(src: Path, tmp: Path) -> dict[str, Path]:
    """``packer build`` of `src` in every registered format: format -> OUT."""
    from packer.build import build
    from packer.config import BuildConfig, usable_cores

    out = {}
    for fmt in formats():
        path = tmp / f"data.{fmt}"
        t = time.perf_counter()
        summary = build(
            BuildConfig(src=src, out=path, format=fmt, workers=usable_cores(), progress=False),
            log=lambda _m: None,
        )
        eprint(f"{summary.line()} ({time.perf_counter() - t:.1f} s)")
        out[fmt] = path
    os.sync()
    return out


def files_under(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- disks


def whole_disk(path: Path) -> tuple[str, str] | None:
    """``(name, "MAJ:MIN")`` of the whole disk holding `path`, or None (tmpfs, overlay)."""
    from packer.bench.system import whole_disk as disk_of_device

    return disk_of_device(os.stat(path).st_dev)


def disk_reads(name: str) -> tuple[int, int]:
    """(read requests completed, bytes read) of disk `name` since boot (/sys/block/NAME/stat):
    every process's reads, merged requests as the disk saw them."""
    fields = (Path("/sys/block") / name / "stat").read_text().split()
    return int(fields[0]), int(fields[2]) * 512


class Throttle:
    """An emulated hard disk: a blkio cgroup v1 throttling reads of the disk holding `data`
    to `bps` bytes/s and `iops` requests/s (needs root). ``group`` is None, and ``why``
    says why, when it cannot be made."""

    def __init__(self, data: Path, *, bps: int = SLOW_BPS, iops: int = SLOW_IOPS) -> None:
        self.group: Path | None = None
        self.disk = whole_disk(data)
        if os.geteuid() != 0:
            self.why = "not root (a blkio cgroup needs root)"
        elif not (CGROUP_ROOT / "blkio.throttle.read_bps_device").exists():
            self.why = f"no cgroup v1 blkio controller at {CGROUP_ROOT}"
        elif self.disk is None:
            self.why = f"{data} is not on a block device; set BENCH_TMP to a directory on a disk"
        else:
            name, dev = self.disk
            group = CGROUP_ROOT / f"packer-bench-{os.getpid()}"
            try:
                group.mkdir(exist_ok=True)
                (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {bps}")
                (group / "blkio.throttle.read_iops_device").write_text(f"{dev} {iops}")
                self.group = group
                self.why = f"{name} ({dev}) throttled to {bps >> 20} MiB/s and {iops} IOPS"
            except OSError as exc:
                self.why = f"cannot set a blkio throttle on {name} ({dev}): {exc}"
                self.remove(group)

    @classmethod
    def of(cls, group: str | None) -> Throttle:
        """The throttle of an existing cgroup (in a child process), or none for a false `group`."""
        self = cls.__new__(cls)
        self.group = Path(group) if group else None
        self.disk, self.why = None, ""
        return self

    def join(self) -> None:
        """Move the calling process into the cgroup (its children follow)."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def reads(self) -> tuple[int, int]:
        """(bytes, I/Os) read through the throttle so far (bios as submitted, before merging)."""
        if self.group is None:
            return 0, 0
        totals = []
        for name in ("blkio.throttle.io_service_bytes", "blkio.throttle.io_serviced"):
            total = 0
            for line in (self.group / name).read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] == "Read":
                    total += int(parts[2])
            totals.append(total)
        return totals[0], totals[1]

    def remove(self, group: Path | None = None) -> None:
        group = group or self.group
        if group is None:
            return
        with contextlib.suppress(OSError):  # a process that joined it leaves first
            if str(os.getpid()) in (group / "cgroup.procs").read_text().split():
                (CGROUP_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):
            try:
                group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # the child's workers may still be exiting
        eprint(f"could not remove the cgroup {group}; remove it with rmdir")


def run_child(script: Path, spec: dict[str, Any], tmp: Path) -> Any:
    """Run ``script --child SPEC RESULT`` in a fresh process and return the JSON it wrote to
    RESULT (a child joins a throttle's cgroup itself, after its imports: `Throttle.of`)."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    spec_path, result_path = tmp / f"spec-{tag}.json", tmp / f"result-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, str(script), "--child", str(spec_path), str(result_path)],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(result_path.read_text())


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(x: float | None, *, pct: bool = False, digits: int = 0) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}%}" if pct else f"{x:.2f}x"


# --------------------------------------------------------------------------- results


def add_output_arguments(parser: Any, name: str) -> None:
    """``--out DIR`` (write DIR/NAME.md) and ``--docs PAGE`` (replace NAME's section there)."""
    parser.add_argument("--out", type=Path, default=None, help=f"write {name}.md into this folder")
    parser.add_argument(
        "--docs",
        type=Path,
        default=None,
        help=f"replace the {name} section of this page (make bench: docs/benchmarks.md)",
    )


def save_results(args: Any, name: str, text: str) -> None:
    """Write `text` where ``--out`` and ``--docs`` say (see `add_output_arguments`)."""
    import benchdocs

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.md").write_text(text.rstrip() + "\n")
    if args.docs is not None:
        benchdocs.publish(args.docs, name, text)
