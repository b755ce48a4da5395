"""``packer bench``: DataLoader throughput per num_workers, and what explains it.

``packer bench``: DataLoader throughput of a packed dataset for each num_workers, the setting
to use, and the warnings (shared memory, slow storage, oversubscribed cores) that explain it.

paddle is imported only when a measurement runs, so the storage helpers here stay cheap to
import (``scripts/bench_read.py`` uses them too). :mod:`.batches` (transform presets, collate),
:mod:`.loose` (the ``--compare`` baseline), :mod:`.system` (storage, shared memory, CPU time),
:mod:`.measure` (one timed DataLoader setting), :mod:`.decoding` (what decoding costs per
sample, and what ``--encode raw --compress lz4`` or ``draft=`` would save), :mod:`.report` (all
settings, the report).
"""

from __future__ import annotations

from packer.bench.batches import TRANSFORMS, collate, make_transform
from packer.bench.decoding import DecodeReport, measure_decoding
from packer.bench.loose import LooseFilesDataset
from packer.bench.measure import (
    DEFAULT_SECONDS,
    MIN_ROUNDS,
    NEAR_BEST,
    STABLE_SPREAD,
    BenchConfig,
    BenchRow,
    EndlessBatches,
    measure_loader,
    more_rounds,
    recommend,
    spread,
    tolerance,
    too_noisy,
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
    "MIN_ROUNDS",
    "NEAR_BEST",
    "STABLE_SPREAD",
    "TRANSFORMS",
    "BenchConfig",
    "BenchReport",
    "BenchRow",
    "DecodeReport",
    "EndlessBatches",
    "LooseFilesDataset",
    "Storage",
    "collate",
    "cpu_seconds",
    "make_transform",
    "measure_decoding",
    "measure_loader",
    "more_rounds",
    "recommend",
    "run_bench",
    "shm_free",
    "shm_warnings",
    "spread",
    "storage_of",
    "storage_warnings",
    "tolerance",
    "too_noisy",
    "whole_disk",
]
