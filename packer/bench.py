"""``packer bench``: DataLoader throughput of a packed dataset for each num_workers, the setting
to use, and the warnings (shared memory, slow storage, oversubscribed cores) that explain it.

paddle is imported only when a measurement runs, so the storage helpers here stay cheap to
import (``scripts/bench_read.py`` uses them too).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.config import usable_cores
from packer.errors import ConfigError
from readers.decode import check_mode, decode_image

TRANSFORMS = ("none", "resize224", "imagenet")
"""Transform presets: ``none`` (the decoded HWC uint8 image), ``resize224`` (HWC uint8 resized
to 224x224), ``imagenet`` (shorter side 256, centre crop 224, CHW float32 normalised)."""

DEFAULT_SECONDS = 3.0
NEAR_BEST = 0.95
"""The recommended setting is the smallest num_workers within this share of the best."""

NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs",
     "beegfs", "afs", "davfs", "sshfs", "virtiofs", "fuse"}
)  # fmt: skip


# --------------------------------------------------------------------------- transforms


class Resize:
    """Resize an HWC image to ``size x size`` (OpenCV, bilinear)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: np.ndarray) -> np.ndarray:
        import cv2

        out = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        return out if out.ndim == 3 else out[:, :, np.newaxis]


class ImagenetEval:
    """Shorter side to 256, centre crop 224, CHW float32 normalised with the ImageNet stats."""

    MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
    STD = np.array([0.229, 0.224, 0.225], np.float32) * 255

    def __call__(self, image: np.ndarray) -> np.ndarray:
        import cv2

        h, w = image.shape[:2]
        scale = 256 / min(h, w)
        nh, nw = max(224, round(h * scale)), max(224, round(w * scale))
        image = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
        if image.ndim == 2:
            image = image[:, :, np.newaxis]
        top, left = (nh - 224) // 2, (nw - 224) // 2
        crop = image[top : top + 224, left : left + 224].astype(np.float32)
        if crop.shape[2] == 3:
            crop = (crop - self.MEAN) / self.STD
        else:
            crop = (crop - self.MEAN.mean()) / self.STD.mean()
        return np.ascontiguousarray(crop.transpose(2, 0, 1))


