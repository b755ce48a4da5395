"""``packer bench``: DataLoader throughput of a packed dataset for each num_workers, the setting
to use, and the warnings (shared memory, slow storage, oversubscribed cores) that explain it.

paddle is imported only when a measurement runs, so the storage helpers here stay cheap to
import (``scripts/bench_read.py`` uses them too). :mod:`.batches` (transform presets, collate),
:mod:`.loose` (the ``--compare`` baseline), :mod:`.system` (storage, shared memory, CPU time),
:mod:`.measure` (one timed DataLoader setting), :mod:`.report` (all settings, the report).
"""

from __future__ import annotations

from packer.bench.batches import TRANSFORMS, collate, make_transform
from packer.bench.loose import LooseFilesDataset
from packer.bench.measure import (
    DEFAULT_SECONDS,
    NEAR_BEST,
    BenchConfig,
    BenchRow,
    EndlessBatches,
    measure_loader,
    recommend,
)
from packer.bench.report import BenchReport, run_bench
from packer.bench.system import (
    Storage,
    cpu_seconds,
    shm_free,
    shm_warnings,
    storage_of,
    storage_warnings,
    whole_disk,
)

__all__ = [
    "DEFAULT_SECONDS",
    "NEAR_BEST",
    "TRANSFORMS",
    "BenchConfig",
    "BenchReport",
    "BenchRow",
    "EndlessBatches",
    "LooseFilesDataset",
    "Storage",
    "collate",
    "cpu_seconds",
    "make_transform",
    "measure_loader",
    "recommend",
    "run_bench",
    "shm_free",
    "shm_warnings",
    "storage_of",
    "storage_warnings",
    "whole_disk",
]
