"""scan -> labels -> read and check -> shard writer -> index, published atomically."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packer import __version__
from packer.config import BuildConfig
from packer.encode import Record, Transform, prepare
from packer.errors import InputError, OutputExistsError, PackerError
from packer.labels import NO_LABEL_MESSAGE, Entry, plan_labels
from packer.problems import NO_LABEL, Problem
from packer.writers import WRITERS, DatasetWriter
from packer.writers.base import fsync_path
from packer.writers.lmdb import lmdb_versions
from packer.writers.recordio import oversize_problem, recordio_layout
from readers.formats.layout import ERRORS_NAME, FORMAT_VERSION, META_NAME
from readers.index import fingerprint


@dataclass
class BuildSummary:
    out: Path
    packed: int = 0
    skipped: int = 0
    bytes: int = 0
    shards: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def images_per_second(self) -> float:
        return self.packed / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        skipped = f"skipped {self.skipped}"
        if reasons:
            skipped += f" ({reasons}; see {ERRORS_NAME})"
        return (
            f"packed {self.packed} images ({self.bytes / 1e6:.1f} MB) into {self.shards} "
            f"shard{'s' if self.shards != 1 else ''}, {skipped}, in {self.seconds:.1f} s "
            f"({self.images_per_second:.0f} images/s) -> {self.out}"
        )


def temp_dir_for(out: Path) -> Path:
    """The hidden sibling that a build of `out` writes into before renaming it."""
    return out.parent / f".{out.name}.partial"


_BATCH = 32  # images per task sent to a worker process: amortises the IPC
_IN_FLIGHT = 4  # tasks queued per worker: enough to keep each busy, and memory bounded


def _prepare_batch(
    batch: list[tuple[str, str, Any]], decode_check: bool, transform: Transform
) -> list[Record | Problem]:
    return [
        prepare(rel, path, label, decode_check=decode_check, transform=transform)
        for rel, path, label in batch
    ]


def _prepared(entries: list[Entry], cfg: BuildConfig) -> Iterator[Record | Problem]:
    """Each entry read, checked and transformed, in entry order.

    With several workers the images are processed in a process pool while this process
    writes; at most ``workers * _IN_FLIGHT`` batches are in flight, so memory stays bounded
    whatever the tree size, and results come back in order, so the output is identical for
    any number of workers.
    """
    tasks = [(e.file.rel, e.file.path, e.label) for e in entries]
    batches = (tasks[i : i + _BATCH] for i in range(0, len(tasks), _BATCH))
    if cfg.workers <= 1 or len(entries) < 2 * _BATCH:
        for batch in batches:
            yield from _prepare_batch(batch, cfg.decode_check, cfg.transform)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(cfg.workers) as pool:
        pending: deque[Any] = deque()
        for batch in batches:
            pending.append(
                pool.apply_async(_prepare_batch, (batch, cfg.decode_check, cfg.transform))
            )
            if len(pending) >= cfg.workers * _IN_FLIGHT:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="img",
        desc="packing",
        disable=(not sys.stderr.isatty()) if enabled is None else not enabled,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _write_errors(path: Path, found: Iterable[Problem]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in found:
            f.write(json.dumps(p.as_json(), ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _publish(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """Rename the finished `tmp` to `out` (replacing an old `out` only when asked)."""
    fsync_path(tmp)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(str(out))
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        fsync_path(out.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_path(out.parent)


def build(cfg: BuildConfig, *, log: Callable[[str], None] | None = None) -> BuildSummary:
    """Pack ``cfg.src`` into ``cfg.out``; the output appears under its name only when complete.

    Raises:
        PackerError: the output exists (without overwrite), the label source is unusable,
            an input is bad with ``on_error="fail"``, or nothing at all could be packed.
    """
    started = time.perf_counter()
    say = log or (lambda msg: print(msg, file=sys.stderr))
    out = cfg.out
    if (out.exists() or out.is_symlink()) and not cfg.overwrite:
        raise OutputExistsError(str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_for(out)
    if tmp.exists():
        say(f"removing the unfinished build {tmp} left by an interrupted run")
        shutil.rmtree(tmp)

    plan = plan_labels(
        cfg.src,
        cfg.label_specs,
        exclude=(str(out), str(tmp)),
        depth=cfg.label_depth,
        class_map=cfg.class_map,
    )
    found: list[Problem] = list(plan.problems)
    if found and cfg.on_error == "fail":
        first = found[0]
        raise InputError(first.path, first.reason, first.message)

    tmp.mkdir()
    writer = DatasetWriter(tmp, WRITERS[cfg.format], shard_size=cfg.shard_size)
    summary = BuildSummary(out=out)
    try:
        with _progress(len(plan.entries), cfg.progress) as bar:
            last = time.perf_counter()
            for entry, item in zip(plan.entries, _prepared(plan.entries, cfg), strict=True):
                if not entry.labelled and isinstance(item, Record):
                    item = Problem(item.rel, NO_LABEL, entry.note or NO_LABEL_MESSAGE)
                if cfg.format == "recordio" and isinstance(item, Record):
                    item = oversize_problem(item) or item
                if isinstance(item, Problem):
                    if cfg.on_error == "fail":
                        raise InputError(item.path, item.reason, item.message)
                    found.append(item)
                else:
                    writer.add(item)
                bar.update(1)
                now = time.perf_counter()
                if now - last > 0.5:
                    elapsed = now - started
                    bar.set_postfix_str(f"{writer.payload_bytes / elapsed / 1e6:.1f} MB/s")
                    last = now
        writer.close()
        if writer.num_samples == 0:
            shown = "; ".join(f"{p.path}: {p.reason}" for p in found[:5])
            raise PackerError(
                f"no image under {cfg.src} could be packed ({len(found)} problems"
                + (f": {shown}" if shown else "")
                + ")"
            )
        _write_errors(tmp / ERRORS_NAME, found)
        meta = {
            "format": cfg.format,
            "version": FORMAT_VERSION,
            "num_samples": writer.num_samples,
            "num_shards": len(writer.shards),
            "shards": writer.shards,
            "classes": plan.classes,
            "label_source": plan.source,
            "class_map": plan.class_map,
            "label_kind": writer.label_kind,
            "source": str(cfg.src),
            "options": cfg.options(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tool_version": __version__,
            "payload_bytes": writer.payload_bytes,
            "num_errors": len(found),
            "index_sha256": writer.index_sha256,
            "index_fingerprint": fingerprint(tmp / "index.jsonl"),
            "writer": lmdb_versions() if cfg.format == "lmdb" else recordio_layout(),
        }
        _write_json(tmp / META_NAME, meta)
        _publish(tmp, out, overwrite=cfg.overwrite)
    except BaseException:
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.packed = writer.num_samples
    summary.skipped = len(found)
    summary.bytes = writer.payload_bytes
    summary.shards = len(writer.shards)
    for p in found:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    summary.seconds = time.perf_counter() - started
    return summary
