"""What the machine says about a benchmark: storage, shared memory, CPU time.

What the machine says about a benchmark: the storage under a path, free shared memory, and the
CPU time of this process and its DataLoader workers (Linux ``/proc`` and ``/sys``).
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from pathlib import Path

NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs",
     "beegfs", "afs", "davfs", "sshfs", "virtiofs", "fuse"}
)  # fmt: skip


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
        """Whether the filesystem is a network (or FUSE network) one."""
        fs = self.fstype
        return fs in NETWORK_FILESYSTEMS or (fs.startswith("fuse.") and fs != "fuseblk")


def _unescape(field: str) -> str:
    """Mountinfo escapes space, tab, newline and backslash as octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def whole_disk(dev: int) -> tuple[str, str] | None:
    """Return the whole disk holding device number `dev`, or None.

    ``(name, "MAJ:MIN")`` of the whole disk holding device number `dev`, or None when the
    device is not a block device (tmpfs, overlay, ...).
    """
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


def gb(n: float) -> str:
    """Return `n` bytes as GB (one decimal) or MB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def storage_warnings(path: Path, size: int) -> list[str]:
    """Warnings when the data at `path` sits on a network filesystem or a rotational disk."""
    where = storage_of(path)
    if where is None:
        return []
    mem = _mem_available()
    if mem is not None and size > 0.8 * mem:
        scope = (
            f"the dataset ({gb(size)}) does not fit in the free memory ({gb(mem)}), so every "
            "epoch reads it from there"
        )
    else:
        scope = "the first epoch (and any epoch after its pages leave the cache) reads from there"
    advice = (
        "stage it on /dev/shm or a local SSD if you can: `packer stage OUT /dev/shm/packer`, "
        "or cache_dir= on the dataset"
    )
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
            f"/dev/shm has {gb(free)} free but {workers} workers x {prefetch_factor + 1} "
            f"batches of {gb(batch_bytes)} need about {gb(need)}: workers will fail with bus "
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
