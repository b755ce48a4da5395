"""``packer append OUT SRC``: SRC's images become new shards of OUT; what OUT held stays.

Every old index line, shard and byte is kept: the new dataset is assembled in the hidden
``.OUT.partial`` beside OUT, holding the old shards as hard links (same inodes, no copy), the
new shards written by the build's own engines with shard numbers after the old ones, the old
index lines followed by the new ones, and a new meta.json. It then takes OUT's place in one
``renameat2(RENAME_EXCHANGE)`` (`packer.swap`), so the path OUT names the old dataset or the
new one at every moment, whatever is killed when; the old directory, now at the hidden name,
is removed last (by the next append or build if a kill comes first).

Each append is recorded in meta.json (``options.appended``) with a digest of SRC as planned
(every file's path, size and label, and the byte-deciding options, as ``build --resume``
compares them); the same append run again, once it is in, is found complete and changes
nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packer import __version__
from packer.build import _jsonl, _output_options, run_engine, temp_dir_for
from packer.config import BuildConfig
from packer.errors import (
    ConfigError,
    DatasetMissingError,
    InputError,
    NotADatasetError,
    PackerError,
)
from packer.feedback import on_interrupt
from packer.formats import FORMATS
from packer.job import BuildJob
from packer.labels import plan_labels
from packer.labels.classmap import remap_label, unite_classes
from packer.output import build_lock, check_output, check_replaceable, meta_problem
from packer.plan import ShardPlan, plan_digest, plan_shards, save_plan, source_sizes
from packer.problems import DUPLICATE, Problem
from packer.records import Entry
from packer.scan import name_collisions
from packer.swap import exchange_dirs
from packer.transform import Transform, parse_resize
from packer.writers.merge import merge_parts
from readers.durable import fsync_path, write_durably
from readers.formats.layout import (
    ERRORS_NAME,
    INDEX_NAME,
    META_NAME,
    WARNINGS_NAME,
)
from readers.index import fingerprint
from readers.meta import load_meta, make_meta

CLASS_GROWTH = ("keep", "grow")
"""``--class-map`` of an append: keep (a new class name is an error) or grow."""

KILL_AT_ENV = "PACKER_APPEND_KILL_AT"
"""Test hook: ``kill -9`` the appending process itself at the named step (`STEPS`)."""

STEPS = ("linked", "shards", "index", "meta", "swapped")
"""Where an append can be killed for the tests: old shards linked; new shards written; index
merged; meta.json written (all before the exchange); exchanged (old directory not removed)."""


@dataclass
class AppendSummary:
    """What an append did: images added and skipped, the new shards and classes."""

    out: Path
    appended: int = 0
    skipped: int = 0
    first_id: int = 0
    shards: int = 0
    new_classes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    already_complete: bool = False  # the same SRC was appended before (a retry)
    src: Path | None = None
    created: str = ""

    @classmethod
    def of_complete(
        cls, out: Path, src: Path, record: dict[str, Any], seconds: float
    ) -> AppendSummary:
        """The summary of an append found done already (`record`: its entry in meta.json)."""
        first, count = int(record.get("first_id", 0)), int(record.get("num_samples", 0))
        return cls(
            out=out,
            appended=count,
            first_id=first,
            seconds=seconds,
            already_complete=True,
            src=src,
            created=str(record.get("created") or "an earlier run"),
        )

    def line(self) -> str:
        """Return the one-line summary that ``packer append`` prints."""
        if self.already_complete:
            return (
                f"{self.out} already holds {self.src}: appended at {self.created} as ids "
                f"{self.first_id}..{self.first_id + self.appended - 1} from the same files, "
                "sizes, labels and options: nothing to do"
            )
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        skipped = f"skipped {self.skipped}" + (
            f" ({reasons}; see {ERRORS_NAME})" if reasons else ""
        )
        grown = f", new classes {self.new_classes}" if self.new_classes else ""
        return (
            f"appended {self.appended} images as ids {self.first_id}.."
            f"{self.first_id + self.appended - 1} in {self.shards} new "
            f"shard{'s' if self.shards != 1 else ''}{grown}, {skipped}, in "
            f"{self.seconds:.1f} s -> {self.out}"
        )


def _checkpoint(step: str) -> None:
    """The test hook: die here, as by ``kill -9``, when `KILL_AT_ENV` names this step."""
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def read_dataset(out: Path, role: str = "OUT") -> dict[str, Any]:
    """The meta.json of the dataset `out` that an append (``OUT``), merge or split reads.

    `role` names it in messages: ``OUT`` is the dataset an append replaces (so it must be
    replaceable, `packer.output.check_replaceable`); another role (``SRC``) is only read.

    Raises:
        DatasetMissingError: nothing is at `out`.
        NotADatasetError: `out` is not a packer dataset (OUT).
        PackerError: `out` is not a packer dataset (another role).
    """
    if not out.exists() and not out.is_symlink():
        hint = "packer append adds to a dataset that packer build wrote" if role == "OUT" else ""
        raise DatasetMissingError(role, str(out), hint)
    if role == "OUT":
        if not out.is_dir():
            raise NotADatasetError(str(out), "is a file")
        check_replaceable(out)
    else:
        problem = "is not a directory" if not out.is_dir() else meta_problem(out)
        if problem is not None:
            raise PackerError(f"{role} {out} {problem}; expected a dataset that packer wrote")
    try:
        return load_meta(out)
    except Exception as exc:  # a DatasetFormatError: not something we can add to
        if role != "OUT":
            raise PackerError(f"{role} {out} has an unusable {META_NAME} ({exc})") from None
        raise NotADatasetError(str(out), f"has an unusable {META_NAME} ({exc})") from None


def _index_paths(out: Path) -> dict[str, int]:
    """Each source path in OUT's index and its id."""
    paths: dict[str, int] = {}
    with open(out / INDEX_NAME, encoding="utf-8") as f:
        for n, line in enumerate(f):
            paths[str(json.loads(line)["path"])] = n
    return paths


