"""Walk SRC into a sorted list of candidate image files, reporting what cannot be packed."""

from __future__ import annotations

import os
import stat
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packer import problems as P
from packer.problems import Note, Problem
from readers.formats.images import IMAGE_EXTENSIONS

# Label and metadata files that live beside images; never reported as "not an image".
METADATA_EXTENSIONS = frozenset(
    {
        ".txt",
        ".json",
        ".jsonl",
        ".csv",
        ".tsv",
        ".lst",
        ".md",
        ".xml",
        ".yaml",
        ".yml",
        ".idx",
        ".rec",
        ".mdb",
        ".parquet",
    }
)


@dataclass(frozen=True)
class SourceFile:
    """A file under SRC: `rel` is its path relative to SRC with POSIX separators."""

    rel: str
    path: str

    @property
    def has_image_extension(self) -> bool:
        """Return whether the file's extension is an image extension (any case)."""
        return os.path.splitext(self.rel)[1].lower() in IMAGE_EXTENSIONS


@dataclass
class ScanResult:
    """What a scan of SRC found: its files, its problems and its top-level directories."""

    files: list[SourceFile] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    top_dirs: list[str] = field(default_factory=list)  # non-hidden directories right under SRC
    ignored: int = 0  # label and metadata files skipped silently


def check_name(rel: str) -> str | None:
    """Why `rel` cannot be stored as a path in the index, or None when it can."""
    if "\t" in rel or "\n" in rel or "\r" in rel:
        return "the name holds a tab or newline, which list files and logs cannot carry"
    if rel.isascii():
        return None
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    return None


def _printable(rel: str) -> str:
    return rel.encode("utf-8", "backslashreplace").decode("utf-8")