def make_transform(name: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The transform preset `name` (one of :data:`TRANSFORMS`)."""
    if name == "none":
        return None
    if name == "resize224":
        return Resize(224)
    if name == "imagenet":
        return ImagenetEval()
    raise ConfigError(f"--transform {name!r}: expected one of {', '.join(TRANSFORMS)}")


def collate(batch: list[tuple[Any, Any]]) -> list[Any]:
    """Stack images of one shape into one array; keep a list when shapes differ (or bytes).

    Labels become an int64 array when they are all ints, else stay a list.
    """
    images = [s[0] for s in batch]
    labels = [s[1] for s in batch]
    first = images[0]
    out_images: Any = images
    if isinstance(first, np.ndarray) and all(
        isinstance(x, np.ndarray) and x.shape == first.shape and x.dtype == first.dtype
        for x in images
    ):
        out_images = np.stack(images)
    out_labels: Any = labels
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        out_labels = np.asarray(labels, dtype=np.int64)
    return [out_images, out_labels]


def batch_len(batch: Any) -> int:
    """Samples in a collated batch ``[images, labels]``."""
    images = batch[0] if isinstance(batch, list | tuple) else batch
    shape = getattr(images, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    return len(images)


def nbytes_of(obj: Any) -> int:
    """Bytes of the arrays, tensors and bytes in a (nested) batch."""
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, list | tuple):
        return sum(nbytes_of(x) for x in obj)
    if isinstance(obj, dict):
        return sum(nbytes_of(x) for x in obj.values())
    shape, size = getattr(obj, "shape", None), getattr(obj, "element_size", None)
    if shape is not None and callable(size):
        return int(math.prod(int(d) for d in shape)) * int(size())
    return 0


# --------------------------------------------------------------------------- loose files


class LooseFilesDataset:
    """The baseline for ``--compare``: the packed dataset's source files read one by one.

    Sample ``i`` is the file the packed dataset's index names for sample ``i``, with its label,
    decoded the same way (``readers.decode``) and given the same transform.
    """

    def __init__(
        self,
        src: Path,
        paths: Any,
        labels: Any,
        *,
        decode: str = "rgb",
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.src = src
        self.paths = paths  # an Arrow string array: compact, shared by forked workers
        self.labels = labels
        self.decode = decode
        self.transform = transform

    @classmethod
    def for_packed(
        cls,
        packed: Path,
        src: Path,
        *,
        decode: str = "rgb",
        transform: Callable[[Any], Any] | None = None,
    ) -> LooseFilesDataset:
        """The files under `src` that the packed dataset at `packed` was built from."""
        from readers.errors import ReaderError
        from readers.index import load_index

        try:
            index = load_index(packed, extra=("path",))
        except ReaderError as exc:
            raise ConfigError(
                f"--compare needs a dataset written by packer build, whose index names the "
                f"source files ({exc})"
            ) from None
        paths = index.extra.get("path")
        if paths is None or not len(paths):
            raise ConfigError(f"--compare: {packed} has no source paths in its index")
        first = src / str(paths[0].as_py())
        if not first.is_file():
            raise ConfigError(
                f"--compare {src}: {first} does not exist; SRC must be the directory the "
                f"dataset was built from (meta.json says {index.meta.get('source')!r})"
            )
        return cls(src, paths, index.labels, decode=decode, transform=transform)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        path = os.path.join(self.src, str(self.paths[i].as_py()))
        with open(path, "rb") as f:
            data = f.read()
        image: Any = data if self.decode == "bytes" else decode_image(data, self.decode)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]


# --------------------------------------------------------------------------- system checks


@dataclass(frozen=True)
class Storage:
    """Where a path lives: its mount and, for a block device, the whole disk behind it."""

    mountpoint: str
    fstype: str
    source: str
    disk: str | None = None  # e.g. "vda", "nvme0n1": the whole disk, not the partition
    disk_dev: str | None = None  # "MAJ:MIN" of the whole disk
    rotational: bool | None = None

    @property
    def network(self) -> bool:
        fs = self.fstype
        return fs in NETWORK_FILESYSTEMS or (fs.startswith("fuse.") and fs != "fuseblk")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def whole_disk(dev: int) -> tuple[str, str] | None:
    """``(name, "MAJ:MIN")`` of the whole disk holding device number `dev`, or None when the
    device is not a block device (tmpfs, overlay, ...)."""
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sys_dev.exists():
        return None
    node = sys_dev.resolve()
    if (node / "partition").exists():
        node = node.parent
    try:
        return node.name, (node / "dev").read_text().strip()
    except OSError:
        return None


def storage_of(path: str | os.PathLike[str]) -> Storage | None:
    """The mount, filesystem type and disk of `path` (Linux; None elsewhere)."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts, rest = left.split(), right.split()
                if len(parts) < 5 or len(rest) < 2:
                    continue
                mnt = _unescape(parts[4])
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and (best is None or len(mnt) >= len(best[0])):
                    best = (mnt, rest[0], rest[1])
    except OSError:
        return None
    if best is None:
        return None
    disk = whole_disk(os.stat(real).st_dev)
    rotational = None
    if disk is not None:
        with contextlib.suppress(OSError, ValueError):
            flag = Path(f"/sys/block/{disk[0]}/queue/rotational").read_text().strip()
            rotational = flag == "1"
    return Storage(
        mountpoint=best[0],
        fstype=best[1],
        source=best[2],
        disk=disk[0] if disk else None,
        disk_dev=disk[1] if disk else None,
        rotational=rotational,
    )


def _mem_available() -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def tree_bytes(root: Path) -> int:
    """Total size of the files under `root` (or of `root` itself)."""
    if root.is_file():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def storage_warnings(path: Path, size: int) -> list[str]:
    """Warnings when the data at `path` sits on a network filesystem or a rotational disk."""
    where = storage_of(path)
    if where is None:
        return []
    mem = _mem_available()
    if mem is not None and size > 0.8 * mem:
        scope = (
            f"the dataset ({_gb(size)}) does not fit in the free memory ({_gb(mem)}), so every "
            "epoch reads it from there"
        )
    else:
        scope = "the first epoch (and any epoch after its pages leave the cache) reads from there"
    advice = "copy it to /dev/shm or a local SSD if you can"
    if where.network:
        return [
            f"{path} is on a network or userspace filesystem ({where.fstype} "
            f"{where.source}): {scope}; {advice}"
        ]
    if where.rotational:
        return [
            f"{path} is on {where.disk}, which reports itself as a rotational disk (a hard disk, "
            f"or a virtual disk that does not say otherwise): {scope}; {advice}"
        ]
    return []


def shm_free() -> int | None:
    """Free bytes in ``/dev/shm``, or None when there is none."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_warnings(
    *, shared_memory: bool, batch_bytes: int, workers: int, prefetch_factor: int
) -> list[str]:
    """Warnings when shared memory is off or ``/dev/shm`` cannot hold the batches in flight."""
    if workers == 0:
        return []
    if not shared_memory:
        return [
            "shared memory is off: every batch is pickled through a pipe; "
            "use DataLoader(use_shared_memory=True)"
        ]
    free = shm_free()
    if free is None:
        return [
            "/dev/shm is missing, so DataLoader(use_shared_memory=True) cannot work; mount a "
            "tmpfs there (docker: --shm-size=8g or --ipc=host)"
        ]
    # each worker keeps prefetch_factor batches in flight, and one more is being handed over
    need = batch_bytes * workers * (prefetch_factor + 1)
    if need > free:
        return [
            f"/dev/shm has {_gb(free)} free but {workers} workers x {prefetch_factor + 1} "
            f"batches of {_gb(batch_bytes)} need about {_gb(need)}: workers will fail with bus "
            "errors or stall; enlarge it (docker: --shm-size=8g or --ipc=host) or lower "
            "batch_size, num_workers or prefetch_factor"
        ]
    return []


def _clock_ticks() -> int:
    return int(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100


def cpu_seconds() -> float | None:
    """CPU seconds used by this process and its live children (the DataLoader workers).

    ``getrusage(RUSAGE_CHILDREN)`` counts only children that have exited, so live workers are
    read from ``/proc/<pid>/stat``. None where there is no ``/proc``.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    total = me.ru_utime + me.ru_stime
    pid, ticks = os.getpid(), _clock_ticks()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone, or not ours to read
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) > 12 and int(rest[1]) == pid:
            total += (int(rest[11]) + int(rest[12])) / ticks
    return total


