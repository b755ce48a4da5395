"""``packer merge`` and ``packer split``: datasets made of other datasets' stored records.

Records are copied as stored (bytes, label, path, size, format; nothing is decoded, every
record's CRC-32 checked) through `packer.repack`, so each output is written, checked and
published like a build. A shard of a source that an output holds whole, in order, with bytes
that would not change (the same labels; for RecordIO, whose records carry their global id,
the same ids) is not copied but hard-linked (`packer.writers.reuse`). A merge keeps the
sources' shards (unless ``--shard-size`` asks for new ones) and unites the class names (the
first dataset's keep their ids, names new in a later one get the next ids; each source's old ->
new id table is recorded in meta.json); a split assigns every id of a dataset to exactly one
part, by a seeded permutation (per label when stratified) and largest-remainder counts, so the
parts are disjoint, together complete, and the same for the same seed. A split's parts are
checked, written aside and put in place together (`packer.splitting`). Both read a source's
class names from the meta.json of the build whose index they read (`packer.packed.load_pinned`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packer.append import read_dataset
from packer.build import BuildSummary
from packer.errors import ConfigError, PackerError
from packer.feedback import on_interrupt
from packer.formats import FORMATS
from packer.labels.classmap import remap_label, unite_classes
from packer.packed import PackedRecords, one_by_one
from packer.plan import plan_shards
from packer.problems import Problem
from packer.repack import Item, RepackConfig, RepackSource, repack
from packer.splitting import PartsPublication, checkpoint
from packer.writers.batch import RecordBatch
from packer.writers.reuse import ReusedShard


def check_part_name(name: str, text: str) -> None:
    """Refuse a part name that is not one plain path component of its own.

    Raises:
        ConfigError: an empty name, ``.``/``..`` or a name starting with ``.`` (hidden names
            are packer's own: ``.NAME.partial``, ``.NAME.lock``), a path separator, a
            control character, or more than 255 bytes.
    """
    why = None
    if not name:
        why = "a part needs a name"
    elif name.startswith("."):
        why = "a part name may not start with '.' (packer keeps its unfinished work there)"
    elif any(c in name for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        why = "a part name is one directory name: no '/', '\\' or control characters"
    elif len(name.encode("utf-8", "surrogateescape")) > 255:
        why = "a part name is at most 255 bytes"
    if why is not None:
        raise ConfigError(f"--into {text!r}: {name!r}: {why}; expected e.g. train=0.9,val=0.1")


def parse_fractions(text: str) -> dict[str, float]:
    """``train=0.9,val=0.1`` -> ``{"train": 0.9, "val": 0.1}`` (they must sum to 1).

    Raises:
        ConfigError: a part without ``=``, a name used twice or not a plain name
            (`check_part_name`), a fraction that is not a number in (0, 1], or fractions that
            do not add up to 1.
    """
    parts: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise ConfigError(
                f"--into {text!r}: {item!r} is not NAME=FRACTION; expected e.g. train=0.9,val=0.1"
            )
        check_part_name(name, text)
        if name in parts:
            raise ConfigError(f"--into {text!r}: the part {name!r} is named twice")
        try:
            fraction = float(value)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ConfigError(f"--into {text!r}: {item!r}: expected a fraction in (0, 1]")
        parts[name] = fraction
    if not parts or abs(sum(parts.values()) - 1) > 1e-6:
        raise ConfigError(
            f"--into {text!r}: the fractions add up to {sum(parts.values()):g}; expected 1"
        )
    return parts


def check_seed(seed: int) -> None:
    """Refuse a seed that is not a whole number >= 0 (`numpy.random.default_rng` takes those)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed {seed}: expected a whole number >= 0")


def check_shard_size(shard_size: int | None) -> None:
    """Refuse a ``--shard-size`` that is given but not positive."""
    if shard_size is not None and shard_size < 1:
        raise ConfigError(f"--shard-size {shard_size}: expected a size > 0, e.g. 1GiB")


def split_counts(total: int, fractions: list[float]) -> list[int]:
    """`total` items cut by `fractions` (sum 1) into whole counts, by largest remainder.

    The counts add up to `total`; ties in the remainders go to the earlier part.
    """
    exact = [total * f for f in fractions]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def assign_splits(
    labels: list[Any], fractions: dict[str, float], *, seed: int, stratify: bool
) -> dict[str, np.ndarray]:
    """The ids of each part, ascending: disjoint, together ``0..len(labels)-1``.

    The ids (of each label, when `stratify`) are permuted by `seed` and cut by
    `split_counts`, so each part holds its fraction of every label, rounded.
    """
    names = list(fractions)
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        key = json.dumps(label, sort_keys=True) if stratify else ""
        groups.setdefault(key, []).append(i)
    rng = np.random.default_rng(seed)
    chosen: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for key in sorted(groups):
        ids = rng.permutation(np.asarray(groups[key], dtype=np.int64))
        start = 0
        for name, count in zip(
            names, split_counts(len(ids), list(fractions.values())), strict=True
        ):
            chosen[name].append(ids[start : start + count])
            start += count
    return {
        name: np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        for name, parts in chosen.items()
    }


class _Selection:
    """The inputs of an output, in order: record ``ids[p]`` of dataset ``which[p]``.

    Reads them a batch at a time with their labels remapped by each dataset's class table,
    plans their shards, and finds the shards that can be reused whole.
    """

    def __init__(
        self,
        datasets: list[PackedRecords],
        which: np.ndarray,
        ids: np.ndarray,
        tables: list[list[int] | None],
    ) -> None:
        self.datasets = datasets
        self.which = which
        self.ids = ids
        self.tables = tables
        self.arrays = [None if t is None else np.asarray(t, np.int64) for t in tables]
        self.shard_cls = FORMATS[datasets[0].fmt.name].writer
        self.sizes = np.zeros(len(ids), np.int64)
        for n, dataset in enumerate(datasets):
            self.sizes[which == n] = dataset.index.nbytes[ids[which == n]]

    def _runs(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """``start..stop-1`` cut where the dataset changes: (dataset, its ids)."""
        while start < stop:
            n = int(self.which[start])
            end = start + int(np.argmax(np.append(self.which[start:stop] != n, True)))
            yield n, self.ids[start:end]
            start = end

    def _relabel(self, n: int, batch: RecordBatch) -> RecordBatch:
        table = self.tables[n]
        if table is None:
            return batch
        if batch.int_labels is not None:
            array = self.arrays[n]
            assert array is not None
            batch.int_labels = array[batch.int_labels]
            batch.label = batch.int_labels.tolist()
        else:
            batch.label = [remap_label(label, table) for label in batch.label]
        return batch

    def read_batches(self, start: int, stop: int) -> Iterator[RecordBatch | Problem]:
        """Inputs ``start..stop-1``: batches of records (labels remapped) and problems."""
        for n, ids in self._runs(start, stop):
            for item in self.datasets[n].read_ids(ids):
                yield item if isinstance(item, Problem) else self._relabel(n, item)

    def read(self, start: int, stop: int) -> Iterator[Item]:
        """Inputs ``start..stop-1`` one by one."""
        return one_by_one(self.read_batches(start, stop))

    def _whole(self, start: int, stop: int) -> tuple[int, int] | None:
        """(dataset, shard) when inputs ``start..stop-1`` are exactly one source shard."""
        n = int(self.which[start])
        lo, hi = int(self.ids[start]), int(self.ids[stop - 1]) + 1
        if int(self.which[stop - 1]) != n or hi - lo != stop - start:
            return None
        bounds = self.datasets[n].index.shard_bounds
        shard = int(np.searchsorted(bounds, lo, side="right")) - 1
        return (n, shard) if (int(bounds[shard]), int(bounds[shard + 1])) == (lo, hi) else None

    def reuse(self, start: int, stop: int, first_id: int) -> ReusedShard | None:
        """The source shard that planned shard ``start..stop-1`` reproduces, or None.

        It does when the shard holds exactly one source shard's records in order, its format
        can reuse shards and the stored labels stay (the class table maps each of its labels
        to itself). For a format whose files hold global ids, where `first_id` is not the
        source shard's, the shard is to be cloned and renumbered (``renumber_from``).
        """
        whole = self._whole(start, stop)
        if whole is None or not self.shard_cls.reusable:
            return None
        n, shard = whole
        source = self.datasets[n]
        lo, hi = int(source.index.shard_bounds[shard]), int(source.index.shard_bounds[shard + 1])
        entry = source.meta["shards"][shard]
        if entry.get("file_bytes") is None:
            return None
        records = source.describe(lo, hi)
        stored = records.label
        if self._relabel(n, records).label != stored:  # the class table changes a label
            return None
        moved = self.shard_cls.global_keys and first_id != lo  # its ids are rewritten
        return ReusedShard(
            source.root / str(entry["name"]),
            records,
            source.offsets[lo:hi],
            int(entry["file_bytes"]),
            renumber_from=lo if moved else None,
        )

    def source_shards(self) -> list[tuple[int, int]]:
        """The plan that keeps the sources' shards: each one a planned shard, in order."""
        runs, at = [], 0
        for n, dataset in enumerate(self.datasets):
            count = int((self.which == n).sum())
            bounds = dataset.index.shard_bounds
            if count != len(dataset.index) or not np.array_equal(
                self.ids[at : at + count], np.arange(count)
            ):
                raise ValueError("source_shards: a selection of whole datasets expected")
            runs += [(at + int(a), at + int(b)) for a, b in itertools.pairwise(bounds) if b > a]
            at += count
        return runs

    def planned(self, shard_size: int) -> list[tuple[int, int]]:
        """Shards of at most `shard_size` bytes, each source shard held whole on its own."""
        runs: list[tuple[int, int]] = []
        gap = 0

        def flush(end: int) -> None:
            plan = plan_shards(self.sizes[gap:end].tolist(), shard_size)
            runs.extend((gap + s.start, gap + s.stop) for s in plan)

        for n, dataset in enumerate(self.datasets):
            bounds = dataset.index.shard_bounds
            positions = np.flatnonzero(self.which == n)
            ids = self.ids[positions]
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                at = int(np.searchsorted(ids, lo))
                if hi <= lo or at + hi - lo > len(ids) or int(ids[at + hi - lo - 1]) != hi - 1:
                    continue
                start = int(positions[at])
                if int(ids[at]) != lo or int(positions[at + hi - lo - 1]) != start + hi - lo - 1:
                    continue
                if start > gap:
                    flush(start)
                runs.append((start, start + hi - lo))
                gap = start + hi - lo
        if gap < len(self.ids):
            flush(len(self.ids))
        return runs


def merge_datasets(
    out: Path,
    sources: list[Path],
    *,
    shard_size: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> BuildSummary:
    """Write the datasets `sources`, in order, as one dataset `out` (ids follow each other).

    `shard_size` None keeps the sources' shards (each reused whole where its bytes stay);
    else the shards are planned by size.

    Raises:
        PackerError: fewer than two sources, of different formats, or some with class names
            and some without; and what `packer.repack.repack` raises.
    """
    if len(sources) < 2:
        raise PackerError(f"packer merge: {len(sources)} dataset(s) given; merge takes two or more")
    check_shard_size(shard_size)
    for path in sources:
        read_dataset(path, "SRC")
    # the class names, counts and digests of the very build whose index is read
    datasets = [PackedRecords(p) for p in sources]
    metas = [d.meta for d in datasets]
    formats = {str(m["format"]) for m in metas}
    if len(formats) != 1:
        found = ", ".join(f"{p} ({m['format']})" for p, m in zip(sources, metas, strict=True))
        raise PackerError(
            f"packer merge: the datasets are of different formats ({found}); merge copies "
            "records without decoding, so they must share one: packer convert the others first"
        )
    with_classes = [m.get("classes") is not None for m in metas]
    if any(with_classes) and not all(with_classes):
        found = ", ".join(str(p) for p, c in zip(sources, with_classes, strict=True) if not c)
        raise PackerError(
            f"packer merge: {found} has no class names while the others' labels are class ids; "
            "merge datasets whose labels are of one kind"
        )
    classes: list[str] | None = list(metas[0]["classes"]) if with_classes[0] else None
    merged: list[dict[str, Any]] = []
    tables: list[list[int] | None] = []
    first = 0
    for path, meta, dataset in zip(sources, metas, datasets, strict=True):
        table: list[int] | None = None
        if classes is not None:
            classes, table = unite_classes(classes, list(meta["classes"]), grow=True)
        tables.append(None if table is None or table == list(range(len(table))) else table)
        merged.append(
            {
                "path": str(path),
                "first_id": first,
                "num_samples": dataset.n,
                "index_sha256": meta.get("index_sha256"),
                "class_ids": table,  # old class id -> id in this dataset
            }
        )
        first += dataset.n
    which = np.repeat(np.arange(len(datasets)), [d.n for d in datasets])
    ids = np.concatenate([np.arange(d.n, dtype=np.int64) for d in datasets])
    selection = _Selection(datasets, which, ids, tables)
    keep = shard_size is None
    size = shard_size or int((metas[0].get("options") or {}).get("shard_size") or 1 << 30)
    source = RepackSource(
        sizes=selection.sizes.tolist(),
        read=selection.read,
        identity=json.dumps([[m["path"], m["index_sha256"]] for m in merged]),
        inputs=list(sources),
        source="merge: " + ", ".join(str(p) for p in sources),
        options={"merged": merged, "kept_shards": keep},
        classes=classes,
        label_source=str(metas[0].get("label_source")),
        class_map="united" if classes is not None else None,
        compressed=any(d.compression is not None for d in datasets),
        read_batches=selection.read_batches,
        plan=selection.source_shards() if keep else None,  # None: shards of `size`
        reuse=selection.reuse,
    )
    cfg = RepackConfig(
        out=out,
        format=formats.pop(),
        shard_size=size,
        overwrite=overwrite,
        resume=resume,
        progress=progress,
    )
    return repack(cfg, source, log=log)


def split_dataset(
    root: Path,
    into: Path,
    fractions: dict[str, float],
    *,
    seed: int = 0,
    stratify: bool = False,
    shard_size: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, BuildSummary]:
    """Write ``into/<name>`` for each part of `fractions`: the records `assign_splits` gives.

    A source shard that a part holds whole (at its own ids, for RecordIO) is reused whole.
    Every part's destination is checked before anything is written; the parts are written
    into ``into/.split.partial`` and put in place together at the end (`packer.splitting`),
    so an interruption while they are written leaves every old part as it was.

    Raises:
        ConfigError: a bad part name, seed or shard size.
        DatasetMissingError: `root` does not exist.
        PackerError: a part would be empty, a destination is taken (without `overwrite`) or
            is not a dataset; and what `packer.repack.repack` raises.
    """
    for name in fractions:
        check_part_name(name, ",".join(fractions))
    check_seed(seed)
    check_shard_size(shard_size)
    read_dataset(root, "SRC")
    dataset = PackedRecords(root)
    meta = dataset.meta  # of the build whose index (and labels) was read
    labels, _ = dataset.labels(0, dataset.n)
    parts = assign_splits(labels, fractions, seed=seed, stratify=stratify)
    empty = [name for name, ids in parts.items() if len(ids) == 0]
    if empty:
        raise PackerError(
            f"packer split: {root} has {dataset.n} samples, too few for a part {empty[0]!r} of "
            f"{fractions[empty[0]]:g}; give it a larger fraction or leave it out"
        )
    size = shard_size or int((meta.get("options") or {}).get("shard_size") or 1 << 30)
    say = log or (lambda msg: print(msg, file=sys.stderr))
    publication = PartsPublication(root, into, list(parts), overwrite=overwrite, say=say)
    summaries = {}
    unchanged = f"no part was put in place, {into} is as it was; run the same command again"
    with on_interrupt(unchanged), publication:
        for at, (name, ids) in enumerate(parts.items()):
            chosen = np.asarray(ids, np.int64)
            selection = _Selection([dataset], np.zeros(len(chosen), np.int64), chosen, [None])
            source = RepackSource(
                sizes=selection.sizes.tolist(),
                read=selection.read,
                identity=json.dumps([str(root), meta.get("index_sha256"), name, seed, stratify]),
                inputs=[root],
                source=f"split {name} of {root}",
                options={
                    "split": {
                        "from": str(root),
                        "part": name,
                        "fractions": fractions,
                        "seed": seed,
                        "stratify": stratify,
                        "index_sha256": meta.get("index_sha256"),
                    }
                },
                classes=meta.get("classes"),
                label_source=str(meta.get("label_source")),
                class_map=meta.get("class_map"),
                compressed=dataset.compression is not None,
                read_batches=selection.read_batches,
                plan=selection.planned(size),
                reuse=selection.reuse,
            )
            cfg = RepackConfig(
                out=publication.staged(name),
                format=str(meta["format"]),
                shard_size=size,
                progress=progress,
            )
            summary = repack(cfg, source, log=log)
            summaries[name] = dataclasses.replace(summary, out=into / name)
            if at < len(parts) - 1:
                checkpoint("part")
        publication.publish()
    return summaries
