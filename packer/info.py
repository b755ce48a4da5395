"""Summarise a packed dataset: counts, classes, label histogram, sizes, formats, shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from packer.metadata import class_names, meta_problems, shard_disk_bytes
from packer.terminal import shown
from readers.columnar import COMPRESSIONS
from readers.errors import DatasetFormatError
from readers.formats.layout import META_NAME
from readers.index import DatasetIndex, load_index
from readers.not_dataset import explain_not_dataset


def stored_sizes(index: DatasetIndex) -> dict[str, dict[str, int]]:
    """Return the samples and stored bytes per stored form.

    Samples and stored bytes per stored form: the index's ``format``, with ``+lz4`` /
    ``+zstd`` for compressed raw pixels (``raw+lz4``), whose entries also give
    ``pixel_bytes``, the size of the pixels they decompress to.
    """
    formats = np.asarray(index.extra["format"].to_pylist(), dtype=object)
    codes = index.compression
    names = formats.copy()
    if codes is not None:
        for code in np.unique(codes[codes > 0]).tolist():
            names[codes == code] = [f"{f}+{COMPRESSIONS[code]}" for f in formats[codes == code]]
    pixels = (
        index.extra["width"].astype(np.int64)
        * index.extra["height"].astype(np.int64)
        * index.extra["channels"].astype(np.int64)
    )
    sizes: dict[str, dict[str, int]] = {}
    for name in sorted(set(names.tolist())):
        chosen = names == name
        entry = {"samples": int(chosen.sum()), "bytes": int(index.nbytes[chosen].sum())}
        if "+" in name:
            entry["pixel_bytes"] = int(pixels[chosen].sum())
        sizes[name] = entry
    return sizes


def describe(path: str | Path) -> dict[str, Any]:
    """A JSON-able summary of the dataset at `path`.

    Sizes and class names that meta.json gives in an unusable form are shown as unknown
    (``None``) and listed in ``meta_problems``, each naming the field.

    Raises:
        ReaderError: the dataset cannot be opened (the message names the file and field).
    """
    root = Path(path)
    if not (root / META_NAME).exists():
        why = explain_not_dataset(root)  # missing, or a folder of images to pack first
        if why is None and root.is_file():
            why = f"{root}: a file, not a packed dataset (a directory with {META_NAME})"
        if why is not None:
            raise DatasetFormatError(why)
    index = load_index(path, extra=("width", "height", "channels", "format"))
    meta = index.meta
    n = len(index)
    disk = [shard_disk_bytes(s) for s in meta["shards"]]
    summary: dict[str, Any] = {
        "path": str(path),
        "format": meta["format"],
        "num_samples": n,
        "num_shards": len(index.shard_names),
        "payload_bytes": int(index.nbytes.sum()),
        "disk_bytes": None if None in disk else sum(d or 0 for d in disk),
        "label_source": meta.get("label_source"),
        "num_errors": meta.get("num_errors"),
        "created": meta.get("created"),
        "shards": meta["shards"],
        "meta_problems": [f"{Path(path) / META_NAME}: {p}" for p in meta_problems(meta)],
    }
    if n:
        width, height = index.extra["width"], index.extra["height"]
        summary["width"] = [int(width.min()), int(width.max())]
        summary["height"] = [int(height.min()), int(height.max())]
        summary["channels"] = dict(sorted(Counter(map(int, index.extra["channels"])).items()))
        summary["image_formats"] = dict(sorted(Counter(index.extra["format"].to_pylist()).items()))
        summary["stored"] = stored_sizes(index)
    classes = class_names(meta)
    ints = index.labels.as_ints()
    if ints is not None:
        values, counts = np.unique(ints, return_counts=True)
        summary["labels"] = {
            (classes[v] if classes and 0 <= v < len(classes) else str(v)): int(c)
            for v, c in zip(values.tolist(), counts.tolist(), strict=True)
        }
        if classes:
            for name in classes:
                summary["labels"].setdefault(name, 0)
    else:
        summary["labels"] = {"kind": index.labels.kind}
    summary["classes"] = classes
    return summary


def format_summary(s: dict[str, Any]) -> str:
    """The summary as text for a terminal.

    Text that comes from the dataset (class names, paths, meta.json's values) is `shown`:
    control characters such as ESC and CR appear as repr-style escapes and never act.
    """
    lines = [
        f"{shown(s['path'])}: {shown(s['format'])} dataset, {s['num_samples']} samples in "
        f"{s['num_shards']} shard{'s' if s['num_shards'] != 1 else ''}",
        f"  bytes:    {s['payload_bytes'] / 1e6:.1f} MB of images, {_mb(s['disk_bytes'])} on disk",
    ]
    if s["num_samples"]:
        lines.append(
            f"  size:     width {s['width'][0]}..{s['width'][1]}, "
            f"height {s['height'][0]}..{s['height'][1]}, channels "
            + ", ".join(f"{shown(k)}: {v}" for k, v in s["channels"].items())
        )
        lines.append("  stored:   " + ", ".join(_stored(k, v) for k, v in s["stored"].items()))
    lines.append(
        f"  labels:   from {shown(s['label_source'])}; skipped inputs: {shown(s['num_errors'])}"
    )
    labels = s["labels"]
    if "kind" in labels:
        lines.append(f"            {shown(labels['kind'])} labels (not class ids)")
    else:
        names = {name: shown(name) for name in labels}
        width = max((len(k) for k in names.values()), default=0)
        top = max(labels.values(), default=0) or 1
        for name, count in labels.items():
            bar = "#" * round(30 * count / top)
            lines.append(f"    {names[name]:<{width}}  {count:>8}  {bar}")
    lines.append("  shards:")
    for shard in s["shards"]:
        last = shard["first"] + shard["count"] - 1
        lines.append(
            f"    {shown(shard['name'])}  ids {shard['first']}..{last}"
            f"  {shard['count']} samples  {_mb(shard_disk_bytes(shard))}"
        )
    if s["meta_problems"]:
        lines.append("  problems (shown as unknown above; packer verify checks the rest):")
        lines.extend(f"    {shown(p)}" for p in s["meta_problems"])
    return "\n".join(lines)


def _stored(name: str, entry: dict[str, int]) -> str:
    """``png 11 (0.1 MB)``; compressed raw: ``raw+lz4 11 (0.1 MB, 32% of the pixels)``."""
    text = f"{shown(name)} {entry['samples']} ({_mb(entry['bytes'])}"
    if entry.get("pixel_bytes"):
        text += f", {100 * entry['bytes'] / entry['pixel_bytes']:.0f}% of the pixels"
    return text + ")"


def _mb(nbytes: int | None) -> str:
    return "? MB" if nbytes is None else f"{nbytes / 1e6:.1f} MB"
