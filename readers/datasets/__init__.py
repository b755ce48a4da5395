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
from readers.formats import BARE_FORMATS, REGISTRY
from readers.formats.layout import META_NAME
from readers.index import load_meta
from readers.io.identity import meta_stamp, read_meta_once
from readers.not_dataset import explain_not_dataset
from readers.remote import default_cache_dir, is_url
from readers.staging import stage

__all__ = ["ON_ERROR", "ShardedDataset", "json_format", "open_dataset", "open_remote_dataset"]


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> ShardedDataset:
    """Open whatever dataset is at `path`.

    Accepts a directory written by ``packer build`` (any registered format) or a bare copy of
    a registered format: a bare LMDB in the PaddleOCR layout, a bare MXNet ``.rec`` (with
    its ``.idx``; the path of the ``.rec``, of the ``.idx``, their prefix, or a folder holding
    one ``.rec``), or WebDataset ``.tar`` shards (a directory of them, or one). Keyword
    arguments go to the dataset class (``transform``, ``decode``, ``draft``, ``verify_crc``,
    ``on_error``, ``cache_dir``, ...).

    A URL (``s3://bucket/out.lmdb``) is staged first (``cache_dir=``, ``cache_limit=``,
    ``storage_options=``; see `ShardedDataset`), then the staged copy is opened; a RecordIO
    dataset without ``cache_dir=`` is read in place by byte range (`open_remote_dataset`).

    Raises:
        DatasetFormatError: `path` is none of these; the message says what was found.
        DatasetNotFoundError: `path` is a URL without meta.json (no dataset, or an
            unfinished upload).
    """
    if is_url(path) and kwargs.get("cache_dir") is None:
        in_place = open_remote_dataset(str(path), **kwargs)
        if in_place is not None:
            return in_place
    if is_url(path):
        staged = stage(
            path,
            kwargs.pop("cache_dir", None) or default_cache_dir(),
            cache_limit=kwargs.pop("cache_limit", None),
            storage_options=kwargs.pop("storage_options", None),
        )
        return open_dataset(staged, **kwargs)
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
    for fmt in BARE_FORMATS.values():
        if fmt.find_bare(root) is not None:
            return fmt.dataset_class()(root, **kwargs)  # type: ignore[no-any-return]
    hints = [f"{META_NAME} (packer build output)"] + [f.bare_hint for f in BARE_FORMATS.values()]
    expected = "expected " + ", ".join(hints[:-1]) + " or " + hints[-1]
    near = [m for f in BARE_FORMATS.values() if (m := f.near_miss(root)) is not None]
    if not near and (why := explain_not_dataset(root)) is not None:
        raise DatasetFormatError(why)  # missing, or a folder of images to pack first
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


def open_remote_dataset(url: str, **kwargs: Any) -> ShardedDataset | None:
    """Open the dataset at `url` in place, by byte range, when its format reads that way.

    Returns None for a format that must be staged (LMDB).

    Raises:
        DatasetNotFoundError: no meta.json at `url`.
        DatasetFormatError: meta.json is not usable, or names a format this version cannot read.
    """
    from readers.datasets.remote import open_published

    meta = open_published(url, kwargs.get("storage_options")).meta
    fmt = REGISTRY.get(str(meta.get("format")))
    if fmt is None:
        raise DatasetFormatError(f"{url}: format {meta.get('format')!r} is not readable here")
    cls = fmt.dataset_class()
    if not getattr(cls, "reads_ranges", False):
        return None
    return cls(url, **kwargs)  # type: ignore[no-any-return]


def json_format(root: Path) -> str:
    """The ``format`` field of the meta.json at `root`."""
    return str(load_meta(root)["format"])
