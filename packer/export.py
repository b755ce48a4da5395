"""``packer convert --to webdataset|folder``: records written out as tar shards or files.

- ``webdataset``: ``%06d.tar`` shards of at most ``--shard-size`` bytes (at least one sample
  each); sample key = the zero-padded id, members ``KEY.<ext>`` (the stored bytes) and
  ``KEY.cls`` (an int label), ``KEY.txt`` (a text label) or ``KEY.json`` (any other label).
- ``folder``: when every label is a class id, one folder per class (named by IN's class names,
  else by the id) holding the stored bytes under their original file names; otherwise
  ``images/`` plus ``labels.txt`` (``images/NAME<TAB>label`` lines, as PaddleOCR writes them:
  text as is, anything else as JSON). Names from data are made safe and unique, and records
  whose label a line cannot carry are skipped: see `packer.export_folder`.

Both are written into ``.OUT.partial`` and renamed into place when complete (under the build
lock), with ``errors.jsonl`` listing the records that could not be exported and
``.packer-export.json`` marking the folder as an export packer wrote, so that ``--overwrite``
may replace it (as it replaces a packer dataset, and nothing else).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer import __version__
from packer.build import BuildSummary, publish_output, temp_dir_for
from packer.engines import progress_bar
from packer.errors import InputError, NotADatasetError, OutputExistsError
from packer.export_folder import (
    LABEL_NOT_EXPORTABLE,
    MARKER_NAME,
    FolderExport,
    label_text,
)
from packer.feedback import on_interrupt
from packer.labels.common import shorten
from packer.output import build_lock, check_output_apart, check_replaceable, prepare_parent
from packer.problems import Problem
from packer.records import Record
from packer.repack import RepackSource
from readers.durable import fsync_path, write_durably
from readers.formats.layout import ERRORS_NAME, WARNINGS_NAME

if TYPE_CHECKING:
    from packer.convert import ConvertConfig

NOT_EXPORTABLE = "not_exportable"
EXPORTS = ("webdataset", "folder")

# the file extension of each stored image format
EXTENSIONS = {
    "jpeg": "jpg",
    "png": "png",
    "webp": "webp",
    "bmp": "bmp",
    "tiff": "tif",
    "pnm": "ppm",
}


def _ext(record: Record) -> str | None:
    return EXTENSIONS.get(record.format)


def _label_member(label: Any) -> tuple[str, bytes] | None:
    if label is None:
        return None
    if isinstance(label, int) and not isinstance(label, bool):
        return "cls", str(label).encode()
    if isinstance(label, str):
        return "txt", label.encode("utf-8")
    return "json", json.dumps(label, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same bytes for the same records
    tar.addfile(info, io.BytesIO(data))


class _TarShards:
    """Writes ``%06d.tar`` shards, rolled over at `limit` bytes."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root, self.limit = root, limit
        self.number, self.size, self.count = 0, 0, 0
        self.tar: tarfile.TarFile | None = None

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        size = sum(512 + len(d) + (-len(d) % 512) for _, d in members)
        if self.tar is not None and self.size + size > self.limit:
            self.close()
        if self.tar is None:
            self.tar = tarfile.open(  # noqa: SIM115 - closed by close()
                self.root / f"{self.number:06d}.tar", "w", format=tarfile.USTAR_FORMAT
            )
            self.size = 0
        for ext, data in members:
            _add(self.tar, f"{key}.{ext}", data)
        self.size += size
        self.count += 1

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            fsync_path(self.root / f"{self.number:06d}.tar")
            self.tar = None
            self.number += 1


def _file_name(record: Record, i: int, ext: str) -> str:
    """The record's original file name when its path has one of its format, else ``ID.EXT``."""
    base = record.rel.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    if "." not in base or os.path.splitext(base)[1].lower().lstrip(".") not in (ext, "jpeg"):
        base = f"{i:06d}.{ext}"
    return base


