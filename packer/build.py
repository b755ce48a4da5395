"""scan -> labels -> read and check -> shard writer -> index, published atomically."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import __version__
from packer.config import BuildConfig
from packer.dedup import drop_duplicates
from packer.engines import EngineError
from packer.errors import (
    DiskFullError,
    InputError,
    OutputExistsError,
    PackerError,
)
from packer.feedback import Interrupted, shards_kept
from packer.formats import FORMATS
from packer.job import BuildJob
from packer.labels import plan_labels
from packer.labels.hints import prefix_hint
from packer.output import build_lock, check_output, check_replaceable, prepare_parent
from packer.plan import (
    MERGING_NAME,
    PLAN_NAME,
    OutputDiffersError,
    complete_differences,
    load_plan_digest,
    plan_digest,
    plan_shards,
    save_plan,
    source_sizes,
)
from packer.problems import Problem
from packer.records import Entry
from packer.scan import name_collisions
from packer.writers.merge import merge_parts
from packer.writers.part import read_done
from readers.durable import fsync_path, write_durably
from readers.formats.layout import (
    ERRORS_NAME,
    INDEX_NAME,
    META_NAME,
    WARNINGS_NAME,
    parse_shard_name,
)
from readers.index import fingerprint
from readers.meta import make_meta


@dataclass
class BuildSummary:
    """What a build did: images packed and skipped (by reason), bytes, shards and time."""

    out: Path
    packed: int = 0
    skipped: int = 0
    bytes: int = 0
    shards: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    already_complete: bool = False  # --resume found OUT finished, from the same plan
    hints: list[str] = field(default_factory=list)  # lines printed after the summary
    export: str | None = None  # "folder" or "webdataset" for convert --to: files, not shards

    @classmethod
    def of_complete(cls, out: Path, meta: dict[str, Any], started: float) -> BuildSummary:
        """Return the summary of `out`, found complete (``--resume``), from its meta.json."""
        return cls(
            out=out,
            packed=int(meta.get("num_samples", 0)),
            skipped=int(meta.get("num_errors", 0)),
            bytes=int(meta.get("payload_bytes", 0)),
            shards=int(meta.get("num_shards", 0)),
            seconds=time.perf_counter() - started,
            already_complete=True,
        )

    @property
    def images_per_second(self) -> float:
        """Return the packing rate: images packed per second (0.0 when no time passed)."""
        return self.packed / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """Return the one-line summary that ``packer build`` prints when it ends."""
        if self.already_complete:
            return (
                f"{self.out} is already complete ({self.packed} images in {self.shards} "
                f"shard{'s' if self.shards != 1 else ''}, skipped {self.skipped}), built from "
                "the same sources and options: nothing to do"
            )
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        skipped = f"skipped {self.skipped}"
        if reasons:
            skipped += f" ({reasons}; see {ERRORS_NAME})"
        if self.export == "folder":
            into = "as image files"
        else:
            kind = " tar" if self.export == "webdataset" else ""
            into = f"into {self.shards}{kind} shard{'s' if self.shards != 1 else ''}"
        verb = "exported" if self.export else "packed"
        return (
            f"{verb} {self.packed} images ({self.bytes / 1e6:.1f} MB) {into}, {skipped}, in "
            f"{self.seconds:.1f} s ({self.images_per_second:.0f} images/s) -> {self.out}"
        )


def temp_dir_for(out: Path) -> Path:
    """The hidden sibling that a build of `out` writes into before renaming it."""
    return out.parent / f".{out.name}.partial"


def _jsonl(objs: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One line of JSON text per object, as errors.jsonl and warnings.jsonl hold them."""
    return (json.dumps(obj, ensure_ascii=False) + "\n" for obj in objs)


