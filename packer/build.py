"""scan -> labels -> read and check -> shard writer -> index, published atomically."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import multiprocessing
import os
import shutil
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packer import __version__
from packer.config import BuildConfig
from packer.encode import Record, Transform, prepare
from packer.engines import EngineError
from packer.errors import (
    BuildLockedError,
    DiskFullError,
    InputError,
    OutputExistsError,
    PackerError,
)
from packer.labels import NO_LABEL_MESSAGE, Entry, plan_labels
from packer.plan import (
    MERGING_NAME,
    PLAN_NAME,
    ShardPlan,
    load_plan_digest,
    plan_digest,
    plan_shards,
    save_plan,
    source_sizes,
)
from packer.problems import CHANGED, NO_LABEL, WARNINGS_NAME, Problem
from packer.scan import name_collisions
from packer.writers import WRITERS
from packer.writers.base import ShardPart, fsync_path, merge_parts, part_paths, read_done
from packer.writers.lmdb import lmdb_versions
from packer.writers.recordio import IDX_SUFFIX, REC_SUFFIX, oversize_problem, recordio_layout
from readers.formats.layout import ERRORS_NAME, FORMAT_VERSION, META_NAME, shard_name
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
    batch: list[tuple[str, str, Any]],
    decode_check: bool,
    transform: Transform,
    strip: bool = False,
) -> list[Record | Problem]:
    results = [
        prepare(rel, path, label, decode_check=decode_check, transform=transform)
        for rel, path, label in batch
    ]
    if strip:  # the caller reads the original bytes itself: no need to pipe them over
        results = [replace(r, data=b"") if isinstance(r, Record) else r for r in results]
    return results


def _restore(item: Record | Problem, path: str) -> Record | Problem:
    """A record whose bytes a worker left out gets them again, from the page cache.

    Sending every image through a pipe cost more than reading it twice: with the bytes
    piped back, two workers were only 1.2x one. The CRC-32 the worker computed proves the
    bytes read now are the bytes it checked.
    """
    if not isinstance(item, Record) or item.data:
        return item
    try:  # a plain read: the worker already vetted the file (regular, readable, an image)
        with open(path, "rb", buffering=0) as f:
            got = f.readall()
    except OSError as exc:
        return Problem(item.rel, CHANGED, f"cannot be read again after its check ({exc})")
    if zlib.crc32(got) != item.crc32:
        return Problem(item.rel, CHANGED, "changed between its check and its packing")
    return replace(item, data=got)


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
    strip = cfg.transform.identity  # original bytes: re-read here rather than piped back
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(cfg.workers) as pool:
        pending: deque[tuple[Any, list[tuple[str, str, Any]]]] = deque()

        def collect() -> Iterator[Record | Problem]:
            result, batch = pending.popleft()
            for item, (_, path, _) in zip(result.get(), batch, strict=True):
                yield _restore(item, path)

        for batch in batches:
            args = (batch, cfg.decode_check, cfg.transform, strip)
            pending.append((pool.apply_async(_prepare_batch, args), batch))
            if len(pending) >= cfg.workers * _IN_FLIGHT:
                yield from collect()
        while pending:
            yield from collect()


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


def _write_jsonl(path: Path, objs: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for obj in objs:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
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


def _output_options(cfg: BuildConfig) -> dict[str, Any]:
    """The options that decide the output bytes (not workers, the engine, progress, ...)."""
    options = cfg.options()
    for name in ("workers", "engine"):  # a local and a Ray build share a plan (and --resume)
        options.pop(name, None)
    return options


def _check_input(entry: Entry, item: Record | Problem, fmt: str) -> Record | Problem:
    """The per-input checks that need both the entry and what reading it gave."""
    if not entry.labelled and isinstance(item, Record):
        return Problem(item.rel, NO_LABEL, entry.note or NO_LABEL_MESSAGE)
    if fmt == "recordio" and isinstance(item, Record):
        return oversize_problem(item) or item
    return item


def write_shard(
    tmp: Path,
    shard: ShardPlan,
    entries: list[Entry],
    items: Iterator[Record | Problem],
    cfg: BuildConfig,
    *,
    first_id: int,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write planned `shard` of the build in `tmp` from its entries' prepared `items`.

    Whatever an earlier attempt at this shard left (a retried Ray task, an interrupted
    build) is removed first: LMDB would append to an existing environment.  `advance` is
    called once per entry with the bytes stored for it (0 when it was skipped).

    Returns:
        The shard's completion marker (see `ShardPart.finish`).

    Raises:
        InputError: an input is bad and ``cfg.on_error`` is ``fail``.
    """
    base = tmp / shard_name(shard.number)
    part_paths(tmp, shard.number)["done"].unlink(missing_ok=True)  # unfinished from here on
    for path in (
        base,
        base.with_name(base.name + REC_SUFFIX),
        base.with_name(base.name + IDX_SUFFIX),
    ):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    part = ShardPart(tmp, shard.number, WRITERS[cfg.format], first_id=first_id)
    try:
        problems: list[Problem] = []
        for entry in entries:
            item = _check_input(entry, next(items), cfg.format)
            if isinstance(item, Problem):
                if cfg.on_error == "fail":
                    raise InputError(item.path, item.reason, item.message)
                problems.append(item)
                stored = 0
            else:
                part.add(item)
                stored = len(item.data)
            if advance is not None:
                advance(stored)
        return part.finish(problems)
    except BaseException:
        part.abort()
        raise


