"""paddle.io Datasets over packed shards: ``ds[i] -> (HWC uint8 image, label)``.

Each registered format's Dataset lives in ``readers/datasets/<fmt>.py`` (named by its
``ShardFormat.dataset``); `open_dataset` picks it through the registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from readers.datasets.base import ON_ERROR, ShardedDataset
from readers.errors import DatasetFormatError
from readers.formats import REGISTRY
from readers.formats.layout import META_NAME
from readers.index import load_meta
from readers.io.identity import meta_stamp, read_meta_once
from readers.io.ranges import is_url

__all__ = ["ON_ERROR", "ShardedDataset", "json_format", "open_dataset", "open_remote_dataset"]


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> ShardedDataset:
    """Open whatever dataset is at `path`.

    Accepts a directory written by ``packer build`` (any registered format) or a bare copy of
    a registered format: a bare LMDB in the PaddleOCR layout, or a bare MXNet ``.rec`` (with
    its ``.idx``; the path of the ``.rec``, of the ``.idx``, their prefix, or a folder holding
    one ``.rec``). Keyword arguments go to the dataset class.

    Raises:
        DatasetFormatError: `path` is none of these; the message says what was found.
    """
    if is_url(path) and kwargs.get("cache_dir") is None:
        return open_remote_dataset(str(path), **kwargs)
    root = Path(path)
    if (root / META_NAME).exists():
        stamp = meta_stamp(root)
        meta = load_meta(root)
        name = str(meta["format"])
        fmt = REGISTRY.get(name)
        if fmt is None:
            raise DatasetFormatError(f"{root}: format {name!r} is not readable by this version")
        with read_meta_once(root, meta, stamp):  # the dataset reads no second copy
            return fmt.dataset_class()(root, **kwargs)  # type: ignore[no-any-return]
    for fmt in REGISTRY.values():
        if fmt.find_bare(root) is not None:
            return fmt.dataset_class()(root, **kwargs)  # type: ignore[no-any-return]
    hints = [f"{META_NAME} (packer build output)"] + [f.bare_hint for f in REGISTRY.values()]
    expected = "expected " + ", ".join(hints[:-1]) + " or " + hints[-1]
    near = [m for f in REGISTRY.values() if (m := f.near_miss(root)) is not None]
    if near:
        found = near[0]
    elif root.is_dir():
        names = sorted(p.name for p in root.iterdir())
        found = f"{names[:10]}" + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    elif root.is_file():
        found = "a file that is not a dataset"
    else:
        found = "nothing at that path"
    raise DatasetFormatError(f"{root}: not a dataset packer can open: {expected}; found {found}")


def open_remote_dataset(url: str, **kwargs: Any) -> ShardedDataset:
    """Open the packed dataset at `url` in object storage in place (its format from meta.json).

    Raises:
        DatasetFormatError: no ``meta.json`` there, or a format this version cannot read.
    """
    import json

    from readers.io.ranges import open_fs

    fs, root = open_fs(url, kwargs.get("storage_options"))
    try:
        meta = json.loads(fs.cat_file(f"{root.rstrip('/')}/{META_NAME}"))
    except FileNotFoundError:
        meta = {}  # the dataset class says what is missing
    except ValueError as exc:
        raise DatasetFormatError(f"{url}/{META_NAME}: not JSON ({exc})") from exc
    fmt = REGISTRY.get(str(meta.get("format", "recordio")))
    if fmt is None:
        raise DatasetFormatError(f"{url}: format {meta['format']!r} is not readable here")
    return fmt.dataset_class()(url, **kwargs)  # type: ignore[no-any-return]


def json_format(root: Path) -> str:
    """The ``format`` field of the meta.json at `root`."""
    return str(load_meta(root)["format"])
