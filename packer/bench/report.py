"""``packer bench`` end to end: time, recommend and explain each num_workers.

``packer bench`` end to end: time each num_workers (and the loose files), recommend one, and
explain it with warnings; :class:`BenchReport` prints as a table or JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from packer.bench.batches import make_transform
from packer.bench.decoding import DecodeReport, advise, measure_decoding
from packer.bench.loose import LooseFilesDataset
from packer.bench.measure import (
    EPOCH_RESTART_S,
    STABLE_SPREAD,
    BenchConfig,
    BenchRow,
    measure_loader,
    recommend,
    tolerance,
    too_noisy,
)
from packer.bench.system import gb, shm_warnings, storage_of, storage_warnings, tree_bytes
from packer.config import usable_cores


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
    decoding: DecodeReport | None = None

    @property
    def recommended(self) -> BenchRow:
        """The timed setting recommended among `rows`."""
        return recommend(self.rows)

    def as_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready dict."""
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
            "max_spread": max(r.spread for r in self.rows),
            "stable": too_noisy(self.rows) is None,  # False: the machine was too busy to tell
            "warnings": self.warnings,
            "notes": self.notes,
            "decoding": None if self.decoding is None else self.decoding.as_dict(),
        }

    def verdict(self) -> str:
        """The one line that says which num_workers to use, or that the figures cannot tell."""
        rec = self.recommended
        noisy = too_noisy(self.rows)
        if noisy is not None:
            return (
                f"the machine was too busy to tell: spread {noisy.spread:.0%} at num_workers="
                f"{noisy.num_workers} after {noisy.rounds} rounds; run again on a quiet machine "
                f"(these figures would pick num_workers={rec.num_workers})"
            )
        best = max(r.samples_per_s for r in self.rows)
        return (
            f"use num_workers={rec.num_workers}: {rec.samples_per_s:,.0f} samples/s, the "
            f"smallest setting within {tolerance(self.rows):.0%} of the best ({best:,.0f}/s); "
            f"rounds agree within {STABLE_SPREAD:.0%}"
        )

    def json(self) -> str:
        """Return the report as indented JSON."""
        return json.dumps(self.as_dict(), indent=2)

    def text(self) -> str:
        """Return the report as a table with the recommendation and warnings."""
        best = max(r.samples_per_s for r in self.rows)
        loose = {r.num_workers: r.samples_per_s for r in self.compare}
        lines = [
            f"{self.dataset}: {self.num_samples:,} samples ({self.format}, "
            f"{gb(self.dataset_bytes)}), batch {self.batch_size}, decode {self.decode}, "
            f"transform {self.transform}; {self.limit} per setting, {self.cores} usable cores",
            "",
        ]
        header = ["source", "workers", "samples/s", "vs best", "CPU cores", "wait/batch", "spread"]
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
                f"{r.spread:.0%}",
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
        lines += ["", self.verdict()]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"warning: {w}" for w in self.warnings]
        if self.decoding is not None:
            lines += ["", self.decoding.text()]
        return "\n".join(lines)


def _describe_limit(cfg: BenchConfig) -> str:
    parts = []
    if cfg.limit_seconds is not None:
        parts.append(f"{cfg.limit_seconds:g} s")
    if cfg.batches is not None:
        parts.append(f"{cfg.batches} batches")
    return f"{cfg.rounds} to {3 * cfg.rounds} rounds of " + " or ".join(parts) + " after warm-up"


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

    capped = [w for w in cfg.workers if w > cfg.worker_cap]
    if capped:
        report.notes.append(
            f"num_workers={', '.join(map(str, capped))} timed as {cfg.worker_cap}, twice the "
            f"{cores} usable cores: more workers would only compete for them"
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
    if cfg.decode_samples:
        say(f"timing decoding on {min(cfg.decode_samples, len(dataset))} samples")
        report.decoding = decoding_section(cfg, dataset, rec)
    if cfg.compare is not None:
        report.warnings += [
            w.replace(str(cfg.compare), f"the loose files {cfg.compare}", 1)
            for w in storage_warnings(cfg.compare, 0)
            if storage_of(cfg.compare) != storage_of(cfg.path)
        ]
    return report


def sample_cpu_us(row: BenchRow) -> float | None:
    """Return the CPU microseconds per sample of a timed setting.

    CPU microseconds per sample of a timed setting (the loader process and its workers);
    without CPU counters, wall time times the processes that decode.
    """
    if row.samples_per_s <= 0:
        return None
    if row.cpu_cores is not None:
        return 1e6 * row.cpu_cores / row.samples_per_s
    return 1e6 * max(1, row.num_workers) / row.samples_per_s


def decoding_section(cfg: BenchConfig, dataset: Any, row: BenchRow) -> DecodeReport:
    """The decode costs of `dataset` on a sample, against the CPU time per sample of `row`."""
    from readers.formats.layout import META_NAME
    from readers.index import load_index

    if not (cfg.path / META_NAME).exists():
        report = DecodeReport(samples=0, of=len(dataset), mode=cfg.decode, draft=cfg.draft)
        report.note = f"no {META_NAME} (a bare dataset): the stored formats are not known"
        return report
    index = load_index(cfg.path, extra=("format", "width", "height"))
    report = measure_decoding(
        dataset, index, samples=cfg.decode_samples, draft=cfg.draft, seed=cfg.seed
    )
    report.sample_us = sample_cpu_us(row)
    if report.formats:
        report.recommendation = advise(
            report.options, decode_us=report.decode_us, sample_us=report.sample_us
        )
        if report.sample_us is not None:
            report.note = (
                f"a sample takes {report.sample_us:,.0f} us of CPU at num_workers="
                f"{row.num_workers} (the loader process and its workers); draft= is timed "
                "with OpenCV's reduced-scale JPEG decode"
            )
    return report
