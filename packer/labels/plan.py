"""``--labels`` resolved into one :class:`LabelPlan`.

The plan holds the entries to pack and the per-entry problems, from a keyword source (dirname,
sidecar, none, auto) or merged label files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import problems as P
from packer.errors import LabelSourceError
from packer.labels.classmap import ClassMap, apply_class_map, class_names, load_class_map
from packer.labels.common import KEYWORDS, Parsed, find_label_file
from packer.labels.detect import read_label_file
from packer.labels.dirname import dirname_labels
from packer.labels.sidecar import sidecar_labels
from packer.problems import Problem
from packer.records import Entry
from packer.scan import ScanResult, resolve_entry, scan_tree


@dataclass
class LabelPlan:
    """The files to pack with their labels, the problems found, and where the labels came from.

    Where they came from (``source``, ``classes``, ``class_map``) is written to meta.json.
    """

    entries: list[Entry]
    problems: list[Problem]
    source: str  # dirname | sidecar | none | <kind>:<file>[, <kind>:<file> ...]
    classes: list[str] | None = None  # class names by id, when labels are class ids
    ignored: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    class_map: str | None = None  # how names became ids: "auto" or "file:<path>"


def _resolve_listed(
    src: Path, files: list[tuple[Path, Parsed]]
) -> tuple[list[tuple[Entry, str]], list[Problem]]:
    """Check every listed path (inside SRC, present), keep the first of duplicates."""
    items: list[tuple[Entry, str]] = []
    found: list[Problem] = []
    first: dict[str, str] = {}
    for _, parsed in files:
        found.extend(parsed.bad)
        for listed in parsed.listed:
            if "\x00" in listed.path:
                found.append(
                    Problem(
                        listed.path.replace("\x00", "\\x00"),
                        P.BAD_NAME,
                        f"the name holds a NUL byte ({listed.where})",
                    )
                )
                continue
            source, problem = resolve_entry(src, listed.path)
            if problem is not None:
                found.append(
                    Problem(problem.path, problem.reason, f"{problem.message} ({listed.where})")
                )
                continue
            assert source is not None
            if source.rel in first:
                found.append(
                    Problem(
                        source.rel,
                        P.DUPLICATE,
                        f"listed again at {listed.where} (first at {first[source.rel]}); "
                        "the first entry is packed",
                    )
                )
                continue
            first[source.rel] = listed.where
            entry = Entry(source, listed.label, listed.labelled, listed.note)
            items.append((entry, listed.where))
    return items, found


def from_label_files(src: Path, specs: Sequence[str], *, class_map: str | None = None) -> LabelPlan:
    """List files and manifests, merged; the lists *are* the dataset.

    Unlisted files are not packed. Paths are relative to SRC; an entry listed twice (in one
    file or two) is packed once, as first listed, and the repeat reported.
    """
    names = class_map is not None
    files = [(p, read_label_file(p, names=names)) for p in (find_label_file(s, src) for s in specs)]
    items, found = _resolve_listed(src, files)
    source = ", ".join(
        f"{'list' if parsed.kind in ('detection', 'multilabel') else parsed.kind}:{p}"
        for p, parsed in files
    )
    plan = LabelPlan([], found, source, extra={"kinds": [parsed.kind for _, parsed in files]})
    if class_map is None:
        plan.entries = [entry for entry, _ in items]
    else:
        every = (listed.label for _, parsed in files for listed in parsed.listed if listed.labelled)
        _finish_class_map(plan, items, src, class_map, every)
    plan.entries.sort(key=lambda e: e.file.rel)
    plan.problems.sort(key=lambda p: p.path)
    return plan


def _finish_class_map(
    plan: LabelPlan,
    items: list[tuple[Entry, str]],
    src: Path,
    spec: str,
    labels: Iterable[Any],
) -> None:
    cmap = ClassMap(class_names(labels), "auto") if spec == "auto" else load_class_map(spec, src)
    plan.entries = apply_class_map(items, cmap, plan.problems)
    plan.classes = cmap.names
    plan.class_map = cmap.how


def check_specs(specs: Sequence[str]) -> None:
    """Raise LabelSourceError unless `specs` is one keyword or one or more label files."""
    if not specs:
        raise LabelSourceError("--labels: no label source given")
    keywords = [s for s in specs if s in KEYWORDS]
    if keywords and len(specs) > 1:
        raise LabelSourceError(
            f"--labels {keywords[0]} cannot be combined with other --labels; several --labels "
            "are for label files (list files and manifests), merged"
        )


def _sidecar_plan(scan: ScanResult, src: Path, class_map: str | None) -> LabelPlan:
    items, bad, both = sidecar_labels(scan)
    plan = LabelPlan(
        [],
        [*scan.problems, *bad],
        "sidecar",
        ignored=scan.ignored,
        extra={"sidecar_both": both},
    )
    if class_map is None:
        plan.entries = [entry for entry, _ in items]
    else:
        labels = (entry.label for entry, _ in items if entry.labelled)
        _finish_class_map(plan, items, src, class_map, labels)
    plan.problems.sort(key=lambda p: p.path)
    return plan


def _dirname_plan(
    scan: ScanResult,
    src: Path,
    *,
    depth: int,
    exclude: tuple[str, ...],
    class_map: str | None,
) -> LabelPlan:
    if not scan.top_dirs:
        raise LabelSourceError(
            f"--labels dirname: {src} has no class folders (found only files); use "
            "--labels none or a list file"
        )
    classes, items = dirname_labels(scan, src, depth=depth, exclude=exclude)
    if not classes:
        raise LabelSourceError(
            f"--labels dirname --label-depth {depth}: no folders {depth} levels under {src} "
            f"(found the top-level folders {scan.top_dirs[:10]}); use a smaller "
            "--label-depth"
        )
    plan = LabelPlan([], list(scan.problems), "dirname", ignored=scan.ignored)
    if class_map is None or class_map == "auto":
        plan.entries = apply_class_map(items, ClassMap(classes, "auto"), plan.problems)
        plan.classes, plan.class_map = classes, "auto"
    else:
        _finish_class_map(plan, items, src, class_map, ())
    plan.problems.sort(key=lambda p: p.path)
    return plan


def plan_labels(
    src: Path,
    spec: str | Sequence[str],
    *,
    exclude: tuple[str, ...] = (),
    depth: int = 1,
    class_map: str | None = None,
) -> LabelPlan:
    """Resolve ``--labels`` into the files to pack and their labels.

    Args:
        src: SRC.
        spec: ``auto`` (class folders when SRC has subfolders, else none), ``dirname``,
            ``sidecar``, ``none``, or the path(s) of label files: list files (PaddleOCR,
            PaddleClas), MXNet ``.lst``, ``.jsonl`` or ``.csv`` manifests, merged.
        exclude: real paths the scan must not enter (the output being written).
        depth: for class folders, how many folder levels name the class.
        class_map: ``auto`` or a file of class names: text labels become class ids.

    Raises:
        LabelSourceError: a label source that cannot be used at all.
    """
    specs = (spec,) if isinstance(spec, str) else tuple(spec)
    check_specs(specs)
    if specs[0] not in KEYWORDS:
        return from_label_files(src, specs, class_map=class_map)
    kind = specs[0]
    scan = scan_tree(src, exclude=exclude)
    if kind == "sidecar":
        return _sidecar_plan(scan, src, class_map)
    if kind == "dirname" or (kind == "auto" and scan.top_dirs):
        return _dirname_plan(scan, src, depth=depth, exclude=exclude, class_map=class_map)
    if class_map is not None:
        raise LabelSourceError(
            f"--class-map {class_map}: there are no labels to map (--labels {kind}"
            + (" found no class folders under SRC" if kind == "auto" else "")
            + ")"
        )
    return LabelPlan(
        [Entry(f, None) for f in scan.files], list(scan.problems), "none", ignored=scan.ignored
    )
