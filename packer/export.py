"""``packer convert --to webdataset|folder``: records written out as tar shards or files.

- ``webdataset``: ``%06d.tar`` shards of at most ``--shard-size`` bytes (at least one sample
  each); sample key = the zero-padded id, members ``KEY.<ext>`` (the stored bytes) and
  ``KEY.cls`` (an int label), ``KEY.txt`` (a text label) or ``KEY.json`` (any other label).
- ``folder``: when every label is a class id, one folder per class (named by IN's class names,
  else by the id) holding the stored bytes under their original file names; otherwise
  ``images/`` plus ``labels.txt`` (``images/NAME<TAB>label`` lines, as PaddleOCR writes them:
  text as is, anything else as compact JSON).

Both are written into ``.OUT.partial`` and renamed into place when complete (under the build
lock), with ``errors.jsonl`` listing the records that could not be exported.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.build import BuildSummary, publish_output, temp_dir_for
from packer.engines import progress_bar
from packer.errors import InputError, OutputExistsError
from packer.output import build_lock, check_output_apart, prepare_parent
from packer.problems import Problem
from packer.records import Record
from packer.repack import RepackSource
from readers.durable import fsync_path, write_durably
from readers.formats.layout import ERRORS_NAME

if TYPE_CHECKING:
    from packer.convert import ConvertConfig

LABELS_NAME = "labels.txt"
IMAGES_DIR = "images"
NOT_EXPORTABLE = "not_exportable"

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


def _unique(folder: str, base: str, i: int, taken: set[str]) -> str:
    name = f"{folder}/{base}"
    if name in taken:
        name = f"{folder}/{i:06d}_{base}"
    taken.add(name)
    return name


def export(
    cfg: ConvertConfig, source: RepackSource, *, log: Callable[[str], None] | None = None
) -> BuildSummary:
    """Write the records of `source` as ``cfg.to`` (webdataset or folder) at ``cfg.out``.

    Raises:
        OutputExistsError: OUT exists (without overwrite).
        InputError: a bad record with ``on_error="fail"``.
        UnsafeOutputError, NotADatasetError, OutputParentError, BuildLockedError: as for build.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr))
    started = time.perf_counter()
    out, tmp = cfg.out, temp_dir_for(cfg.out)
    check_output_apart(out, source.inputs, build_dir=tmp, overwrite=cfg.overwrite)
    prepare_parent(out)
    with build_lock(out):
        if (out.exists() or out.is_symlink()) and not cfg.overwrite:
            raise OutputExistsError(str(out))
        if tmp.exists():
            say(f"removing the unfinished export {tmp} left by an interrupted run")
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            summary = _write(cfg, source, tmp)
            publish_output(tmp, out, overwrite=cfg.overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    summary.out = out
    summary.seconds = time.perf_counter() - started
    return summary


def _write(cfg: ConvertConfig, source: RepackSource, tmp: Path) -> BuildSummary:
    problems = list(source.problems)
    summary = BuildSummary(out=cfg.out)
    shards = _TarShards(tmp, cfg.shard_size) if cfg.to == "webdataset" else None
    listed: list[tuple[str, str, Any]] = []  # folder: (name under images/, file name, label)
    taken: set[str] = set()
    total = len(source.sizes)
    with progress_bar(total, cfg.progress) as bar:
        for item in source.read(0, total):
            bar.update(1)
            ext = _ext(item) if isinstance(item, Record) else None
            if isinstance(item, Record) and ext is None:
                item = Problem(
                    item.rel,
                    NOT_EXPORTABLE,
                    f"stored as {item.format}, which is no image file format (--encode raw?)",
                )
            if isinstance(item, Problem):
                if cfg.on_error == "fail":
                    raise InputError(item.path, item.reason, item.message)
                problems.append(item)
                continue
            assert ext is not None
            if shards is not None:
                key = f"{summary.packed:06d}"
                label = _label_member(item.label)
                shards.add(key, [(ext, item.data)] + ([label] if label else []))
            else:
                base = _file_name(item, summary.packed, ext)
                name = _unique(IMAGES_DIR, base, summary.packed, taken)
                (tmp / IMAGES_DIR).mkdir(exist_ok=True)
                (tmp / name).write_bytes(item.data)
                listed.append((name, base, item.label))
            summary.packed += 1
            summary.bytes += len(item.data)
    if shards is not None:
        shards.close()
        summary.shards = shards.number
    else:
        _finish_folder(tmp, listed, source.classes)
    write_durably(
        tmp / ERRORS_NAME, [json.dumps(p.as_json(), ensure_ascii=False) + "\n" for p in problems]
    )
    summary.skipped = len(problems)
    for p in problems:
        summary.reasons[p.reason] = summary.reasons.get(p.reason, 0) + 1
    return summary


def _finish_folder(
    tmp: Path, listed: list[tuple[str, str, Any]], classes: list[str] | None
) -> None:
    """Class folders when every label is a class id, else ``labels.txt`` beside ``images/``."""
    ints = bool(listed) and all(
        isinstance(label, int) and not isinstance(label, bool) for _, _, label in listed
    )
    if not ints:
        lines = []
        for name, _, label in listed:
            text = label if isinstance(label, str) else json.dumps(label, ensure_ascii=False)
            lines.append(f"{name}\t{text}\n")
        write_durably(tmp / LABELS_NAME, lines)
        return
    taken: set[str] = set()
    for i, (name, base, label) in enumerate(listed):
        folder = classes[label] if classes and 0 <= label < len(classes) else str(label)
        target = _unique(folder, base, i, taken)
        (tmp / folder).mkdir(exist_ok=True)
        os.rename(tmp / name, tmp / target)
    (tmp / IMAGES_DIR).rmdir()
