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

import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.build import BuildSummary
from packer.errors import ConfigError, PackerError
from packer.problems import UNREADABLE, Problem
from packer.repack import Item, RepackConfig, RepackSource, repack
from packer.writers.batch import RecordBatch
from readers.columnar import COMPRESSIONS
from readers.errors import ReaderError
from readers.formats import BARE_FORMATS, REGISTRY
from readers.formats.layout import META_NAME
from readers.index import load_index

TARGETS = ("packer", "webdataset", "folder")
CRC_MISMATCH = "crc_mismatch"  # a packer dataset's record whose bytes differ from its index


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


_BATCH_RECORDS = 8192
_BATCH_BYTES = 64 << 20
"""A batch of a packer dataset's records holds at most this many records and stored bytes."""


def _chunks(nbytes: np.ndarray, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """``start..stop`` cut into runs of at most `_BATCH_RECORDS` records and `_BATCH_BYTES`."""
    while start < stop:
        end = min(stop, start + _BATCH_RECORDS)
        within = np.cumsum(nbytes[start:end], dtype=np.int64)
        end = start + max(1, int(np.searchsorted(within, _BATCH_BYTES, side="right")))
        yield start, end
        start = end


class _PackedRecords:
    """The records of a packer dataset as stored, described by its index (no decoding).

    Each record's stored bytes are checked against the index's CRC-32 as they are read; one
    that does not match is a ``crc_mismatch`` problem, never a record.
    """

    def __init__(self, root: Path) -> None:
        index = load_index(root, extra=("width", "height", "channels", "format", "path"))
        self.index = index
        self.fmt = REGISTRY[index.format]
        self.n = len(index)
        self.paths = [self.fmt.shard_path(root, name) for name in index.shard_names]
        self.offsets = index.offset if index.offset is not None else np.zeros(self.n, np.int64)
        codes = index.compression
        self.compression: list[str | None] | None = (
            None if codes is None else [None if c == 0 else COMPRESSIONS[c] for c in codes.tolist()]
        )

    def _labels(self, start: int, stop: int) -> tuple[list[Any], np.ndarray | None]:
        labels = self.index.labels
        if labels.kind == "int":
            assert labels.ints is not None
            ints = labels.ints[start:stop].astype(np.int64)
            return ints.tolist(), ints
        if labels.kind == "json":
            return [
                json.loads(t) for t in labels.texts.slice(start, stop - start).to_pylist()
            ], None
        return [None] * (stop - start), None

    def batch(self, shard: int, start: int, stop: int) -> Iterator[RecordBatch | Problem]:
        """Records ``start..stop-1`` (all of shard `shard`), checked: batches and problems."""
        index = self.index
        first = int(index.shard_bounds[shard])
        data = list(
            self.fmt.read_stored(
                self.paths[shard], start - first, self.offsets[start:stop].tolist()
            )
        )
        crcs = np.fromiter(map(zlib.crc32, data), np.uint32, count=stop - start)
        expected = index.crc32[start:stop]
        rel = index.extra["path"].slice(start, stop - start).to_pylist()
        if not all(rel):
            rel = [p or f"{j}" for j, p in enumerate(rel, start)]
        label, ints = self._labels(start, stop)
        extra = index.extra
        batch = RecordBatch(
            rel,
            data,
            label,
            extra["format"].slice(start, stop - start).to_pylist(),
            extra["width"][start:stop].tolist(),
            extra["height"][start:stop].tolist(),
            extra["channels"][start:stop].tolist(),
            crcs.tolist(),
            [None] * (stop - start) if self.compression is None else self.compression[start:stop],
            ints,
        )
        bad = np.flatnonzero(crcs != expected).tolist()
        if not bad:
            yield batch
            return
        at = 0
        for j in bad:
            if j > at:
                yield batch.take(range(at, j))
            yield Problem(
                rel[j],
                CRC_MISMATCH,
                f"sample {start + j}: the stored bytes have CRC-32 {int(crcs[j]):08x}, the index "
                f"says {int(expected[j]):08x} (run packer verify on IN)",
            )
            at = j + 1
        if at < len(batch):
            yield batch.take(range(at, len(batch)))

    def read_batches(self, start: int, stop: int) -> Iterator[RecordBatch | Problem]:
        """Records ``start..stop-1``, a shard's run at a time, in batches of bounded size."""
        bounds = self.index.shard_bounds
        shard = int(np.searchsorted(bounds, start, side="right")) - 1
        i = start
        while i < stop:
            end = min(stop, int(bounds[shard + 1]))
            for a, b in _chunks(self.index.nbytes, i, end):
                yield from self.batch(shard, a, b)
            i, shard = end, shard + 1

    def read(self, start: int, stop: int) -> Iterator[Item]:
        """Records ``start..stop-1`` one by one (`Record` or `Problem`)."""
        for item in self.read_batches(start, stop):
            if isinstance(item, Problem):
                yield item
            else:
                yield from (item.record(i) for i in range(len(item)))


def _open_packed(root: Path) -> ConvertInput:
    records = _PackedRecords(root)
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
            for i, item in zip(range(start, stop), stored.read(start, stop), strict=True):
                if isinstance(item, str):
                    yield Problem(names[i], UNREADABLE, item)
                else:
                    data, label = item
                    yield prepare_bytes(names[i], data, label, decode_check=decode_check)

        source = RepackSource(
            sizes=stored.sizes,
            read=read,
            identity=f"{fmt.name}\n{_file_identity(stored.files)}",
            inputs=[root, *stored.files],
            source=str(root),
            options={"decode_check": decode_check},
            label_source=stored.label_source,
        )
        return ConvertInput(source, fmt.name)
    reason = "nothing at that path" if not root.exists() else "none of these"
    raise ConvertInputError(root, reason)


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
