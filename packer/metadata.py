"""The meta.json fields that `readers.meta.load_meta` lets through unchecked.

These (shard sizes, class names) are read defensively for ``packer info`` and checked for
``packer verify``.
"""

from __future__ import annotations

from typing import Any

from readers.meta import is_int

SIZE_FIELDS = ("bytes", "file_bytes")
"""Per shard: the image bytes it stores (required), and its size on disk (optional)."""


def _size_ok(value: Any) -> bool:
    return is_int(value) and value >= 0


def shard_disk_bytes(shard: dict[str, Any]) -> int | None:
    """Return a shard's size on disk (``file_bytes``, else ``bytes``).

    None when meta.json does not say it in a usable form.
    """
    value = shard.get("file_bytes", shard.get("bytes"))
    return value if _size_ok(value) else None


def class_names(meta: dict[str, Any]) -> list[str] | None:
    """``classes`` when it is a list of names, else None (no names, or malformed)."""
    classes = meta.get("classes")
    if isinstance(classes, list) and all(isinstance(c, str) for c in classes):
        return classes
    return None


def meta_problems(meta: dict[str, Any]) -> list[str]:
    """Say what is wrong with the shard sizes and class names of a meta.json.

    The meta.json is one that `load_meta` accepted; one message per field (the caller names
    the file).

    Args:
        meta: as returned by `readers.meta.load_meta` (``shards`` a list of objects).
    """
    found = []
    for n, shard in enumerate(meta["shards"]):
        for key in SIZE_FIELDS:
            if key not in shard:
                if key == "bytes":
                    found.append(f"shard {n} has no field 'bytes' (the image bytes it stores)")
            elif not _size_ok(shard[key]):
                found.append(f"shard {n} has {key} {shard[key]!r}, expected an integer >= 0")
    if meta.get("classes") is not None and class_names(meta) is None:
        shown = repr(meta["classes"])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        found.append(f"classes is {shown}, expected a list of class names")
    return found