def _inside(root_real: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _add_file(result: ScanResult, rel: str, entry: os.DirEntry[str]) -> None:
    """A regular file found by the scan: a candidate, a metadata file, or a bad name."""
    if os.path.splitext(entry.name)[1].lower() in METADATA_EXTENSIONS:
        result.ignored += 1
        return
    why = check_name(rel)
    if why is not None:
        result.problems.append(Problem(_printable(rel), P.BAD_NAME, why))
        return
    result.files.append(SourceFile(rel, entry.path))


def scan_tree(src: str | os.PathLike[str], *, exclude: tuple[str, ...] = ()) -> ScanResult:
    """List the files under `src` in sorted order of their relative POSIX paths.

    Hidden files and folders (names starting with ``.``) are skipped; symlinks are followed,
    each directory is visited once, and links that leave `src` are refused.  Label and
    metadata files (``.txt``, ``.json``, ...) are counted in ``ignored``.  Non-regular files,
    broken links, loops and names that cannot be stored become problems.

    Args:
        src: the root directory.
        exclude: real paths never to enter (the output directory when it lies inside `src`).
    """
    root = os.fspath(src)
    root_real = os.path.realpath(root)
    excluded = {os.path.realpath(p) for p in exclude}
    result = ScanResult()
    visited: set[tuple[int, int]] = set()
    st = os.stat(root)
    visited.add((st.st_dev, st.st_ino))
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            result.problems.append(
                Problem(prefix or ".", P.UNREADABLE, f"cannot list the directory ({exc})")
            )
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{prefix}{entry.name}"
            if entry.is_file(follow_symlinks=False):
                # the directory entry's type says a regular file (not a link): no stat needed
                _add_file(result, rel, entry)
                continue
            shown = _printable(rel)
            try:
                info = entry.stat(follow_symlinks=True)
            except OSError:
                result.problems.append(Problem(shown, P.BROKEN_LINK, "a symlink to nothing"))
                continue
            if entry.is_symlink() and not _inside(root_real, entry.path):
                result.problems.append(
                    Problem(shown, P.OUTSIDE_SRC, "a symlink that points outside SRC")
                )
                continue
            if stat.S_ISDIR(info.st_mode):
                if os.path.realpath(entry.path) in excluded:
                    continue
                ident = (info.st_dev, info.st_ino)
                if ident in visited:
                    result.problems.append(
                        Problem(shown, P.SYMLINK_LOOP, "a directory already visited (link loop)")
                    )
                    continue
                visited.add(ident)
                if not prefix:
                    result.top_dirs.append(entry.name)
                stack.append((entry.path, rel + "/"))
                continue
            if not stat.S_ISREG(info.st_mode):
                result.problems.append(
                    Problem(shown, P.NOT_REGULAR, "not a regular file (FIFO, socket or device)")
                )
                continue
            _add_file(result, rel, entry)
    result.files.sort(key=lambda f: f.rel)
    result.top_dirs.sort()
    result.problems.sort(key=lambda p: p.path)
    return result


def resolve_entry(src: Path, rel: str) -> tuple[SourceFile | None, Problem | None]:
    """Check a path named by a label file: inside SRC, present, a regular file."""
    clean = rel.replace("\\", "/")
    if os.path.isabs(rel) or clean.startswith("/"):
        return None, Problem(rel, P.OUTSIDE_SRC, "an absolute path; list paths relative to SRC")
    parts = [p for p in clean.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, Problem(rel, P.OUTSIDE_SRC, "a path with '..' that may leave SRC")
    norm = "/".join(parts)
    why = check_name(norm)
    if why is not None:
        return None, Problem(_printable(rel), P.BAD_NAME, why)
    path = os.path.join(src, *parts)
    if not _inside(os.path.realpath(src), path):
        return None, Problem(norm, P.OUTSIDE_SRC, "resolves (through a link) outside SRC")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None, Problem(norm, P.MISSING, "listed but not found under SRC")
    except OSError as exc:
        return None, Problem(norm, P.UNREADABLE, f"cannot stat ({exc})")
    if not stat.S_ISREG(info.st_mode):
        return None, Problem(norm, P.NOT_REGULAR, "not a regular file")
    return SourceFile(norm, path), None


def fold_name(rel: str) -> str:
    """Return `rel` as a case-insensitive, normalization-insensitive file system sees it.

    This is Unicode canonical caseless matching: ``NFD(casefold(NFD(rel)))``.
    """
    if rel.isascii():
        return rel.lower()
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", rel).casefold())


def name_collisions(rels: Iterable[str]) -> list[Note]:
    """Paths that differ only by case or Unicode normalization (``A.png``/``a.png``, NFC/NFD).

    Policy: every such path is a different file on the file system we read, so all are packed;
    each one after the first (in sorted order) of a group gets a ``name_collision`` note,
    because the paths would name one file on a case-insensitive or normalizing file system
    (macOS, Windows) and label files that match names loosely could confuse them.

    Names are compared by a 64-bit hash first (about 16 bytes per path beyond the list), and
    only the paths whose hashes collide are folded again and grouped.
    """
    names = list(rels)
    if len(names) < 2:
        return []
    hashes = np.fromiter((hash(fold_name(r)) for r in names), dtype=np.int64, count=len(names))
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if same.size == 0:
        return []
    candidates = np.union1d(order[same], order[same + 1])
    groups: dict[str, list[str]] = {}
    for i in candidates.tolist():
        groups.setdefault(fold_name(names[i]), []).append(names[i])
    notes = []
    for group in groups.values():
        if len(group) < 2:
            continue
        first, *rest = sorted(group)
        for rel in rest:
            if unicodedata.normalize("NFC", rel) == unicodedata.normalize("NFC", first):
                how = f"the same text in another Unicode normalization form: {first!a}, {rel!a}"
            else:
                how = "a name that differs only by letter case"
            notes.append(
                Note(
                    _printable(rel),
                    P.NAME_COLLISION,
                    f"collides with {_printable(first)!r} ({how}); both packed, but they would "
                    "be one file on a case-insensitive or normalizing file system (macOS, "
                    "Windows)",
                )
            )
    notes.sort(key=lambda n: n.path)
    return notes
