"""``packer convert IN OUT``: a dataset that exists already, in packer's format or exported.

IN is anything ``open_dataset`` reads: a packer dataset (either format), a bare PaddleOCR-layout
LMDB, a bare MXNet ``.rec``/``.idx`` pair (InsightFace's header record skipped), or a directory
of WebDataset ``.tar`` shards. The stored bytes and labels are kept. Records are read as stored
(``ShardFormat.read_stored`` and ``stored_records``: paddle is never imported), and only what
the decode check needs is decoded: a packer dataset's records were checked when it was built
and are taken with their index description (width, height, format, CRC-32, checked against the
bytes), while a bare input's records pass `packer.prepare.prepare_bytes`, the same proof a
build makes (``--no-decode-check``: headers only). OUT is written by `packer.repack` (or
`packer.export` for ``--to webdataset|folder``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from packer.build import BuildSummary
from packer.errors import ConfigError, InputError, PackerError
from packer.labels.common import nonfinite_label
from packer.packed import PackedRecords
from packer.problems import BAD_LABEL, UNREADABLE, WH_MISMATCH, Note, Problem
from packer.records import Record
from packer.repack import Item, RepackConfig, RepackSource, repack
from readers.errors import ReaderError
from readers.formats import BARE_FORMATS, REGISTRY
from readers.formats.base import StatedSize, StoredProblem
from readers.formats.layout import META_NAME

TARGETS = ("packer", "webdataset", "folder")


class ConvertInputError(PackerError):
    """IN is not a dataset convert can read."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"IN {path}: {reason}; expected a packer dataset ({META_NAME}), "
            + ", ".join(f.bare_hint for f in BARE_FORMATS.values())
        )


@dataclass(frozen=True)
class ConvertConfig:
    """Everything ``packer convert`` was asked to do."""

    src: Path
    out: Path
    format: str = next(iter(REGISTRY))
    to: str = "packer"
    shard_size: int = 1 << 30
    decode_check: bool = True
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.to not in TARGETS:
            raise ConfigError(f"--to {self.to!r}: expected one of {', '.join(TARGETS)}")
        if self.resume and self.to != "packer":
            raise ConfigError(
                f"--resume applies to --to packer; an export (--to {self.to}) is rewritten "
                "from the start (drop --resume)"
            )
        RepackConfig(self.out, self.format, self.shard_size, self.on_error)  # validates


@dataclass
class ConvertInput:
    """IN opened for conversion: its records as `Item` values, described before reading."""

    source: RepackSource
    kind: str  # packer | a bare format's name


def _file_identity(paths: list[Path]) -> str:
    parts = []
    for path in paths:
        st = os.stat(path)
        parts.append(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def _open_packed(root: Path) -> ConvertInput:
    records = PackedRecords(root)
    index = records.index
    meta = index.meta
    files = [root / META_NAME] + [
        root / f for name in index.shard_names for f in records.fmt.shard_files(name)
    ]
    identity = f"{meta.get('index_sha256')}\n{_file_identity(files)}"
    source = RepackSource(
        sizes=index.nbytes.astype(np.int64).tolist(),
        read=records.read,
        identity=identity,
        inputs=[root],
        source=str(root),
        classes=meta.get("classes"),
        label_source=str(meta.get("label_source") or "none"),
        class_map=meta.get("class_map"),
        compressed=records.compression is not None,
        read_batches=records.read_batches,
    )
    return ConvertInput(source, "packer")


def _open_bare(root: Path, *, decode_check: bool) -> ConvertInput:
    from packer.prepare import prepare_bytes  # the decode check: only for bare inputs

    for fmt in BARE_FORMATS.values():
        found = fmt.find_bare(root)
        if found is None:
            continue
        try:
            stored = fmt.stored_records(found)
        except ReaderError as exc:
            raise ConvertInputError(root, str(exc)) from None

        def read(start: int, stop: int, stored: Any = stored) -> Iterator[Item]:
            names = stored.names
            stated = stored.stated_sizes(start, stop) if stored.stated_sizes else None
            for i, item in zip(range(start, stop), stored.read(start, stop), strict=True):
                wh = None if stated is None else next(stated)
                if isinstance(item, str):
                    yield Problem(names[i], UNREADABLE, item)
                elif isinstance(item, StoredProblem):
                    yield Problem(names[i], item.reason, item.message)
                else:
                    data, label = item
                    bad = nonfinite_label(label)
                    if bad is not None:  # as a build refuses it: no JSON holds NaN
                        yield Problem(names[i], BAD_LABEL, bad)
                        continue
                    done = prepare_bytes(names[i], data, label, decode_check=decode_check)
                    yield done if wh is None else _check_stated_size(done, wh)

        source = RepackSource(
            sizes=stored.sizes,
            read=read,
            identity=f"{fmt.name}\n{_file_identity(stored.files)}",
            inputs=[root, *stored.files],
            source=str(root),
            options={"decode_check": decode_check},
            label_source=stored.label_source,
            problems=[Problem(p.path, p.reason, p.message) for p in stored.problems],
        )
        return ConvertInput(source, fmt.name)
    reason = "nothing at that path" if not root.exists() else "none of these"
    raise ConvertInputError(root, reason)


def _check_stated_size(item: Record | Problem, stated: StatedSize) -> Record | Problem:
    """`item` with a ``wh_mismatch`` note when the size the input states is not the image's.

    The index takes width and height from the image itself; a tool that trusts the stated
    size (PaddleOCR's ``RatioDataSet`` reads an LMDB's ``wh-%09d``) would have used the other.
    """
    if not isinstance(item, Record) or stated.size == (item.width, item.height):
        return item
    note = Note(
        item.rel,
        WH_MISMATCH,
        f"the input's {stated.shown}, the image is {item.width}x{item.height} (width x "
        "height); packed with its own size",
    )
    return replace(item, notes=(*item.notes, note))


def open_input(root: Path, *, decode_check: bool = True) -> ConvertInput:
    """Open IN for conversion (no image is read yet).

    Raises:
        ConvertInputError: IN is none of the inputs convert reads.
        DatasetFormatError: IN is a packer dataset whose meta.json or index is damaged.
    """
    if (root / META_NAME).exists():
        try:
            return _open_packed(root)
        except ReaderError as exc:
            raise ConvertInputError(root, str(exc)) from None
    return _open_bare(root, decode_check=decode_check)


def convert(cfg: ConvertConfig, *, log: Callable[[str], None] | None = None) -> BuildSummary:
    """Convert ``cfg.src`` into ``cfg.out`` (a packer dataset, or an export with ``cfg.to``).

    Raises:
        ConvertInputError: IN cannot be read.
        PackerError: see `packer.repack.repack` and `packer.export`.
    """
    found = open_input(cfg.src, decode_check=cfg.decode_check)
    found.source.options = {
        **found.source.options,
        "converted_from": found.kind,
        "on_error": cfg.on_error,
    }
    if cfg.to != "packer":
        from packer.export import export

        if found.source.problems and cfg.on_error == "fail":  # as repack does
            first = found.source.problems[0]
            raise InputError(first.path, first.reason, first.message)

        return export(cfg, found.source, log=log)
    repack_cfg = RepackConfig(
        cfg.out,
        format=cfg.format,
        shard_size=cfg.shard_size,
        on_error=cfg.on_error,
        overwrite=cfg.overwrite,
        resume=cfg.resume,
        progress=cfg.progress,
    )
    return repack(repack_cfg, found.source, log=log)