def _run_local(
    cfg: BuildConfig,
    tmp: Path,
    entries: list[Entry],
    shards: list[ShardPlan],
    finished: set[int],
    *,
    started: float,
) -> None:
    """The local engine: write the unfinished shards in order, reading in a process pool.

    Each shard is written with its final first id (the counts of the shards before it).
    """
    first_id = 0
    todo: list[Entry] = []
    for shard in shards:
        if shard.number not in finished:
            todo.extend(entries[shard.start : shard.stop])
    results = _prepared(todo, cfg)
    with _progress(len(entries), cfg.progress) as bar:
        written = 0

        def advance(stored: int) -> None:
            nonlocal written
            written += stored
            bar.update(1)
            if bar.n % 256 == 0:
                rate = written / max(time.perf_counter() - started, 1e-9) / 1e6
                bar.set_postfix_str(f"{rate:.1f} MB/s")

        for shard in shards:
            if shard.number in finished:
                done = read_done(tmp, shard.number)
                assert done is not None
                first_id += int(done["count"])
                bar.update(shard.stop - shard.start)
                continue
            shard_entries = entries[shard.start : shard.stop]
            done = write_shard(
                tmp, shard, shard_entries, results, cfg, first_id=first_id, advance=advance
            )
            first_id += int(done["count"])


def _prepare_build_dir(
    cfg: BuildConfig, tmp: Path, digest: str, say: Callable[[str], None]
) -> set[int]:
    """Make `tmp` ready for this build; return the planned shards already finished there."""
    if tmp.exists():
        reusable = (
            cfg.resume and load_plan_digest(tmp) == digest and not (tmp / MERGING_NAME).exists()
        )
        if reusable:
            finished = {
                int(p.name[len("shard-") : len("shard-") + 5])
                for p in tmp.glob("shard-*.done.json")
                if read_done(tmp, int(p.name[len("shard-") : len("shard-") + 5])) is not None
            }
            for path in tmp.iterdir():  # the files of unfinished shards are rewritten
                if path.name.startswith("shard-") and int(path.name[6:11]) not in finished:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            say(f"resuming {tmp}: {len(finished)} finished shard(s) kept")
            return finished
        if cfg.resume:
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
    elif cfg.resume:
        say(f"nothing to resume at {tmp}; building from the start")
    tmp.mkdir()
    return set()


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold a lock that makes a second build of the same OUT fail at once instead of mixing
    its shards into the first one's build directory."""
    lock_path = out.parent / f".{out.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise BuildLockedError(str(out), holder) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock_path.unlink()


