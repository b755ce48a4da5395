"""``packer convert IN OUT``: a dataset that exists already, in packer's format or exported.

IN is anything ``open_dataset`` reads: a packer dataset (either format), a bare PaddleOCR-layout
LMDB, a bare MXNet ``.rec``/``.idx`` pair (InsightFace's header record skipped), or a directory
of WebDataset ``.tar`` shards; or one or more Parquet files, or a directory of them
(`packer.parquet_source`: the Hugging Face ``datasets`` layout, one image and its label per
row). The stored bytes and labels are kept. Records are read as stored
(``ShardFormat.read_stored`` and ``stored_records``: paddle is never imported), and only what
the decode check needs is decoded: a packer dataset's records were checked when it was built
and are taken with their index description (width, height, format, CRC-32, checked against the
bytes), while a bare input's records, and a Parquet input's rows, pass
`packer.prepare.prepare_bytes`, the same proof a build makes (``--no-decode-check``: headers
only). OUT is written by `packer.repack` (or `packer.export` for ``--to webdataset|folder``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from packer.build import BuildSummary
from packer.errors import ConfigError, InputError, OutputExistsError, PackerError
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
            + ", or Parquet files (or a directory of them)"
        )


@dataclass(frozen=True)
class ConvertConfig:
    """Everything ``packer convert`` was asked to do.

    `src` is one IN, or several: Parquet files (or directories of them) only. `image_column`
    and `label_columns` choose a Parquet input's columns (None and (): guessed).
    """

    src: Path | tuple[Path, ...]
    out: Path
    format: str = next(iter(REGISTRY))
    to: str = "packer"
    shard_size: int = 1 << 30
    decode_check: bool = True
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
    progress: bool | None = None
    image_column: str | None = None
    label_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.src, str | os.PathLike):  # several INs, as a list or tuple
            paths = tuple(Path(p) for p in self.src)
            object.__setattr__(self, "src", paths[0] if len(paths) == 1 else paths)
        if not self.inputs:
            raise ConfigError("convert needs an IN")
        object.__setattr__(self, "label_columns", tuple(self.label_columns))
        if self.to not in TARGETS:
            raise ConfigError(f"--to {self.to!r}: expected one of {', '.join(TARGETS)}")
        if self.resume and self.to != "packer":
            raise ConfigError(
                f"--resume applies to --to packer; an export (--to {self.to}) is rewritten "
                "from the start (drop --resume)"
            )
        RepackConfig(self.out, self.format, self.shard_size, self.on_error)  # validates

    @property
    def inputs(self) -> tuple[Path, ...]:
        """The INs, as a tuple of paths."""
        return (Path(self.src),) if isinstance(self.src, str | os.PathLike) else self.src


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


def _is_parquet(root: Path) -> bool:
    """True when `root` is a Parquet file, or a directory of them that is no other input."""
    from packer.parquet_source import is_parquet_file, parquet_files_under

    if root.is_dir():
        if (root / META_NAME).exists() or any(f.find_bare(root) for f in BARE_FORMATS.values()):
            return False
        return bool(parquet_files_under(root))
    return is_parquet_file(root)


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


def open_input(
    root: Path | Sequence[Path],
    *,
    decode_check: bool = True,
    image_column: str | None = None,
    label_columns: Sequence[str] = (),
) -> ConvertInput:
    """Open IN (or several Parquet INs) for conversion; no image is read yet.

    Only a Parquet input's image sizes are read, to plan the shards.

    Raises:
        ConvertInputError: IN is none of the inputs convert reads.
        ConfigError: columns named for an input that is not Parquet, or that cannot serve.
        DatasetFormatError: IN is a packer dataset whose meta.json or index is damaged.
    """
    roots = [root] if isinstance(root, str | os.PathLike) else [Path(r) for r in root]
    if len(roots) > 1 or any(_is_parquet(Path(r)) for r in roots):
        from packer.parquet_source import open_parquet

        for other in roots:
            if not _is_parquet(Path(other)):
                reason = "nothing at that path" if not os.path.lexists(other) else "not Parquet"
                raise ConvertInputError(
                    Path(other), f"{reason} (several INs must all be Parquet files or folders)"
                )
        source = open_parquet(
            [Path(r) for r in roots],
            image_column=image_column,
            label_columns=label_columns,
            decode_check=decode_check,
        )
        return ConvertInput(source, "parquet")
    root = Path(roots[0])
    if image_column is not None or label_columns:
        option = "--image-column" if image_column is not None else "--label-column"
        raise ConfigError(f"{option} applies to Parquet input only; IN {root} is not Parquet")
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
    if os.path.lexists(cfg.out) and cfg.to == "packer" and not (cfg.overwrite or cfg.resume):
        raise OutputExistsError(str(cfg.out))  # as repack would, before IN is read
    found = open_input(
        cfg.inputs,
        decode_check=cfg.decode_check,
        image_column=cfg.image_column,
        label_columns=cfg.label_columns,
    )
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