def _lines(path: Path) -> Iterator[str]:
    """The lines of a JSONL file of the dataset (none when it is missing)."""
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if line.strip():
                yield line if line.endswith("\n") else line + "\n"


_TRANSFORM_KEYS = ("resize", "encode", "quality", "max_pixels")


def append_config(out: Path, src: Path, meta: dict[str, Any], **given: Any) -> BuildConfig:
    """The build config of an append: OUT's recorded options, where `given` does not set one.

    `given` holds `BuildConfig` fields and the transform's ``resize``, ``encode``,
    ``quality`` and ``max_pixels`` (None: not given). The format is always OUT's; labels,
    label depth, shard size, the decode check, ``on_error`` and the transform default to what
    OUT was built with, so new images are packed like the old ones.

    Raises:
        DatasetMissingError: SRC does not exist.
        ConfigError: a given option is invalid, or ``format`` is not OUT's.
    """
    if not src.exists() and not src.is_symlink():
        raise DatasetMissingError("SRC", str(src), "packer append adds the images of a directory")
    options = dict(meta.get("options") or {})
    fmt = str(meta["format"])
    if given.get("format") not in (None, fmt):
        raise ConfigError(
            f"--format {given['format']}: {out} is a {fmt} dataset; its new shards are {fmt} "
            "too (drop --format, or build another dataset)"
        )
    given = {k: v for k, v in given.items() if v is not None and k != "format"}
    look = {k: given.pop(k) if k in given else options.get(k) for k in _TRANSFORM_KEYS}
    try:
        short, fit = parse_resize(look["resize"])
        transform = Transform(
            short=short,
            fit=fit,
            encode=str(look["encode"] or "keep"),
            quality=95 if look["quality"] is None else int(look["quality"]),
            max_pixels=None if look["max_pixels"] is None else int(look["max_pixels"]),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    labels = options.get("labels", "auto")
    settings: dict[str, Any] = {
        "labels": tuple(labels) if isinstance(labels, list) else str(labels),
        "label_depth": int(options.get("label_depth", 1)),
        "shard_size": int(options.get("shard_size", 1 << 30)),
        "decode_check": bool(options.get("decode_check", True)),
        "on_error": str(options.get("on_error", "skip")),
        "transform": transform,
    }
    settings.update(given)
    return BuildConfig(src=src, out=out, format=fmt, **settings)


def _plan_entries(
    cfg: BuildConfig, meta: dict[str, Any], *, grow: bool, exclude: tuple[str, ...]
) -> tuple[list[Entry], list[Problem], list[str] | None, list[str]]:
    """SRC's entries with labels in OUT's class ids; problems; the united classes; new ones."""
    known = meta.get("classes")
    class_map = "auto" if known is not None else None
    if class_map is not None and cfg.label_specs == ("none",):
        raise PackerError(
            f"--labels none: {cfg.out} has class labels ({len(known or [])} classes), so its "
            "new images need them too; give --labels as the first build did"
        )
    plan = plan_labels(
        cfg.src, cfg.label_specs, exclude=exclude, depth=cfg.label_depth, class_map=class_map
    )
    entries, problems = plan.entries, list(plan.problems)
    if known is None:
        if plan.classes:  # pragma: no cover - class_map None gives ids only for dirname
            raise PackerError(f"{cfg.out} has no classes, but SRC's labels are class folders")
        return entries, problems, None, []
    found = plan.classes or []
    united, table = unite_classes(list(known), found, grow=grow, where=f"SRC {cfg.src}")
    entries = [
        dataclasses.replace(e, label=remap_label(e.label, table)) if e.labelled else e
        for e in entries
    ]
    return entries, problems, united, united[len(known) :]


def _drop_duplicates(
    entries: list[Entry], old: dict[str, int], out: Path
) -> tuple[list[Entry], list[Problem]]:
    kept, dupes = [], []
    for e in entries:
        if e.file.rel in old:
            dupes.append(
                Problem(
                    e.file.rel,
                    DUPLICATE,
                    f"already in {out} as id {old[e.file.rel]}; an append adds new paths only",
                )
            )
        else:
            kept.append(e)
    return kept, dupes


def _appended_before(
    out: Path,
    meta: dict[str, Any],
    digest: str,
    entries: list[Entry],
    old_paths: dict[str, int],
) -> dict[str, Any] | None:
    """The record of an append of this very SRC that OUT holds already, or None.

    It is the same SRC when an earlier append recorded the same ``source_digest`` (every
    file's path, size and label, and the options that decide the bytes: what ``build
    --resume`` compares) and every path of SRC is in OUT's index (or was skipped by it, in
    errors.jsonl).
    """
    history = (meta.get("options") or {}).get("appended") or []
    record = next((h for h in reversed(history) if h.get("source_digest") == digest), None)
    if record is None:
        return None
    skipped = {str(json.loads(line).get("path")) for line in _lines(out / ERRORS_NAME)}
    if any(e.file.rel not in old_paths and e.file.rel not in skipped for e in entries):
        return None
    return dict(record)


def _link_old_shards(out: Path, tmp: Path, meta: dict[str, Any]) -> bool:
    """Hard-link OUT's shards into `tmp`; True when none had to be copied.

    ``ShardWriter.link`` does it: a lock file, which LMDB writes in place, is copied.
    """
    shard_cls = FORMATS[str(meta["format"])].writer
    linked = True
    for shard in meta["shards"]:
        name = str(shard["name"])
        linked = shard_cls.link(out / name, tmp / name) and linked
    return linked


def append(
    cfg: BuildConfig, *, class_map: str = "keep", log: Callable[[str], None] | None = None
) -> AppendSummary:
    """Add the images of ``cfg.src`` to the dataset ``cfg.out`` as new shards.

    Args:
        cfg: the build options of the new images (see `append_config`); ``cfg.out`` is the
            dataset to grow, ``cfg.format`` must be its format.
        class_map: ``keep``: a class name OUT has not got is an error; ``grow``: new names get
            the next class ids, after OUT's.
        log: where progress messages go (default: stderr).

    Raises:
        NotADatasetError: OUT is not a packer dataset.
        ClassGrowthError: new class names without ``class_map="grow"``.
        InputError: a bad or duplicate input with ``on_error="fail"``.
        PackerError: nothing in SRC could be appended, or the filesystem cannot swap
            directories in one step (`packer.swap.ExchangeUnsupportedError`).
    """
    if class_map not in CLASS_GROWTH:
        raise PackerError(
            f"--class-map {class_map!r}: an append keeps the dataset's class list; expected "
            "keep (a new class name is an error) or grow (new names get the next ids)"
        )
    out, tmp = cfg.out, temp_dir_for(cfg.out)
    check_output(cfg, build_dir=tmp)
    with on_interrupt(f"{out} is unchanged; run the same command again"), build_lock(out):
        return _append(cfg, tmp, grow=class_map == "grow", log=log)


def _append(
    cfg: BuildConfig, tmp: Path, *, grow: bool, log: Callable[[str], None] | None
) -> AppendSummary:
    started = time.perf_counter()
    say = log or (lambda msg: print(msg, file=sys.stderr))
    out = cfg.out
    meta = read_dataset(out)
    if meta["format"] != cfg.format:
        raise PackerError(f"{out} is a {meta['format']} dataset, not {cfg.format}")
    if tmp.exists():  # an interrupted append or build, or the old dataset of a killed append
        say(f"removing {tmp}, left by an interrupted run")
        shutil.rmtree(tmp)
    entries, problems, classes, new_classes = _plan_entries(
        cfg, meta, grow=grow, exclude=(str(out), str(tmp))
    )
    old_paths = _index_paths(out)
    source_digest = plan_digest(entries, source_sizes(entries), _output_options(cfg))
    done = _appended_before(out, meta, source_digest, entries, old_paths)
    if done is not None:
        return AppendSummary.of_complete(out, cfg.src, done, time.perf_counter() - started)
    entries, dupes = _drop_duplicates(entries, old_paths, out)
    problems = sorted(problems + dupes, key=lambda p: p.path)
    if problems and cfg.on_error == "fail":
        raise InputError(problems[0].path, problems[0].reason, problems[0].message)
    if not entries:
        raise PackerError(
            f"nothing to append from {cfg.src}: no new images ({len(problems)} problems"
            + (f", e.g. {problems[0].path}: {problems[0].reason}" if problems else "")
            + f"); {out} is unchanged"
        )
    old_shards = len(meta["shards"])
    sizes = source_sizes(entries)
    shards = [
        ShardPlan(old_shards + s.number, s.start, s.stop)
        for s in plan_shards(sizes, cfg.shard_size)
    ]
    digest = plan_digest(entries, sizes, _output_options(cfg))
    shard_cls = FORMATS[cfg.format].writer
    tmp.mkdir()
    try:
        if not _link_old_shards(out, tmp, meta):
            say(f"{tmp.parent} does not take hard links: the old shards were copied")
        _checkpoint("linked")
        save_plan(tmp, digest, shards)
        run_engine(BuildJob(cfg, tmp, entries, shards, frozenset()), say=say, started=started)
        _checkpoint("shards")
        merged = merge_parts(
            tmp, [s.number for s in shards], shard_cls=shard_cls, after=(out, meta)
        )
        _checkpoint("index")
        added = merged.num_samples - int(meta["num_samples"])
        found = problems + merged.problems
        if added == 0:
            raise PackerError(
                f"no image under {cfg.src} could be appended ({len(found)} problems); "
                f"{out} is unchanged"
            )
        errors = [*_lines(out / ERRORS_NAME), *_jsonl(p.as_json() for p in found)]
        write_durably(tmp / ERRORS_NAME, errors)
        skipped = {p.path for p in found}
        collisions = name_collisions(e.file.rel for e in entries if e.file.rel not in skipped)
        notes = merged.notes + [n.as_json() for n in collisions]
        notes.sort(key=lambda n: (n["path"], n["reason"]))
        warnings = [*_lines(out / WARNINGS_NAME), *_jsonl(notes)]
        write_durably(tmp / WARNINGS_NAME, warnings)
        options = dict(meta.get("options") or {})
        history = list(options.get("appended") or [])
        history.append(
            {
                "source": str(cfg.src),
                "first_id": int(meta["num_samples"]),
                "num_samples": added,
                "first_shard": old_shards,
                "new_classes": new_classes,
                "source_digest": source_digest,
                "options": cfg.options(),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
        )
        options["appended"] = history
        new_meta = make_meta(
            format=cfg.format,
            num_samples=merged.num_samples,
            shards=merged.shards,
            classes=classes,
            label_source=str(meta.get("label_source")),
            class_map=meta.get("class_map"),
            label_kind=merged.label_kind,
            source=str(meta.get("source")),
            options=options,
            tool_version=__version__,
            payload_bytes=merged.payload_bytes,
            num_errors=len(errors),
            num_warnings=len(warnings),
            index_sha256=merged.index_sha256,
            index_fingerprint=fingerprint(tmp / INDEX_NAME),
            writer=shard_cls.describe(),
            plan_digest=digest,
        )
        (tmp / "plan.json").unlink(missing_ok=True)
        write_durably(tmp / META_NAME, json.dumps(new_meta, ensure_ascii=False, indent=2) + "\n")
        fsync_path(tmp)
        _checkpoint("meta")
        check_replaceable(out)  # again: OUT may have changed while the append ran
        exchange_dirs(out, tmp)
        _checkpoint("swapped")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)  # the old dataset's directory, now unnamed by OUT
    summary = AppendSummary(
        out=out,
        appended=added,
        skipped=len(found),
        first_id=int(meta["num_samples"]),
        shards=len(merged.shards) - old_shards,
        new_classes=new_classes,
        seconds=time.perf_counter() - started,
    )
    for p in found:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    return summary
