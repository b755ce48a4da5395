"""The ``meta.json`` schema of a packed dataset, defined once.

It holds the fields (`META_FIELDS`), the object a build writes (`make_meta`), and reading it
back checked (`load_meta`, `shard_table`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from readers.errors import DatasetFormatError
from readers.files import open_regular
from readers.formats.layout import FORMAT_VERSION, META_NAME

META_FIELDS: dict[str, str] = {
    "format": "the shard format: a name registered in readers.formats (lmdb, recordio)",
    "version": "the dataset layout version, an integer from 1 (FORMAT_VERSION)",
    "num_samples": "samples in the dataset: index.jsonl's line count",
    "num_shards": "entries of the shard table",
    "shards": "per shard, in id order: name, first (its first sample id), count, bytes "
    "(the stored image bytes), file_bytes (its files' size)",
    "classes": "class names, index = class id, when labels are class names (else null)",
    "label_source": "where the labels came from (dirname, a list file, sidecar, none, ...)",
    "class_map": "text label -> class id, when --class-map mapped labels (else null)",
    "label_kind": "none, int or json: the compact form readers load the labels into",
    "source": "SRC as given",
    "options": "the build options",
    "created": "when the build finished, ISO 8601 UTC",
    "tool_version": "the packer release that built it",
    "payload_bytes": "the stored image bytes of all samples",
    "num_errors": "lines of errors.jsonl",
    "num_warnings": "lines of warnings.jsonl",
    "index_sha256": "SHA-256 of index.jsonl",
    "index_fingerprint": "the index's fingerprint (readers.index.fingerprint)",
    "writer": "the library or layout that wrote the shards",
    "plan_digest": "the digest of the build plan, which --resume of a finished OUT compares",
}
"""Every field of ``meta.json``, in the order a build writes them, and what it holds."""

REQUIRED_FIELDS = ("format", "version", "num_samples", "shards")
"""The fields readers cannot do without; `load_meta` refuses a file that lacks one."""


def make_meta(
    *,
    format: str,
    shards: list[dict[str, Any]],
    num_samples: int,
    classes: list[str] | None,
    label_source: str,
    class_map: str | None,
    label_kind: str,
    source: str,
    options: dict[str, Any],
    tool_version: str,
    payload_bytes: int,
    num_errors: int,
    num_warnings: int,
    index_sha256: str,
    index_fingerprint: str,
    writer: dict[str, str],
    plan_digest: str,
    created: str | None = None,
) -> dict[str, Any]:
    """The ``meta.json`` object of a dataset, with the fields in `META_FIELDS` order.

    ``version`` is this layout's `FORMAT_VERSION`, ``num_shards`` the length of `shards`,
    and `created` (None) the current UTC time; each argument is the field of its name.
    """
    if created is None:
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {
        "format": format,
        "version": FORMAT_VERSION,
        "num_samples": num_samples,
        "num_shards": len(shards),
        "shards": shards,
        "classes": classes,
        "label_source": label_source,
        "class_map": class_map,
        "label_kind": label_kind,
        "source": source,
        "options": options,
        "created": created,
        "tool_version": tool_version,
        "payload_bytes": payload_bytes,
        "num_errors": num_errors,
        "num_warnings": num_warnings,
        "index_sha256": index_sha256,
        "index_fingerprint": index_fingerprint,
        "writer": writer,
        "plan_digest": plan_digest,
    }


def is_int(value: Any) -> TypeGuard[int]:
    """Return whether `value` is an int (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _plain_name(name: Any) -> bool:
    """A file name inside the dataset directory: no separators, not ``.``/``..``."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", "\\", "\0"))
    )


def load_meta(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``meta.json`` of the dataset at `root`.

    Raises:
        DatasetFormatError: missing, not JSON, or a field readers rely on (``format``,
            ``version``, ``num_samples``, the ``shards`` table, ``num_shards``) is absent or of
            the wrong type; the message names the file and the field.
    """
    path = Path(root) / META_NAME
    try:
        with open_regular(path) as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetFormatError(f"{path}: not found; is {root} a packed dataset?") from None
    except (ValueError, RecursionError) as exc:
        raise DatasetFormatError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise DatasetFormatError(f"{path}: cannot read ({exc})") from exc
    if not isinstance(meta, dict):
        raise DatasetFormatError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    for key in REQUIRED_FIELDS:
        if key not in meta:
            raise DatasetFormatError(f"{path}: field {key!r} is missing")
    if not isinstance(meta["format"], str):
        raise DatasetFormatError(f"{path}: format is {meta['format']!r}, expected a string")
    version = meta["version"]
    if not is_int(version) or version < 1:
        raise DatasetFormatError(f"{path}: version is {version!r}, expected an integer >= 1")
    if version > FORMAT_VERSION:
        raise DatasetFormatError(
            f"{path}: format version {version} was written by a newer packer; this reader knows "
            f"versions up to {FORMAT_VERSION}"
        )
    if not is_int(meta["num_samples"]) or meta["num_samples"] < 0:
        raise DatasetFormatError(
            f"{path}: num_samples is {meta['num_samples']!r}, expected an integer >= 0"
        )
    shards = meta["shards"]
    if not isinstance(shards, list):
        raise DatasetFormatError(f"{path}: shards is {type(shards).__name__}, expected a list")
    for n, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise DatasetFormatError(f"{path}: shard {n} is {shard!r}, expected an object")
        if not _plain_name(shard.get("name")):
            raise DatasetFormatError(
                f"{path}: shard {n} has name {shard.get('name')!r}, expected a file name in "
                "the dataset directory"
            )
        for key in ("first", "count"):
            if not is_int(shard.get(key)) or shard[key] < 0:
                raise DatasetFormatError(
                    f"{path}: shard {n} has {key} {shard.get(key)!r}, expected an integer >= 0"
                )
    if "num_shards" in meta and meta["num_shards"] != len(shards):
        raise DatasetFormatError(
            f"{path}: num_shards is {meta['num_shards']!r} but the shard table lists {len(shards)}"
        )
    return dict(meta)


def shard_table(meta: dict[str, Any], where: Path) -> tuple[np.ndarray, list[str]]:
    """Return the shards' id bounds (int64, one more than shards) and names from `meta`.

    Raises:
        DatasetFormatError: the shards do not cover the ids in order without gaps, or do not
            add up to ``num_samples`` (`where` names the dataset in the message).
    """
    bounds = [0]
    names = []
    for n, shard in enumerate(meta["shards"]):
        if int(shard["first"]) != bounds[-1]:
            raise DatasetFormatError(
                f"{where}: shard {n} starts at id {shard['first']}, expected {bounds[-1]} "
                "(shards must cover the ids in order without gaps)"
            )
        bounds.append(bounds[-1] + int(shard["count"]))
        names.append(str(shard["name"]))
    if bounds[-1] != int(meta["num_samples"]):
        raise DatasetFormatError(
            f"{where}: the shards hold {bounds[-1]} samples but num_samples is "
            f"{meta['num_samples']}"
        )
    return np.asarray(bounds, dtype=np.int64), names
