"""``--class-map``: text labels (or lists of them) become class ids.

The ids come from a file of names or from ``auto`` (the sorted names found).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.errors import LabelSourceError
from packer.labels.common import UNKNOWN_CLASS, find_label_file, loads_label, shorten
from packer.problems import Problem
from packer.records import Entry


@dataclass(frozen=True)
class ClassMap:
    """Class names by id, and how they were made (``auto`` or ``file:<path>``)."""

    names: list[str]
    how: str

    def ids(self) -> dict[str, int]:
        """Return the class id of each name."""
        return {name: i for i, name in enumerate(self.names)}


def _names_from_json(obj: Any, path: Path) -> list[str]:
    if isinstance(obj, list) and all(isinstance(n, str) for n in obj):
        return obj
    if isinstance(obj, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in obj.values()
    ):
        by_id = {v: k for k, v in obj.items()}
        if sorted(by_id) != list(range(len(obj))):
            raise LabelSourceError(
                f"--class-map {path}: the ids {sorted(obj.values())[:10]} are not 0..{len(obj) - 1}"
                " each once; expected an object mapping each class name to its id"
            )
        return [by_id[i] for i in range(len(obj))]
    raise LabelSourceError(
        f"--class-map {path}: found JSON {type(obj).__name__}; expected a list of class names "
        "(index = id) or an object mapping names to ids 0..k-1"
    )


def load_class_map(spec: str, src: Path) -> ClassMap:
    """Read ``--class-map FILE``: one class name per line (line n holds id n-1), or JSON.

    Raises:
        LabelSourceError: the file is missing, unreadable, empty, has a blank line between
            names, or names a class twice.
    """
    path = find_label_file(spec, src)
    try:
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except FileNotFoundError:
        raise LabelSourceError(
            f"--class-map {path}: no such file; expected auto or a file of class names"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelSourceError(f"--class-map {path}: cannot read ({exc})") from exc
    names: list[str] | None = None
    if path.suffix.lower() == ".json" or text.lstrip()[:1] in ("[", "{"):
        try:
            obj = loads_label(text)
        except ValueError as exc:
            if path.suffix.lower() == ".json":
                raise LabelSourceError(f"--class-map {path}: not valid JSON ({exc})") from exc
        else:
            names = _names_from_json(obj, path)
    if names is None:
        lines = [line.strip() for line in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        if "" in lines:
            raise LabelSourceError(
                f"--class-map {path}:{lines.index('') + 1}: an empty line; expected one class "
                "name per line (line n is class id n-1)"
            )
        names = lines
    if not names:
        raise LabelSourceError(f"--class-map {path}: no class names")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise LabelSourceError(f"--class-map {path}: the class {name!r} is listed twice")
        seen.add(name)
    return ClassMap(names, f"file:{path}")


def class_names(labels: Iterable[Any]) -> list[str]:
    """The sorted text labels (and text items of list labels): ``--class-map auto``."""
    found: set[str] = set()
    for label in labels:
        if isinstance(label, str):
            found.add(label)
        elif isinstance(label, list):
            found.update(v for v in label if isinstance(v, str))
    return sorted(found)


def map_label(label: Any, ids: dict[str, int]) -> tuple[Any, str | None]:
    """A class name -> its id, a list of names -> their ids; else (None, why not)."""
    if isinstance(label, str):
        if label in ids:
            return ids[label], None
        return None, f"the class {shorten(label)} is not in the class map"
    if isinstance(label, list) and all(isinstance(v, str) for v in label):
        unknown = [v for v in label if v not in ids]
        if unknown:
            return None, f"the classes {unknown[:5]} are not in the class map"
        return [ids[v] for v in label], None
    return None, (
        f"the label {shorten(label)} is not a class name; --class-map maps text labels (or "
        "lists of them) to ids"
    )


def apply_class_map(
    items: list[tuple[Entry, str]], cmap: ClassMap, found: list[Problem]
) -> list[Entry]:
    """Return `items`' entries with their text labels mapped to class ids by `cmap`.

    An entry whose label names no class of `cmap` is dropped and reported in `found`.
    """
    ids = cmap.ids()
    entries: list[Entry] = []
    for entry, where in items:
        if not entry.labelled:
            entries.append(entry)
            continue
        value, why = map_label(entry.label, ids)
        if why is not None:
            found.append(Problem(entry.file.rel, UNKNOWN_CLASS, f"{why} ({where})"))
        else:
            entries.append(Entry(entry.file, value))
    return entries


class ClassGrowthError(LabelSourceError):
    """Labels name classes that the dataset has not got, and growing was not asked for."""

    def __init__(self, where: str, new: list[str], known: int) -> None:
        shown = ", ".join(repr(n) for n in new[:10]) + (", ..." if len(new) > 10 else "")
        super().__init__(
            f"{where}: {len(new)} class name(s) not among the dataset's {known} classes "
            f"({shown}); pass --class-map grow to add them after the existing ones (old ids "
            "stay as they are), or remove those images"
        )
        self.new = new


def unite_classes(
    known: list[str], found: list[str], *, grow: bool, where: str = "SRC"
) -> tuple[list[str], list[int]]:
    """Return the class names `known` followed by the names of `found` it lacks, in order.

    Each known name keeps its id; new names get the next ids. The second value maps each id of
    `found` to its id in the united list.

    Raises:
        ClassGrowthError: `found` has names `known` lacks and `grow` is False.
    """
    ids = {name: i for i, name in enumerate(known)}
    new = [name for name in found if name not in ids]
    if new and not grow:
        raise ClassGrowthError(where, new, len(known))
    united = [*known, *new]
    ids.update((name, len(known) + i) for i, name in enumerate(new))
    return united, [ids[name] for name in found]


def remap_label(label: Any, table: list[int]) -> Any:
    """A class id (or list of ids) -> ``table[id]``; any other label is returned as it is."""
    if isinstance(label, int) and not isinstance(label, bool):
        return table[label]
    if isinstance(label, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in label
    ):
        return [table[v] for v in label]
    return label