# --------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class BenchConfig:
    """What ``packer bench`` measures.

    ``workers`` empty means ``0..usable cores``. A setting stops after ``batches`` batches or
    ``seconds`` seconds, whichever comes first; with neither, after :data:`DEFAULT_SECONDS`.
    """

    path: Path
    batch_size: int = 64
    workers: tuple[int, ...] = ()
    batches: int | None = None
    seconds: float | None = None
    warmup: int | None = None
    decode: str = "rgb"
    transform: str = "none"
    compare: Path | None = None
    shared_memory: bool = True
    prefetch_factor: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}: must be at least 1")
        if any(w < 0 for w in self.workers):
            raise ConfigError(f"--workers {self.workers}: must be >= 0")
        if self.batches is not None and self.batches < 1:
            raise ConfigError(f"--batches {self.batches}: must be at least 1")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigError(f"--seconds {self.seconds}: must be positive")
        if self.warmup is not None and self.warmup < 0:
            raise ConfigError(f"--warmup {self.warmup}: must be >= 0")
        if self.prefetch_factor < 1:
            raise ConfigError(f"--prefetch-factor {self.prefetch_factor}: must be at least 1")
        try:
            check_mode(self.decode)
        except ValueError as exc:
            raise ConfigError(f"--decode: {exc}") from None
        make_transform(self.transform)
        if self.decode == "bytes" and self.transform != "none":
            raise ConfigError("--decode bytes gives undecoded bytes: use --transform none")
        if self.compare is not None and not self.compare.is_dir():
            raise ConfigError(f"--compare {self.compare}: not a directory")

    @property
    def worker_counts(self) -> tuple[int, ...]:
        return self.workers or tuple(range(usable_cores() + 1))

    @property
    def limit_seconds(self) -> float | None:
        if self.seconds is None and self.batches is None:
            return DEFAULT_SECONDS
        return self.seconds

    def warmup_for(self, workers: int) -> int:
        """Batches thrown away first: enough for every worker to start and fill its queue."""
        if self.warmup is not None:
            return self.warmup
        return self.prefetch_factor * max(1, workers) + 1