def publish_output(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """Rename the finished `tmp` to `out` (replacing an old `out` only when asked)."""
    fsync_path(tmp)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(str(out))
        check_replaceable(out)  # again: OUT may have changed while the build ran
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        fsync_path(out.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_path(out.parent)


def _output_options(cfg: BuildConfig) -> dict[str, Any]:
    """The options that decide the output bytes (not workers, the engine, progress, ...)."""
    options = cfg.options()
    for name in ("workers", "engine"):  # a local and a Ray build share a plan (and --resume)
        options.pop(name, None)
    return options


def run_engine(
    job: BuildJob, *, say: Callable[[str], None], started: float, pool: Any | None = None
) -> None:
    """Have ``job.cfg.engine`` write the planned shards of `job` that are not finished.

    The engines are in `packer.engines`; `pool` is the local engine's process pool, when
    `_early_pool` started it.
    """
    if job.cfg.engine == "ray":
        from packer.engines.ray import run_ray  # ray is imported only here

        run_ray(job, say=say)
    else:
        from packer.engines.local import run_local

        run_local(job, started=started, pool=pool)


def _already_complete(
    cfg: BuildConfig, digest: str, entries: list[Entry], started: float
) -> BuildSummary:
    """``--resume`` of an OUT that exists: fine when it was built from the same plan.

    Raises:
        OutputDiffersError: OUT was built from other sources or with other options.
        OutputExistsError: OUT is not a finished dataset (no readable meta.json).
    """
    try:
        with open(cfg.out / META_NAME, encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError):
        raise OutputExistsError(str(cfg.out)) from None
    differences = complete_differences(cfg.out, meta, digest, _output_options(cfg), entries)
    if differences:
        raise OutputDiffersError(str(cfg.out), differences)
    return BuildSummary.of_complete(cfg.out, meta, started)


def finish_output(
    tmp: Path,
    out: Path,
    meta: dict[str, Any],
    *,
    overwrite: bool,
    before_publish: Callable[[], None] | None = None,
) -> None:
    """Drop the build's own files from `tmp`, write its meta.json last and publish it as `out`.

    `before_publish` is called between the two (the kill tests of ``packer convert`` stop there).
    """
    for name in (PLAN_NAME, MERGING_NAME):
        (tmp / name).unlink(missing_ok=True)
    write_durably(tmp / META_NAME, json.dumps(meta, ensure_ascii=False, indent=2) + "\n")
    if before_publish is not None:
        before_publish()
    publish_output(tmp, out, overwrite=overwrite)


def prepare_build_dir(
    tmp: Path, digest: str, say: Callable[[str], None], *, resume: bool
) -> set[int]:
    """Make `tmp` ready for a build of plan `digest`; return the planned shards finished there.

    With `resume`, the finished shards of an interrupted build of the same plan are kept.
    """
    if tmp.exists():
        reusable = resume and load_plan_digest(tmp) == digest and not (tmp / MERGING_NAME).exists()
        if reusable:
            numbers = {parse_shard_name(p.name) for p in tmp.iterdir()} - {None}
            finished = {n for n in numbers if n is not None and read_done(tmp, n) is not None}
            for path in tmp.iterdir():  # the files of unfinished shards are rewritten
                number = parse_shard_name(path.name)
                if number is not None and number not in finished:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            say(f"resuming {tmp}: {len(finished)} finished shard(s) kept")
            return finished
        if resume:
            say(
                f"cannot resume {tmp}: its inputs or options differ (or it was merging); "
                "starting over"
            )
        else:
            say(
                f"removing the unfinished build {tmp} left by an interrupted run "
                "(--resume keeps its finished shards)"
            )
        shutil.rmtree(tmp)
    elif resume:
        say(f"nothing to resume at {tmp}; building from the start")
    tmp.mkdir()
    return set()


@contextlib.contextmanager
def _early_pool(cfg: BuildConfig) -> Iterator[Any | None]:
    """Start the local engine's process pool before the scan.

    Its processes import OpenCV on the other cores while this one scans and plans (this one
    never decodes then).
    """
    if cfg.engine != "local" or cfg.workers <= 1:
        yield None
        return
    from packer.engines.local import kill_pool, start_pool, stop_pool

    pool = start_pool(cfg.workers)
    try:
        yield pool
    except BaseException:
        kill_pool(pool)
        raise
    stop_pool(pool)


def build(cfg: BuildConfig, *, log: Callable[[str], None] | None = None) -> BuildSummary:
    """Pack ``cfg.src`` into ``cfg.out``; the output appears under its name only when complete.

    Only one build of a given OUT runs at a time: a second one fails at once. OUT is checked
    against SRC, the label files and ``--overwrite`` before anything is written or removed.

    Raises:
        BuildLockedError: another build of the same OUT is running.
        UnsafeOutputError, NotADatasetError, OutputParentError: see `packer.output`.
        PackerError: see `_build`.
    """
    check_output(cfg, build_dir=temp_dir_for(cfg.out))
    if (cfg.out.exists() or cfg.out.is_symlink()) and not cfg.overwrite and not cfg.resume:
        raise OutputExistsError(str(cfg.out))  # before a pool is started only to be stopped
    prepare_parent(cfg.out)
    with build_lock(cfg.out), _early_pool(cfg) as pool:
        return _build(cfg, log=log, pool=pool)


def _build(
    cfg: BuildConfig, *, log: Callable[[str], None] | None = None, pool: Any | None = None
) -> BuildSummary:
    """Pack ``cfg.src`` into ``cfg.out``; the output appears under its name only when complete.

    The inputs are planned into shards first (`packer.plan`); each finished shard leaves a
    completion marker in the hidden build directory, so ``resume=True`` after a crash keeps
    those shards and writes only the rest, with a result identical to an uninterrupted build.

    Raises:
        PackerError: the output exists (without overwrite), the label source is unusable,
            an input is bad with ``on_error="fail"``, or nothing at all could be packed.
    """
    started = time.perf_counter()
    say = log or (lambda msg: print(msg, file=sys.stderr))
    out = cfg.out
    out_exists = out.exists() or out.is_symlink()
    if out_exists and not cfg.overwrite and not cfg.resume:
        raise OutputExistsError(str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_for(out)

    plan = plan_labels(
        cfg.src,
        cfg.label_specs,
        exclude=(str(out), str(tmp)),
        depth=cfg.label_depth,
        class_map=cfg.class_map,
    )
    label_problems: list[Problem] = list(plan.problems)
    if label_problems and cfg.on_error == "fail":
        first = label_problems[0]
        raise InputError(first.path, first.reason, first.message)
    entries = plan.entries
    sizes = source_sizes(entries)
    if cfg.dedup:  # before planning: every shard task sees the same entries (packer.dedup)
        entries, sizes, dropped = drop_duplicates(entries, sizes)
        label_problems += dropped
    shards = plan_shards(sizes, cfg.shard_size)
    digest = plan_digest(entries, sizes, _output_options(cfg))
    if out_exists and not cfg.overwrite:  # --resume of a build that finished
        return _already_complete(cfg, digest, entries, started)
    finished = prepare_build_dir(tmp, digest, say, resume=cfg.resume)
    save_plan(tmp, digest, shards)

    summary = BuildSummary(out=out)
    shard_cls = FORMATS[cfg.format].writer
    job = BuildJob(cfg, tmp, entries, shards, frozenset(finished))
    try:
        run_engine(job, say=say, started=started, pool=pool)
        (tmp / MERGING_NAME).touch()
        merged = merge_parts(
            tmp,
            [s.number for s in shards],
            shard_cls=shard_cls,
            compressed=cfg.transform.compression is not None,
        )
        found = label_problems + merged.problems
        hint = prefix_hint(cfg.src, label_problems)
        if merged.num_samples == 0:
            shown = "; ".join(f"{p.path}: {p.reason}" for p in found[:5])
            raise PackerError(
                f"no image under {cfg.src} could be packed ({len(found)} problems"
                + (f": {shown}" if shown else "")
                + ")"
                + (f"; {hint}" if hint else "")
            )
        write_durably(tmp / ERRORS_NAME, _jsonl(p.as_json() for p in found))
        skipped = {p.path for p in found}
        collisions = name_collisions(e.file.rel for e in entries if e.file.rel not in skipped)
        notes = merged.notes + [n.as_json() for n in collisions]
        notes.sort(key=lambda n: (n["path"], n["reason"]))
        write_durably(tmp / WARNINGS_NAME, _jsonl(notes))
        meta = make_meta(
            format=cfg.format,
            num_samples=merged.num_samples,
            shards=merged.shards,
            classes=plan.classes,
            label_source=plan.source,
            class_map=plan.class_map,
            label_kind=merged.label_kind,
            source=str(cfg.src),
            options=cfg.options(),
            tool_version=__version__,
            payload_bytes=merged.payload_bytes,
            num_errors=len(found),
            num_warnings=len(notes),
            index_sha256=merged.index_sha256,
            index_fingerprint=fingerprint(tmp / INDEX_NAME),
            writer=shard_cls.describe(),
            plan_digest=digest,  # what --resume of a finished OUT compares
        )
        finish_output(tmp, out, meta, overwrite=cfg.overwrite)
    except BaseException as exc:
        # an input error or a bug: nothing is kept. An interruption (Ctrl-C, a full disk,
        # a kill, a Ray task that kept dying): the finished shards stay for --resume; OUT is
        # not there either way.
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFullError(str(tmp), str(exc)) from exc
        if not isinstance(exc, (OSError, KeyboardInterrupt, EngineError)):
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise shards_kept(tmp, [s.number for s in shards]) from None
        raise
    summary.packed = merged.num_samples
    summary.skipped = len(found)
    summary.bytes = merged.payload_bytes
    summary.shards = len(merged.shards)
    for p in found:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    summary.seconds = time.perf_counter() - started
    summary.hints = [hint] if hint else []
    return summary


class _CallableModule(types.ModuleType):
    """This module, callable as ``packer.build(src, out, **options)``: see `packer.api.build`.

    ``packer.build`` names both this module and the Python API's function: importing the
    module sets the package's attribute to it, so the module is made to run the function
    when called, and ``packer.build.temp_dir_for`` and the like keep working.
    """

    def __call__(
        self, src: str | os.PathLike[str], out: str | os.PathLike[str], **options: Any
    ) -> BuildSummary:
        """Run `packer.api.build` (the command line's build as a function)."""
        from packer.api import build as api_build

        return api_build(src, out, **options)


sys.modules[__name__].__class__ = _CallableModule
