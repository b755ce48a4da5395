"""``packer merge`` and ``packer split``: datasets made of other datasets' stored records.

Records are copied as stored (bytes, label, path, size, format; nothing is decoded) through
`packer.repack`, so each output is written, checked and published like a build. A merge
unites the class names (the first dataset's keep their ids, names new in a later one get the
next ids; each source's old -> new id table is recorded in meta.json); a split assigns every
id of a dataset to exactly one part, by a seeded permutation (per label when stratified) and
largest-remainder counts, so the parts are disjoint, together complete, and the same for the
same seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packer.append import read_dataset
from packer.build import BuildSummary
from packer.errors import ConfigError, PackerError
from packer.labels.classmap import remap_label, unite_classes
from packer.records import Record
from packer.repack import Item, RepackConfig, RepackSource, repack
from readers import open_dataset
from readers.formats.layout import INDEX_NAME


def parse_fractions(text: str) -> dict[str, float]:
    """``train=0.9,val=0.1`` -> ``{"train": 0.9, "val": 0.1}`` (they must sum to 1).

    Raises:
        ConfigError: a part without ``=``, a name used twice or not a plain name, a fraction
            that is not a number in (0, 1], or fractions that do not add up to 1.
    """
    parts: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name or name in (".", "..") or "/" in name or name in parts:
            raise ConfigError(
                f"--into {text!r}: {item!r} is not NAME=FRACTION with a new plain name; "
                "expected e.g. train=0.9,val=0.1"
            )
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


def _rows(root: Path) -> list[dict[str, Any]]:
    with open(root / INDEX_NAME, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _reader(
    root: Path, rows: list[dict[str, Any]], ids: list[int], relabel: Callable[[Any], Any]
) -> Callable[[int, int], Iterator[Item]]:
    """``read(start, stop)``: the records of ``ids[start:stop]`` of `root`, as stored."""

    def read(start: int, stop: int) -> Iterator[Item]:
        ds = open_dataset(str(root), decode="bytes")
        for i in ids[start:stop]:
            data, _ = ds[i]
            row = rows[i]
            yield Record(
                rel=str(row["path"]),
                label=relabel(row.get("label")),
                data=bytes(data),
                format=str(row["format"]),
                width=int(row["width"]),
                height=int(row["height"]),
                channels=int(row["channels"]),
                crc32=int(row["crc32"]),
            )

    return read


def _chain(readers: list[tuple[int, Callable[[int, int], Iterator[Item]]]]) -> Any:
    """One ``read(start, stop)`` over several sources laid end to end (first ids given)."""
    bounds = [first for first, _ in readers]

    def read(start: int, stop: int) -> Iterator[Item]:
        for n, (first, part) in enumerate(readers):
            end = bounds[n + 1] if n + 1 < len(bounds) else stop
            lo, hi = max(start, first), min(stop, end)
            if lo < hi:
                yield from part(lo - first, hi - first)

    return read


def merge_datasets(
    out: Path,
    sources: list[Path],
    *,
    shard_size: int = 1 << 30,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> BuildSummary:
    """Write the datasets `sources`, in order, as one dataset `out` (ids follow each other).

    Raises:
        PackerError: fewer than two sources, of different formats, or some with class names
            and some without; and what `packer.repack.repack` raises.
    """
    if len(sources) < 2:
        raise PackerError(f"packer merge: {len(sources)} dataset(s) given; merge takes two or more")
    metas = [read_dataset(p) for p in sources]
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
    readers = []
    sizes: list[int] = []
    for path, meta in zip(sources, metas, strict=True):
        rows = _rows(path)
        table: list[int] | None = None
        if classes is not None:
            classes, table = unite_classes(classes, list(meta["classes"]), grow=True)

        def relabel(label: Any, table: list[int] | None = table) -> Any:
            return label if table is None or label is None else remap_label(label, table)

        readers.append((len(sizes), _reader(path, rows, list(range(len(rows))), relabel)))
        merged.append(
            {
                "path": str(path),
                "first_id": len(sizes),
                "num_samples": len(rows),
                "index_sha256": meta.get("index_sha256"),
                "class_ids": table,  # old class id -> id in this dataset
            }
        )
        sizes.extend(int(r["nbytes"]) for r in rows)
    source = RepackSource(
        sizes=sizes,
        read=_chain(readers),
        identity=json.dumps([[m["path"], m["index_sha256"]] for m in merged]),
        inputs=list(sources),
        source="merge: " + ", ".join(str(p) for p in sources),
        options={"merged": merged},
        classes=classes,
        label_source=str(metas[0].get("label_source")),
        class_map="united" if classes is not None else None,
    )
    cfg = RepackConfig(
        out=out,
        format=formats.pop(),
        shard_size=shard_size,
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

    Raises:
        PackerError: a part would be empty; and what `packer.repack.repack` raises.
    """
    meta = read_dataset(root)
    rows = _rows(root)
    parts = assign_splits([r.get("label") for r in rows], fractions, seed=seed, stratify=stratify)
    empty = [name for name, ids in parts.items() if len(ids) == 0]
    if empty:
        raise PackerError(
            f"packer split: {root} has {len(rows)} samples, too few for a part {empty[0]!r} of "
            f"{fractions[empty[0]]:g}; give it a larger fraction or leave it out"
        )
    size = shard_size or int((meta.get("options") or {}).get("shard_size") or 1 << 30)
    summaries = {}
    for name, ids in parts.items():
        chosen = [int(i) for i in ids]
        source = RepackSource(
            sizes=[int(rows[i]["nbytes"]) for i in chosen],
            read=_reader(root, rows, chosen, lambda label: label),
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
        )
        cfg = RepackConfig(
            out=into / name,
            format=str(meta["format"]),
            shard_size=size,
            overwrite=overwrite,
            progress=progress,
        )
        summaries[name] = repack(cfg, source, log=log)
    return summaries
