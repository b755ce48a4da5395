"""Summarise a packed dataset: counts, classes, label histogram, sizes, formats, shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from readers.index import load_index


def describe(path: str | Path) -> dict[str, Any]:
    """A JSON-able summary of the dataset at `path`."""
    index = load_index(path, extra=("width", "height", "channels", "format"))
    meta = index.meta
    n = len(index)
    summary: dict[str, Any] = {
        "path": str(path),
        "format": meta["format"],
        "num_samples": n,
        "num_shards": len(index.shard_names),
        "payload_bytes": int(index.nbytes.sum()),
        "disk_bytes": sum(int(s.get("file_bytes", s.get("bytes", 0))) for s in meta["shards"]),
        "label_source": meta.get("label_source"),
        "num_errors": meta.get("num_errors"),
        "created": meta.get("created"),
        "shards": meta["shards"],
    }
    if n:
        width, height = index.extra["width"], index.extra["height"]
        summary["width"] = [int(width.min()), int(width.max())]
        summary["height"] = [int(height.min()), int(height.max())]
        summary["channels"] = dict(sorted(Counter(map(int, index.extra["channels"])).items()))
        summary["image_formats"] = dict(sorted(Counter(index.extra["format"].to_pylist()).items()))
    classes = meta.get("classes")
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
    """The summary as text for a terminal."""
    lines = [
        f"{s['path']}: {s['format']} dataset, {s['num_samples']} samples in "
        f"{s['num_shards']} shard{'s' if s['num_shards'] != 1 else ''}",
        f"  bytes:    {s['payload_bytes'] / 1e6:.1f} MB of images, {s['disk_bytes'] / 1e6:.1f} MB "
        "on disk",
    ]
    if s["num_samples"]:
        lines.append(
            f"  size:     width {s['width'][0]}..{s['width'][1]}, "
            f"height {s['height'][0]}..{s['height'][1]}, channels "
            + ", ".join(f"{k}: {v}" for k, v in s["channels"].items())
        )
        lines.append("  formats:  " + ", ".join(f"{k} {v}" for k, v in s["image_formats"].items()))
    lines.append(f"  labels:   from {s['label_source']}; skipped inputs: {s['num_errors']}")
    labels = s["labels"]
    if "kind" in labels:
        lines.append(f"            {labels['kind']} labels (not class ids)")
    else:
        width = max((len(k) for k in labels), default=0)
        top = max(labels.values(), default=0) or 1
        for name, count in labels.items():
            bar = "#" * round(30 * count / top)
            lines.append(f"    {name:<{width}}  {count:>8}  {bar}")
    lines.append("  shards:")
    for shard in s["shards"]:
        lines.append(
            f"    {shard['name']}  ids {shard['first']}..{shard['first'] + shard['count'] - 1}"
            f"  {shard['count']} samples  {shard.get('file_bytes', shard['bytes']) / 1e6:.1f} MB"
        )
    return "\n".join(lines)