def export(
    cfg: ConvertConfig, source: RepackSource, *, log: Callable[[str], None] | None = None
) -> BuildSummary:
    """Write the records of `source` as ``cfg.to`` (webdataset or folder) at ``cfg.out``.

    Raises:
        OutputExistsError: OUT exists (without overwrite).
        InputError: a bad record with ``on_error="fail"``.
        NotADatasetError: ``overwrite`` onto something that is neither a packer dataset, nor an
            export packer wrote, nor an empty directory.
        UnsafeOutputError, OutputParentError, BuildLockedError: as for build.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr))
    started = time.perf_counter()
    out, tmp = cfg.out, temp_dir_for(cfg.out)
    check_output_apart(out, source.inputs, build_dir=tmp, overwrite=False)
    if cfg.overwrite:
        check_export_replaceable(out)
    prepare_parent(out)
    unchanged = f"nothing was written to {out}; run the same command again"
    with on_interrupt(unchanged), build_lock(out):
        if (out.exists() or out.is_symlink()) and not cfg.overwrite:
            raise OutputExistsError(str(out))
        if tmp.exists():
            say(f"removing the unfinished export {tmp} left by an interrupted run")
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            summary, renamed = _write(cfg, source, tmp)
            _publish(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if renamed:
        say(f"{renamed} images exported under another name than their own: see {WARNINGS_NAME}")
    summary.out = out
    summary.seconds = time.perf_counter() - started
    return summary


def marker_problem(out: Path) -> str | None:
    """Why the directory `out` is not an export packer wrote, or None when it is one."""
    try:
        with open(out / MARKER_NAME, "rb") as f:
            marker = json.loads(f.read(1 << 16).decode("utf-8"))
    except FileNotFoundError:
        return f"holds no {MARKER_NAME}"
    except (OSError, ValueError) as exc:
        return f"has a {MARKER_NAME} that cannot be read ({exc})"
    if not isinstance(marker, dict) or marker.get("export") not in EXPORTS:
        return f"has a {MARKER_NAME} that is not packer's"
    return None


def check_export_replaceable(out: Path) -> None:
    """Refuse to let ``--overwrite`` replace `out` unless packer wrote it.

    An export packer wrote (a directory with its `MARKER_NAME`), a packer dataset, an empty
    directory and a missing `out` may be replaced; a symbolic link never is.

    Raises:
        NotADatasetError: what `out` is instead, and how to go on.
    """
    if out.is_dir() and not out.is_symlink() and marker_problem(out) is None:
        return
    try:
        check_replaceable(out)
    except NotADatasetError as exc:
        if not out.is_dir() or out.is_symlink():
            raise
        raise NotADatasetError(
            str(out),
            f"is not a packer dataset ({exc}) and not an export packer wrote (it "
            f"{marker_problem(out)})",
            f"remove {out} yourself if it should go (exports written before packer marked "
            "them have no marker), or choose another OUT",
        ) from None


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` to `out`, replacing an old `out` that may be replaced."""
    if not (out.exists() or out.is_symlink()):
        publish_output(tmp, out, overwrite=False)
        return
    check_export_replaceable(out)  # again: OUT may have changed while the export ran
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    try:
        publish_output(tmp, out, overwrite=False)
    except BaseException:
        if not out.exists():
            os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write(cfg: ConvertConfig, source: RepackSource, tmp: Path) -> tuple[BuildSummary, int]:
    """Write the export into `tmp`; return its summary and the number of renamed images."""
    problems = list(source.problems)
    summary = BuildSummary(out=cfg.out, export=cfg.to)
    shards = _TarShards(tmp, cfg.shard_size) if cfg.to == "webdataset" else None
    folder = FolderExport(tmp) if shards is None else None
    total = len(source.sizes)
    with progress_bar(total, cfg.progress) as bar:
        for item in source.read(0, total):
            bar.update(1)
            if isinstance(item, Record):
                item = _exportable(item, folder is not None)
            if isinstance(item, Problem):
                if cfg.on_error == "fail":
                    raise InputError(item.path, item.reason, item.message)
                problems.append(item)
                continue
            ext = _ext(item)
            assert ext is not None
            if shards is not None:
                key = f"{summary.packed:06d}"
                label = _label_member(item.label)
                shards.add(key, [(ext, item.data)] + ([label] if label else []))
            elif folder is not None:
                base = _file_name(item, summary.packed, ext)
                folder.add(item.rel, base, item.label, item.data)
            summary.packed += 1
            summary.bytes += len(item.data)
    notes: list[dict[str, Any]] = []
    if shards is not None:
        shards.close()
        summary.shards = shards.number
    elif folder is not None:
        notes = folder.finish(source.classes)
        write_durably(
            tmp / WARNINGS_NAME, [json.dumps(n, ensure_ascii=False) + "\n" for n in notes]
        )
    write_durably(
        tmp / ERRORS_NAME, [json.dumps(p.as_json(), ensure_ascii=False) + "\n" for p in problems]
    )
    marker = {
        "export": cfg.to,
        "version": 1,
        "num_samples": summary.packed,
        "num_errors": len(problems),
        "source": str(source.source or cfg.src),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
    }
    write_durably(tmp / MARKER_NAME, json.dumps(marker, indent=2) + "\n")
    summary.skipped = len(problems)
    for p in problems:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    return summary, len(notes)


def _exportable(record: Record, folder: bool) -> Record | Problem:
    """`record`, or the problem that keeps it out of the export."""
    if _ext(record) is None:
        return Problem(
            record.rel,
            NOT_EXPORTABLE,
            f"stored as {record.format}, which is no image file format (--encode raw?)",
        )
    label = record.label
    class_id = isinstance(label, int) and not isinstance(label, bool)
    if folder and not class_id and label_text(label) is None:
        return Problem(
            record.rel,
            LABEL_NOT_EXPORTABLE,
            f"the label {shorten(label)} holds a tab or a line break, which a labels.txt line "
            "cannot carry; --to webdataset keeps it (in KEY.txt)",
        )
    return record
