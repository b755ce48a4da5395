r"""``packer convert --to folder``: records as files under names that cannot leave OUT.

Every path component that comes from data (a class name, a file's base name) is made one safe
component by `safe_component`: ``/``, ``\``, ``%``, control characters (and the other line
breaks and bidirectional controls) and a leading ``.`` are written as ``%XX`` (the UTF-8
bytes, as in a URL), so no name is empty, ``.``, ``..``, hidden, or holds a separator, and a
name is cut to `MAX_NAME_BYTES`. Within a folder, names are unique ignoring case and Unicode
form (so the export also survives a copy to macOS or Windows) and never one of the export's
own files: a later name that would clash gets ``~1``, ``~2``, ... before its extension. Each
image whose exported path is not its natural one is listed in ``warnings.jsonl`` with the
reason (``unsafe_name`` or ``name_collision``) and ``exported_as``.

Files are created with ``O_EXCL`` in a staging folder and fsynced, then hard-linked (never
replacing anything) into their folder; every joined path is checked to be the folder plus one
component. A label that ``labels.txt`` cannot carry (a line break or a tab: it would inject
lines, or cut the label) makes its record a ``label_not_exportable`` problem instead.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.problems import NAME_COLLISION
from packer.scan import fold_name
from packer.terminal import unsafe_char
from readers.durable import fsync_path, write_durably, write_new_file
from readers.formats.layout import ERRORS_NAME, META_NAME, WARNINGS_NAME

LABELS_NAME = "labels.txt"
IMAGES_DIR = "images"
MARKER_NAME = ".packer-export.json"  # says "packer wrote this export" (--overwrite replaces it)
STAGING_DIR = ".staging"  # hidden: a data name never starts with "." (it is escaped)
UNSAFE_NAME = "unsafe_name"
LABEL_NOT_EXPORTABLE = "label_not_exportable"
MAX_NAME_BYTES = 200  # below NAME_MAX (255) with room for a ~N suffix and an extension
# names a class folder must not take: the export's own files (compared ignoring case)
RESERVED = (ERRORS_NAME, WARNINGS_NAME, LABELS_NAME, META_NAME, IMAGES_DIR)
_LINK_UNSUPPORTED = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK}


def safe_component(name: str, limit: int = MAX_NAME_BYTES) -> str:
    r"""`name` as one path component that stays where it is joined.

    ``/``, ``\``, ``%``, `unsafe_char` characters and a leading ``.`` become ``%XX`` escapes
    of their UTF-8 bytes; the result is cut to `limit` UTF-8 bytes (at a character), and an
    empty name becomes ``_``. Names that need none of this are returned unchanged.
    """
    pieces: list[str] = []
    size = 0
    for k, ch in enumerate(name):
        if ch in "/\\%" or (k == 0 and ch == ".") or unsafe_char(ch):
            piece = "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        else:
            piece = ch
        size += len(piece.encode("utf-8"))
        if size > limit:
            break
        pieces.append(piece)
    return "".join(pieces) or "_"


def join_inside(folder: Path, name: str) -> Path:
    """``folder / name``, checked to be `folder` plus exactly one component.

    Raises:
        ValueError: `name` is not one component (a bug: names come from `safe_component`).
    """
    path = folder / name
    norm = os.path.normpath(path)
    if (
        name in ("", ".", "..")
        or "/" in name
        or "\0" in name
        or name.startswith(".")
        or os.path.dirname(norm) != os.path.normpath(folder)
    ):
        raise ValueError(f"{name!r} is not one safe path component under {folder}")
    return path


def label_text(label: Any) -> str | None:
    r"""The label as ``labels.txt`` writes it, or None when a line cannot carry it.

    Text as it is, anything else as JSON; None when the text holds a tab or a line break
    (``\n``, ``\r`` or any other that ``str.splitlines`` breaks at).
    """
    text = label if isinstance(label, str) else json.dumps(label, ensure_ascii=False)
    if "\t" in text or len(f"x{text}x".splitlines()) > 1:
        return None
    return text


class _Names:
    """The names given out in one folder: unique ignoring case and Unicode form."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self.taken = {fold_name(r) for r in reserved}
        self.next: dict[str, int] = {}  # natural name -> the suffix to try next

    def claim(self, stem: str, ext: str = "") -> str:
        natural = fold_name(stem + ext)
        name, k = stem + ext, self.next.get(natural, 0)
        if k:
            name = f"{stem}~{k}{ext}"
        while fold_name(name) in self.taken:
            k += 1
            name = f"{stem}~{k}{ext}"
        self.next[natural] = k + 1
        self.taken.add(fold_name(name))
        return name


