"""Read and check a packed dataset's ``meta.json`` and its shard table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from readers.errors import DatasetFormatError
from readers.files import open_regular
from readers.formats.layout import FORMAT_VERSION, META_NAME


def is_int(value: Any) -> TypeGuard[int]:
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
    for key in ("format", "version", "num_samples", "shards"):
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
