"""Label sources: which files to pack and the label of each (class folders, list files, none)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer import problems as P
from packer.errors import LabelSourceError
from packer.problems import Problem
from packer.scan import ScanResult, SourceFile, resolve_entry, scan_tree

_INT = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class Entry:
    """One file to pack with its label (JSON-able: int, str, list, dict, or None).

    An entry without a label where one is required is still read, so that a file which is
    not an image is reported as such; one that is an image is then reported as ``no_label``.
    """

    file: SourceFile
    label: Any
    labelled: bool = True


@dataclass
class LabelPlan:
    entries: list[Entry]
    problems: list[Problem]
    source: str  # dirname | list:<file> | none
    classes: list[str] | None = None
    ignored: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def parse_label_text(text: str) -> Any:
    """A label from a list file: an int class id when it is one, else the text itself."""
    return int(text) if _INT.match(text) else text


def from_dirnames(scan: ScanResult) -> LabelPlan:
    """Class folders: the first directory under SRC is the class; ids are sorted names."""
    classes = list(scan.top_dirs)
    ids = {name: i for i, name in enumerate(classes)}
    entries: list[Entry] = []
    for f in scan.files:
        top, sep, _ = f.rel.partition("/")
        entries.append(Entry(f, ids[top]) if sep else Entry(f, None, labelled=False))
    return LabelPlan(entries, list(scan.problems), "dirname", classes=classes,
                     ignored=scan.ignored)


NO_LABEL_MESSAGE = "an image outside every class folder (labels from dirname)"


def split_list_line(line: str) -> tuple[str, str] | None:
    """``path<TAB>label`` (PaddleOCR) or ``path label`` (PaddleClas) -> (path, label)."""
    if "\t" in line:
        path, _, label = line.partition("\t")
    else:
        parts = line.rsplit(None, 1) if " " in line.strip() else []
        if len(parts) != 2:
            return None
        path, label = parts
    path, label = path.strip(), label.strip()
    if not path or not label:
        return None
    return path, label


def from_list_file(src: Path, list_path: Path) -> LabelPlan:
    """A list file of ``path<TAB>label`` or ``path label`` lines, paths relative to SRC.

    The list is the dataset: files under SRC that it does not name are not packed.
    """
    try:
        text = list_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LabelSourceError(f"--labels {list_path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelSourceError(f"--labels {list_path}: cannot read ({exc})") from exc
    found: list[Problem] = []
    seen: dict[str, int] = {}
    entries: list[Entry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parsed = split_list_line(line)
        if parsed is None:
            found.append(
                Problem(f"{list_path.name}:{number}", P.BAD_LINE,
                        f"{list_path}:{number}: expected 'path<TAB>label' or 'path label', "
                        f"got {line[:80]!r}")
            )
            continue
        rel, label = parsed
        source, problem = resolve_entry(src, rel)
        if problem is not None:
            found.append(Problem(problem.path, problem.reason,
                                 f"{problem.message} ({list_path.name}:{number})"))
            continue
        assert source is not None
        if source.rel in seen:
            found.append(
                Problem(source.rel, P.DUPLICATE,
                        f"listed again at {list_path.name}:{number} (first at line "
                        f"{seen[source.rel]}); the first entry is packed")
            )
            continue
        seen[source.rel] = number
        entries.append(Entry(source, parse_label_text(label)))
    entries.sort(key=lambda e: e.file.rel)
    found.sort(key=lambda p: p.path)
    return LabelPlan(entries, found, f"list:{list_path}")


def plan_labels(src: Path, spec: str, *, exclude: tuple[str, ...] = ()) -> LabelPlan:
    """Resolve ``--labels`` into the files to pack and their labels.

    Args:
        src: SRC.
        spec: ``auto`` (class folders when SRC has subfolders, else none), ``dirname``,
            ``none``, or the path of a list file.
        exclude: real paths the scan must not enter (the output being written).
    """
    if spec not in ("auto", "dirname", "none"):
        candidate = Path(spec)
        if not candidate.exists() and (src / spec).exists():
            candidate = src / spec
        return from_list_file(src, candidate)
    scan = scan_tree(src, exclude=exclude)
    if spec == "dirname" or (spec == "auto" and scan.top_dirs):
        if not scan.top_dirs:
            raise LabelSourceError(
                f"--labels dirname: {src} has no class folders (found only files); use "
                "--labels none or a list file"
            )
        return from_dirnames(scan)
    return LabelPlan(
        [Entry(f, None) for f in scan.files], list(scan.problems), "none", ignored=scan.ignored
    )