@dataclass(frozen=True)
class BenchRow:
    """One measured setting."""

    source: str  # "packed" or "loose"
    num_workers: int
    batches: int
    samples: int
    seconds: float
    samples_per_s: float
    cpu_cores: float | None  # CPU seconds (process + workers) per wall second
    mean_wait_ms: float  # time inside next() per batch
    batch_bytes: int
    stacked: bool = True  # images came as one array (False: a list, they differ in size)


class EndlessBatches:
    """A batch sampler's epochs one after another, as one endless epoch.

    paddle's persistent DataLoader workers sleep 0.5 s at the start of every epoch
    (``_DataLoaderIterMultiProcess._reset``); one endless epoch times the steady state instead.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Iterator[list[int]]:
        epoch = 0
        while True:
            if hasattr(self.batch_sampler, "set_epoch"):
                self.batch_sampler.set_epoch(epoch)
            empty = True
            for batch in self.batch_sampler:
                empty = False
                yield batch
            if empty:
                return  # an empty dataset: the loader stops at once
            epoch += 1


EPOCH_RESTART_S = 0.5
"""What paddle's persistent workers sleep at the start of each epoch (paddle 2.6 to 3.3)."""


def _next(batches: Iterator[Any]) -> Any:
    try:
        return next(batches)
    except StopIteration:
        raise ConfigError("the dataset gives no batches: is it empty?") from None


def _shutdown(iterator: Any) -> None:
    """Stop a loader iterator's workers now rather than at garbage collection."""
    stop = getattr(iterator, "_try_shutdown_all", None)
    if callable(stop):
        with contextlib.suppress(Exception):
            stop()


