"""Write a packer dataset from records that exist already (stored bytes, label, path, size).

`repack` is ``packer build`` without the scan and the image preparation: the caller hands it
`Record` values (or `Problem` values for inputs it could not use) in id order, with each
one's stored size for the shard plan, and it writes them through the registered shard writer
(`packer.writers`), merges the index, writes ``errors.jsonl``, ``warnings.jsonl`` and
``meta.json`` (`readers.meta.make_meta`) and publishes OUT atomically (``.OUT.partial`` and a
rename, under the build lock), exactly as a build does. Finished shards leave completion
markers, so ``resume=True`` after an interruption keeps them and writes only the rest; the
result is then identical to an uninterrupted run. ``packer convert`` (and append, merge,
split) use it; nothing here decodes an image.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import __version__
from packer.build import BuildSummary, finish_output, prepare_build_dir, temp_dir_for
from packer.engines import progress_bar
from packer.errors import ConfigError, DiskFullError, InputError, OutputExistsError, PackerError
from packer.feedback import Interrupted, shards_kept, test_delay
from packer.formats import FORMATS
from packer.output import build_lock, check_output_apart, prepare_parent
from packer.plan import (
    MERGING_NAME,
    OutputDiffersError,
    ShardPlan,
    plan_shards,
    save_plan,
)
from packer.problems import Problem
from packer.records import Record
from packer.writers.base import ShardWriter
from packer.writers.batch import RecordBatch
from packer.writers.merge import merge_parts
from packer.writers.part import ShardPart, read_done, start_part
from packer.writers.reuse import ReusedShard, link_part
from readers.durable import write_durably
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME, WARNINGS_NAME
from readers.index import fingerprint
from readers.meta import make_meta

Item = Record | Problem
"""One input of a repack: a record to store, or why it cannot be stored."""

KILL_AT_ENV = "PACKER_REPACK_KILL_AT"
"""Test hook: ``kill -9`` the repacking process itself at the named step (`STEPS`)."""

STEPS = ("writing", "shard", "merging", "merged", "meta")
"""Where a repack (convert, merge, split) can be killed for the tests: amid planned shard 1,
its first records written; planned shard 0 finished, before shard 1; amid the index merge,
the first part merged; the index, errors and warnings written; meta.json written, just before
OUT is published."""


def _checkpoint(step: str) -> None:
    """The test hook: die here, as by ``kill -9``, when `KILL_AT_ENV` names this step."""
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class RepackConfig:
    """Where and how `repack` writes: the build options that are not about preparing images.

    Attributes:
        out: the dataset directory to write.
        format: a format registered in `packer.formats`.
        shard_size: the most stored bytes per shard (a shard holds at least one record).
        on_error: ``skip`` (bad inputs go to errors.jsonl) or ``fail`` (the first one stops).
        overwrite: replace an existing OUT (only a packer dataset).
        resume: keep the finished shards of an interrupted run of the same plan, and accept an
            OUT finished from the same plan as done.
        progress: show a progress bar (None: when stderr is a terminal).
    """

    out: Path
    format: str = next(iter(FORMATS))
    shard_size: int = 1 << 30
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"--format {self.format!r}: expected one of {', '.join(FORMATS)}")
        if self.on_error not in ("skip", "fail"):
            raise ConfigError(f"--on-error {self.on_error!r}: expected skip or fail")
        if self.shard_size < 1:
            raise ConfigError(f"--shard-size {self.shard_size}: must be positive")


@dataclass
class RepackSource:
    """What `repack` writes, described before any record is read.

    Attributes:
        sizes: the stored size of each input, in id order (plans the shards; a problem's
            input may give 0).
        read: ``read(start, stop)`` yields the items of inputs ``start..stop-1`` in order,
            exactly one per input (called once per shard to write).
        identity: text that changes whenever the inputs change (their paths, sizes,
            modification times or digests); with `sizes` and the options it makes the plan
            digest that ``--resume`` compares.
        inputs: the paths read (OUT must lie apart from them).
        source: what meta.json records as ``source``.
        options: what meta.json records as ``options`` (the output-deciding ones).
        classes: class names (index = class id), when labels are class ids.
        label_source: meta.json's ``label_source``.
        class_map: meta.json's ``class_map``.
        problems: inputs found unusable before writing (they go to errors.jsonl first).
        compressed: some records are compressed raw pixels (index.parquet then has a
            ``compression`` column).
        read_batches: optional, ``read_batches(start, stop)`` yields the same items as
            ``read(start, stop)``, but runs of records as `RecordBatch` values (records whose
            description is known, e.g. from a packer dataset's index): they are written a
            batch at a time, to the same bytes.
        plan: optional, the inputs of each shard as ``(start, stop)`` runs, laid end to end
            (instead of shards planned by size).
        reuse: optional, ``reuse(start, stop, first_id)`` gives the `ReusedShard` that a
            planned shard of inputs ``start..stop-1`` whose first sample id is `first_id`
            reproduces byte for byte, or None; such a shard is hard-linked, not written.
    """

    sizes: list[int]
    read: Callable[[int, int], Iterator[Item]]
    identity: str
    inputs: list[Path] = field(default_factory=list)
    source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    classes: list[str] | None = None
    label_source: str = "none"
    class_map: Any = None
    problems: list[Problem] = field(default_factory=list)
    compressed: bool = False
    read_batches: Callable[[int, int], Iterator[RecordBatch | Problem]] | None = None
    plan: list[tuple[int, int]] | None = None
    reuse: Callable[[int, int, int], ReusedShard | None] | None = None


def repack_digest(cfg: RepackConfig, source: RepackSource) -> str:
    """The plan digest: the inputs' identity, their sizes, the format and the options."""
    digest = hashlib.sha256()
    options = {**source.options, "format": cfg.format, "shard_size": cfg.shard_size}
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    digest.update(b"\0" + source.identity.encode() + b"\0")
    digest.update(json.dumps(source.sizes).encode())
    if source.plan is not None:
        digest.update(b"\0" + json.dumps(source.plan).encode())
    return digest.hexdigest()


def _jsonl(objs: Iterable[dict[str, Any]]) -> Iterator[str]:
    return (json.dumps(obj, ensure_ascii=False) + "\n" for obj in objs)


def repack(
    cfg: RepackConfig, source: RepackSource, *, log: Callable[[str], None] | None = None
) -> BuildSummary:
    """Write the items of `source` as the dataset ``cfg.out``, like ``packer build`` would.

    Raises:
        BuildLockedError: another build of the same OUT is running.
        UnsafeOutputError, NotADatasetError, OutputParentError: see `packer.output`.
        OutputExistsError: OUT exists (without overwrite or resume).
        OutputDiffersError: ``--resume`` of an OUT finished from another plan.
        InputError: a bad input with ``on_error="fail"``.
        PackerError: no input could be stored.
    """
    tmp = temp_dir_for(cfg.out)
    check_output_apart(cfg.out, source.inputs, build_dir=tmp, overwrite=cfg.overwrite)
    prepare_parent(cfg.out)
    with build_lock(cfg.out), _no_cyclic_gc():
        return _repack(cfg, source, tmp, log or (lambda msg: print(msg, file=sys.stderr)))


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (reference counting still frees everything).

    A repack makes no reference cycles, but it keeps a shard's index rows (tens of thousands of
    tuples) alive while it allocates: each collection would walk them all, for nothing (4 % of
    a convert's instructions).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _already_complete(out: Path, digest: str, started: float) -> BuildSummary:
    try:
        with open(out / META_NAME, encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError):
        raise OutputExistsError(str(out)) from None
    if meta.get("plan_digest") != digest:
        raise OutputDiffersError(str(out), ["its inputs or options differ from this run's"])
    return BuildSummary.of_complete(out, meta, started)


def _write_shards(
    cfg: RepackConfig,
    source: RepackSource,
    tmp: Path,
    shards: list[ShardPlan],
    finished: set[int],
    say: Callable[[str], None],
) -> None:
    """Write (or link) the planned shards not in `finished`, in order, in this process."""
    shard_cls = FORMATS[cfg.format].writer
    total = len(source.sizes)
    copied = 0  # reused shards copied because the filesystem refused hard links
    with progress_bar(total, cfg.progress) as bar:
        first_id = 0
        for shard in shards:
            done = read_done(tmp, shard.number) if shard.number in finished else None
            if done is None and source.reuse is not None:
                reused = source.reuse(shard.start, shard.stop, first_id)
                if reused is not None:
                    done = link_part(tmp, shard.number, shard_cls, reused, first_id=first_id)
                    copied += done is not None and done["reused"] == "copy"
                if done is not None:
                    bar.update(shard.stop - shard.start)
            elif done is not None:
                bar.update(shard.stop - shard.start)
            if done is None:
                done = _write_shard(cfg, source, tmp, shard, shard_cls, first_id, bar)
            first_id += int(done["count"])
            if shard.number == 0:
                _checkpoint("shard")
    if copied:
        say(
            f"{copied} shard(s) that could be hard links of the sources' were copied: "
            f"{tmp.parent} does not take hard links to them (another filesystem?)"
        )


def _write_shard(
    cfg: RepackConfig,
    source: RepackSource,
    tmp: Path,
    shard: ShardPlan,
    shard_cls: type[ShardWriter],
    first_id: int,
    bar: Any,
) -> dict[str, Any]:
    """Write planned shard `shard` from its inputs; return its completion marker."""
    part = start_part(tmp, shard.number, shard_cls, first_id=first_id)
    try:
        stop = _checkpoint if shard.number == 1 else None
        if source.read_batches is not None:
            batches = source.read_batches(shard.start, shard.stop)
            problems, count = _add_batches(cfg, part, shard_cls, batches, bar, stop)
        else:
            items = source.read(shard.start, shard.stop)
            problems, count = _add_items(cfg, part, shard_cls, items, bar, stop)
        if count != shard.stop - shard.start:
            raise RuntimeError(
                f"the source gave {count} items for inputs {shard.start}..{shard.stop - 1}"
            )
        return part.finish(problems)
    except BaseException:
        part.abort()
        raise


def _refuse(cfg: RepackConfig, problem: Problem) -> Problem:
    if cfg.on_error == "fail":
        raise InputError(problem.path, problem.reason, problem.message)
    return problem


def _add_items(
    cfg: RepackConfig,
    part: ShardPart,
    shard_cls: type[ShardWriter],
    items: Iterator[Item],
    bar: Any,
    stop: Callable[[str], None] | None,
) -> tuple[list[Problem], int]:
    """Write `items` one by one; return the problems found and the number of items."""
    problems: list[Problem] = []
    count = 0
    delay = test_delay()
    for item in items:
        count += 1
        if delay:
            time.sleep(delay)
        found = item if isinstance(item, Problem) else shard_cls.check(item)
        if found is not None:
            problems.append(_refuse(cfg, found))
        else:
            assert isinstance(item, Record)
            part.add(item)
            if stop is not None:
                stop("writing")
        if count % 64 == 0:
            bar.update(64)
    bar.update(count % 64)
    return problems, count


def _add_batches(
    cfg: RepackConfig,
    part: ShardPart,
    shard_cls: type[ShardWriter],
    items: Iterator[RecordBatch | Problem],
    bar: Any,
    stop: Callable[[str], None] | None,
) -> tuple[list[Problem], int]:
    """Write `items` a batch at a time; the problems found and the number of inputs."""
    problems: list[Problem] = []
    count = 0
    delay = test_delay()
    for item in items:
        if delay:
            time.sleep(delay * (1 if isinstance(item, Problem) else len(item)))
        if isinstance(item, Problem):
            problems.append(_refuse(cfg, item))
            count += 1
            bar.update(1)
            continue
        start = 0
        for at, found in shard_cls.check_batch(item):
            if at > start:
                part.add_batch(item.take(range(start, at)))
            problems.append(_refuse(cfg, found))
            start = at + 1
        part.add_batch(item if start == 0 else item.take(range(start, len(item))))
        count += len(item)
        bar.update(len(item))
        if stop is not None:
            stop("writing")
    return problems, count


def _repack(
    cfg: RepackConfig, source: RepackSource, tmp: Path, say: Callable[[str], None]
) -> BuildSummary:
    started = time.perf_counter()
    out = cfg.out
    out_exists = out.exists() or out.is_symlink()
    if out_exists and not cfg.overwrite and not cfg.resume:
        raise OutputExistsError(str(out))
    if source.problems and cfg.on_error == "fail":
        first = source.problems[0]
        raise InputError(first.path, first.reason, first.message)
    digest = repack_digest(cfg, source)
    if out_exists and not cfg.overwrite:  # --resume of a run that finished
        return _already_complete(out, digest, started)
    if source.plan is None:
        shards = plan_shards(source.sizes, cfg.shard_size)
    else:
        shards = [ShardPlan(n, a, b) for n, (a, b) in enumerate(source.plan)]
        ends = [0] + [s.stop for s in shards]
        if [s.start for s in shards] != ends[:-1] or ends[-1] != len(source.sizes):
            raise ValueError(f"the shard plan {source.plan} does not cover the inputs in order")
    finished = prepare_build_dir(tmp, digest, say, resume=cfg.resume)
    save_plan(tmp, digest, shards)
    shard_cls = FORMATS[cfg.format].writer
    try:
        _write_shards(cfg, source, tmp, shards, finished, say)
        (tmp / MERGING_NAME).touch()
        merged = merge_parts(
            tmp,
            [s.number for s in shards],
            shard_cls=shard_cls,
            compressed=source.compressed,
            after_part=lambda number: _checkpoint("merging") if number == 0 else None,
        )
        found = source.problems + merged.problems
        if merged.num_samples == 0:
            shown = "; ".join(f"{p.path}: {p.reason}" for p in found[:5])
            raise PackerError(
                f"no record of {source.source} could be stored ({len(found)} problems"
                + (f": {shown}" if shown else "")
                + ")"
            )
        write_durably(tmp / ERRORS_NAME, _jsonl(p.as_json() for p in found))
        notes = sorted(merged.notes, key=lambda n: (n["path"], n["reason"]))
        write_durably(tmp / WARNINGS_NAME, _jsonl(notes))
        _checkpoint("merged")
        meta = make_meta(
            format=cfg.format,
            num_samples=merged.num_samples,
            shards=merged.shards,
            classes=source.classes,
            label_source=source.label_source,
            class_map=source.class_map,
            label_kind=merged.label_kind,
            source=source.source,
            options={**source.options, "format": cfg.format, "shard_size": cfg.shard_size},
            tool_version=__version__,
            payload_bytes=merged.payload_bytes,
            num_errors=len(found),
            num_warnings=len(notes),
            index_sha256=merged.index_sha256,
            index_fingerprint=fingerprint(tmp / INDEX_NAME),
            writer=shard_cls.describe(),
            plan_digest=digest,
        )
        finish_output(
            tmp, out, meta, overwrite=cfg.overwrite, before_publish=lambda: _checkpoint("meta")
        )
    except BaseException as exc:
        # as in a build: an input error or a bug removes everything; an interruption keeps
        # the finished shards for --resume. OUT is not there either way.
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFullError(str(tmp), str(exc)) from exc
        if not isinstance(exc, (OSError, KeyboardInterrupt)):
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise shards_kept(tmp, [s.number for s in shards]) from None
        raise
    summary = BuildSummary(
        out=out,
        packed=merged.num_samples,
        skipped=len(found),
        bytes=merged.payload_bytes,
        shards=len(merged.shards),
        seconds=time.perf_counter() - started,
    )
    for p in found:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    return summary