def build(cfg: BuildConfig, *, log: Callable[[str], None] | None = None) -> BuildSummary:
    """Pack ``cfg.src`` into ``cfg.out``; the output appears under its name only when complete.

    Only one build of a given OUT runs at a time: a second one fails at once.

    Raises:
        BuildLockedError: another build of the same OUT is running.
        PackerError: see `_build`.
    """
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(cfg.out):
        return _build(cfg, log=log)


def _build(cfg: BuildConfig, *, log: Callable[[str], None] | None = None) -> BuildSummary:
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
    if (out.exists() or out.is_symlink()) and not cfg.overwrite:
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
    sizes = source_sizes(plan.entries)
    shards = plan_shards(sizes, cfg.shard_size)
    digest = plan_digest(plan.entries, sizes, _output_options(cfg))
    finished = _prepare_build_dir(cfg, tmp, digest, say)
    save_plan(tmp, digest, shards)

    summary = BuildSummary(out=out)
    try:
        if cfg.engine == "ray":
            from packer.engines.ray import run_ray  # ray is imported only here

            run_ray(cfg, tmp, plan.entries, shards, finished, say=say)
        else:
            _run_local(cfg, tmp, plan.entries, shards, finished, started=started)
        (tmp / MERGING_NAME).touch()
        merged = merge_parts(tmp, [s.number for s in shards], renumber=_renumber(cfg.format))
        found = label_problems + merged.problems
        if merged.num_samples == 0:
            shown = "; ".join(f"{p.path}: {p.reason}" for p in found[:5])
            raise PackerError(
                f"no image under {cfg.src} could be packed ({len(found)} problems"
                + (f": {shown}" if shown else "")
                + ")"
            )
        _write_errors(tmp / ERRORS_NAME, found)
        skipped = {p.path for p in found}
        collisions = name_collisions(e.file.rel for e in plan.entries if e.file.rel not in skipped)
        notes = merged.notes + [n.as_json() for n in collisions]
        notes.sort(key=lambda n: (n["path"], n["reason"]))
        _write_jsonl(tmp / WARNINGS_NAME, notes)
        meta = {
            "format": cfg.format,
            "version": FORMAT_VERSION,
            "num_samples": merged.num_samples,
            "num_shards": len(merged.shards),
            "shards": merged.shards,
            "classes": plan.classes,
            "label_source": plan.source,
            "class_map": plan.class_map,
            "label_kind": merged.label_kind,
            "source": str(cfg.src),
            "options": cfg.options(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tool_version": __version__,
            "payload_bytes": merged.payload_bytes,
            "num_errors": len(found),
            "num_warnings": len(notes),
            "index_sha256": merged.index_sha256,
            "index_fingerprint": fingerprint(tmp / "index.jsonl"),
            "writer": lmdb_versions() if cfg.format == "lmdb" else recordio_layout(),
        }
        for name in (PLAN_NAME, MERGING_NAME):
            (tmp / name).unlink(missing_ok=True)
        _write_json(tmp / META_NAME, meta)
        _publish(tmp, out, overwrite=cfg.overwrite)
    except BaseException as exc:
        # an input error or a bug: nothing is kept. An interruption (Ctrl-C, a full disk,
        # a kill, a Ray task that kept dying): the finished shards stay for --resume; OUT is
        # not there either way.
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise DiskFullError(str(tmp), str(exc)) from exc
        if not isinstance(exc, (OSError, KeyboardInterrupt, EngineError)):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.packed = merged.num_samples
    summary.skipped = len(found)
    summary.bytes = merged.payload_bytes
    summary.shards = len(merged.shards)
    for p in found:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    summary.seconds = time.perf_counter() - started
    return summary


def _lmdb_ids_are_local(base: Path, old_first: int, new_first: int, rows: list[Any]) -> None:
    """LMDB keys count from 1 within each shard: a shard written with another first id (by
    the Ray engine) holds nothing to renumber."""
    return


def _renumber(fmt: str) -> Any:
    if fmt == "recordio":
        from packer.writers.recordio import renumber_shard

        return renumber_shard
    return _lmdb_ids_are_local