@dataclass(frozen=True)
class _Item:
    sid: int  # the exported sample's number (its staging file name)
    rel: str  # its path in IN
    base: str  # its natural file name
    label: Any


def _is_class_id(label: Any) -> bool:
    return isinstance(label, int) and not isinstance(label, bool)


class FolderExport:
    """Files staged as they come, named and placed by `finish` once the labels are known."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.staging = tmp / STAGING_DIR
        self.staging.mkdir()
        self.items: list[_Item] = []

    def add(self, rel: str, base: str, label: Any, data: bytes) -> None:
        """Write one image (created exclusively, fsynced) to be placed by `finish`."""
        sid = len(self.items)
        write_new_file(self.staging / f"{sid:09d}", data)
        self.items.append(_Item(sid, rel, base, label))

    def finish(self, classes: list[str] | None) -> list[dict[str, Any]]:
        """Class folders when every label is a class id, else ``images/`` + ``labels.txt``.

        Returns the ``warnings.jsonl`` objects of the images not exported under their natural
        path. Everything written is fsynced, and the staging folder is gone.
        """
        notes: list[dict[str, Any]] = []
        if self.items and all(_is_class_id(item.label) for item in self.items):
            self._class_folders(classes, notes)
        else:
            images = self._mkdir(self.tmp, _Names(), IMAGES_DIR)[0]
            names = _Names()
            lines = []
            for item in self.items:
                name = self._place(item, images, names, notes, None)
                lines.append(f"{IMAGES_DIR}/{name}\t{label_text(item.label)}\n")
            fsync_path(images)
            write_durably(self.tmp / LABELS_NAME, lines)
        self.staging.rmdir()
        fsync_path(self.tmp)
        return notes

    def _class_folders(self, classes: list[str] | None, notes: list[dict[str, Any]]) -> None:
        top = _Names(RESERVED)
        folders: dict[int, tuple[Path, tuple[str, str] | None, _Names]] = {}
        for value in sorted({item.label for item in self.items}):
            name = classes[value] if classes and 0 <= value < len(classes) else str(value)
            path, folder = self._mkdir(self.tmp, top, safe_component(name))
            why: tuple[str, str] | None = None
            if folder != name:
                reason = UNSAFE_NAME if safe_component(name) != name else NAME_COLLISION
                why = (reason, f"the class name {name!r} is exported as the folder {folder!r}")
            folders[value] = (path, why, _Names())
        for item in self.items:
            path, why, names = folders[item.label]
            self._place(item, path, names, notes, why)
        for path, _, _ in folders.values():
            fsync_path(path)

    def _mkdir(self, parent: Path, names: _Names, wanted: str) -> tuple[Path, str]:
        """Make a new folder in `parent` named `wanted` (or ``wanted~N`` when taken)."""
        while True:
            name = names.claim(wanted)
            path = join_inside(parent, name)
            try:
                path.mkdir()
            except FileExistsError:  # the file system folds names we did not: take the next
                continue
            return path, name

    def _place(
        self,
        item: _Item,
        folder: Path,
        names: _Names,
        notes: list[dict[str, Any]],
        why: tuple[str, str] | None,
    ) -> str:
        """Link the staged file of `item` into `folder` under a free name; return the name."""
        stem, ext = os.path.splitext(item.base)
        safe = safe_component(stem, MAX_NAME_BYTES - len(ext.encode("utf-8")))
        staged = self.staging / f"{item.sid:09d}"
        while True:
            name = names.claim(safe, ext)
            if _move_new(staged, join_inside(folder, name)):
                break
        reasons = [why] if why else []
        if safe != stem:
            reasons.append((UNSAFE_NAME, f"the file name {item.base!r} is not one safe name"))
        elif name != item.base:
            reasons.append((NAME_COLLISION, f"another image took the name {item.base!r}"))
        if reasons:
            where = folder.relative_to(self.tmp).as_posix()
            notes.append(
                {
                    "path": item.rel,
                    "reason": reasons[0][0],
                    "message": "; ".join(text for _, text in reasons),
                    "packed": True,
                    "exported_as": f"{where}/{name}",
                }
            )
        return name


def _move_new(staged: Path, target: Path) -> bool:
    """Move `staged` to the new name `target`; False when `target` exists (nothing replaced)."""
    try:
        os.link(staged, target, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _LINK_UNSUPPORTED:
            raise
        # no hard links here (FAT, some network file systems): this is our own folder, under
        # the build lock, so nothing can appear between the look and the rename
        if os.path.lexists(target):
            return False
        os.rename(staged, target)
        return True
    staged.unlink()
    return True