def measure_loader(
    dataset: Any,
    batch_sampler: Any,
    *,
    num_workers: int,
    cfg: BenchConfig,
    source: str = "packed",
) -> BenchRow:
    """Run a real ``paddle.io.DataLoader`` over `dataset` and time it after warm-up."""
    import paddle

    # paddle's annotations want its own BatchSampler and collate types; any iterable works
    options: dict[str, Any] = {
        "batch_sampler": EndlessBatches(batch_sampler),
        "collate_fn": collate,
    }
    loader = paddle.io.DataLoader(
        dataset,
        num_workers=num_workers,
        use_shared_memory=cfg.shared_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=cfg.prefetch_factor,
        **options,
    )
    batches = iter(loader)
    clock = time.perf_counter
    try:
        batch_bytes, stacked = 0, True
        for _ in range(cfg.warmup_for(num_workers)):
            batch = _next(batches)
            batch_bytes = max(batch_bytes, nbytes_of(batch))
            stacked = stacked and _stacked(batch)
        limit_s, limit_n = cfg.limit_seconds, cfg.batches
        cpu0, start = cpu_seconds(), clock()
        wait, n, samples = 0.0, 0, 0
        while True:
            asked = clock()
            batch = _next(batches)
            got = clock()
            wait += got - asked
            n += 1
            samples += batch_len(batch)
            if not batch_bytes:
                batch_bytes = nbytes_of(batch)
                stacked = _stacked(batch)
            del batch
            if (limit_n is not None and n >= limit_n) or (
                limit_s is not None and got - start >= limit_s
            ):
                break
        wall = clock() - start
        cpu1 = cpu_seconds()
    finally:
        _shutdown(batches)
        del batches
    cpu = (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None and wall > 0 else None
    return BenchRow(
        source=source,
        num_workers=num_workers,
        batches=n,
        samples=samples,
        seconds=wall,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        cpu_cores=cpu,
        mean_wait_ms=1e3 * wait / n,
        batch_bytes=batch_bytes,
        stacked=stacked,
    )


def _stacked(batch: Any) -> bool:
    images = batch[0] if isinstance(batch, list | tuple) else batch
    return getattr(images, "shape", None) is not None


def recommend(rows: Sequence[BenchRow]) -> BenchRow:
    """The smallest num_workers whose samples/s is within :data:`NEAR_BEST` of the best."""
    best = max(r.samples_per_s for r in rows)
    return min(
        (r for r in rows if r.samples_per_s >= NEAR_BEST * best), key=lambda r: r.num_workers
    )


@dataclass
class BenchReport:
    """Everything ``packer bench`` found; :meth:`text` for people, :meth:`as_dict` for scripts."""

    dataset: str
    format: str
    num_samples: int
    dataset_bytes: int
    cores: int
    batch_size: int
    decode: str
    transform: str
    limit: str
    rows: list[BenchRow] = field(default_factory=list)
    compare: list[BenchRow] = field(default_factory=list)
    compare_src: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def recommended(self) -> BenchRow:
        return recommend(self.rows)

    def as_dict(self) -> dict[str, Any]:
        rec = self.recommended
        best = max(r.samples_per_s for r in self.rows)
        return {
            "dataset": self.dataset,
            "format": self.format,
            "num_samples": self.num_samples,
            "dataset_bytes": self.dataset_bytes,
            "cores": self.cores,
            "batch_size": self.batch_size,
            "decode": self.decode,
            "transform": self.transform,
            "limit": self.limit,
            "results": [asdict(r) for r in self.rows],
            "compare_src": self.compare_src,
            "compare": [asdict(r) for r in self.compare],
            "best_samples_per_s": best,
            "recommended_num_workers": rec.num_workers,
            "recommended_samples_per_s": rec.samples_per_s,
            "warnings": self.warnings,
            "notes": self.notes,
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def text(self) -> str:
        best = max(r.samples_per_s for r in self.rows)
        loose = {r.num_workers: r.samples_per_s for r in self.compare}
        lines = [
            f"{self.dataset}: {self.num_samples:,} samples ({self.format}, "
            f"{_gb(self.dataset_bytes)}), batch {self.batch_size}, decode {self.decode}, "
            f"transform {self.transform}; {self.limit} per setting, {self.cores} usable cores",
            "",
        ]
        header = ["source", "workers", "samples/s", "vs best", "CPU cores", "wait/batch"]
        if loose:
            header.append("vs loose")
        table = [header]
        for r in [*self.rows, *self.compare]:
            row = [
                r.source,
                str(r.num_workers),
                f"{r.samples_per_s:,.0f}",
                f"{r.samples_per_s / best:.0%}",
                "-" if r.cpu_cores is None else f"{r.cpu_cores:.2f}",
                f"{r.mean_wait_ms:.1f} ms",
            ]
            if loose:
                base = loose.get(r.num_workers)
                row.append(
                    f"{r.samples_per_s / base:.2f}x" if r.source == "packed" and base else ""
                )
            table.append(row)
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        rec = self.recommended
        lines += [
            "",
            f"use num_workers={rec.num_workers}: {rec.samples_per_s:,.0f} samples/s, the "
            f"smallest setting within {NEAR_BEST:.0%} of the best ({best:,.0f}/s)",
        ]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _describe_limit(cfg: BenchConfig) -> str:
    parts = []
    if cfg.limit_seconds is not None:
        parts.append(f"{cfg.limit_seconds:g} s")
    if cfg.batches is not None:
        parts.append(f"{cfg.batches} batches")
    return " or ".join(parts) + " after warm-up"


def run_bench(cfg: BenchConfig, *, log: Callable[[str], None] | None = None) -> BenchReport:
    """Measure the dataset at ``cfg.path`` (and ``cfg.compare``) for each num_workers.

    Raises:
        ConfigError: an option is unusable (see :class:`BenchConfig`), or ``--compare`` does
            not point at the dataset's source files.
        readers.errors.ReaderError: the dataset cannot be opened.
    """
    from readers.datasets import open_dataset
    from readers.samplers import ChunkShuffleBatchSampler

    say = log or (lambda _msg: None)
    transform = make_transform(cfg.transform)
    dataset = open_dataset(cfg.path, decode=cfg.decode, transform=transform)
    cores = usable_cores()
    index = getattr(dataset, "index", None)
    fmt = index.format if index is not None else getattr(dataset, "format", "?")
    report = BenchReport(
        dataset=str(cfg.path),
        format=fmt,
        num_samples=len(dataset),
        dataset_bytes=tree_bytes(cfg.path),
        cores=cores,
        batch_size=cfg.batch_size,
        decode=cfg.decode,
        transform=cfg.transform,
        limit=_describe_limit(cfg),
    )
    loose = None
    if cfg.compare is not None:
        loose = LooseFilesDataset.for_packed(
            cfg.path, cfg.compare, decode=cfg.decode, transform=transform
        )
        report.compare_src = str(cfg.compare)

    for w in cfg.worker_counts:
        say(f"timing {cfg.path} with num_workers={w}")
        sampler = ChunkShuffleBatchSampler(
            dataset, batch_size=cfg.batch_size, seed=cfg.seed, rank=0, world_size=1
        )
        report.rows.append(measure_loader(dataset, sampler, num_workers=w, cfg=cfg))
    if loose is not None:
        import paddle

        for w in cfg.worker_counts:
            say(f"timing the loose files under {cfg.compare} with num_workers={w}")
            plain = paddle.io.BatchSampler(loose, batch_size=cfg.batch_size, shuffle=True)
            report.compare.append(
                measure_loader(loose, plain, num_workers=w, cfg=cfg, source="loose")
            )
        report.notes.append(
            "loose files are read in a random order (BatchSampler(shuffle=True), as with "
            "DatasetFolder), packed ones in chunk-shuffled order; both as warm as the page "
            "cache left them"
        )

    over = [w for w in cfg.worker_counts if w > cores]
    if over:
        report.warnings.append(
            f"num_workers={', '.join(map(str, over))} is above the {cores} usable cores: the "
            "workers compete for CPU with each other and with the training step"
        )
    rec = report.recommended
    if rec.num_workers == max(cfg.worker_counts) and rec.num_workers < cores:
        report.notes.append(
            f"the fastest setting is the largest tried; try num_workers up to {cores}"
        )
    if not all(r.stacked for r in report.rows):
        report.notes.append(
            "the images differ in size, so batches are lists of arrays, not one stacked "
            "array; --transform resize224 times a fixed-size pipeline"
        )
    epoch_s = report.num_samples / rec.samples_per_s if rec.samples_per_s else 0.0
    restart = EPOCH_RESTART_S / (epoch_s + EPOCH_RESTART_S)
    if rec.num_workers > 0 and restart >= 0.05:
        report.warnings.append(
            f"an epoch takes about {epoch_s:.1f} s at num_workers={rec.num_workers}, and "
            f"paddle's persistent workers sleep {EPOCH_RESTART_S} s at the start of every "
            f"epoch: {restart:.0%} of the time; with epochs this short, "
            "persistent_workers=False (the workers restart in tens of ms) is faster"
        )
    batch_bytes = max(r.batch_bytes for r in report.rows)
    report.warnings += shm_warnings(
        shared_memory=cfg.shared_memory,
        batch_bytes=batch_bytes,
        workers=max(cfg.worker_counts),
        prefetch_factor=cfg.prefetch_factor,
    )
    report.warnings += storage_warnings(cfg.path, report.dataset_bytes)
    if cfg.compare is not None:
        report.warnings += [
            w.replace(str(cfg.compare), f"the loose files {cfg.compare}", 1)
            for w in storage_warnings(cfg.compare, 0)
            if storage_of(cfg.compare) != storage_of(cfg.path)
        ]
    return report
