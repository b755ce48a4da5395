"""What samplers and streams read from a dataset, never the records themselves.

Its shard bounds, the selected ids, and columns of its index (record CRCs, widths, heights).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, as_bounds

__all__ = [
    "SizedDataset",
    "dataset_bounds",
    "dataset_records_crc32",
    "index_columns",
    "select_ids",
]


class SizedDataset(Protocol):
    """What the samplers need from a dataset.

    ``shard_bounds``, ``labels`` and ``prefetch`` are optional attributes, looked up with
    ``getattr``.
    """

    def __len__(self) -> int: ...


def dataset_bounds(dataset: SizedDataset) -> IntArray:
    """``dataset.shard_bounds`` checked against ``len(dataset)``; one shard when it has none."""
    n = len(dataset)
    raw = getattr(dataset, "shard_bounds", None)
    if raw is None:
        return np.array([0, n], dtype=np.int64)
    bounds = as_bounds(raw)
    if int(bounds[-1]) != n:
        raise ValueError(
            f"dataset.shard_bounds ends at {int(bounds[-1])} but len(dataset) is {n}; "
            "the last bound must equal the number of samples"
        )
    return bounds


def _mask_of(indices: npt.ArrayLike, n: int) -> npt.NDArray[np.bool_]:
    """A boolean mask over ``n`` samples from a mask or an array of distinct ids."""
    arr = np.asarray(indices)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise ValueError(
                f"a boolean indices mask must have one entry per sample ({n}), "
                f"got shape {arr.shape}"
            )
        return np.array(arr, dtype=np.bool_)
    if arr.size and (arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            "indices must be a boolean mask or a 1-D array of integer ids, "
            f"got shape {arr.shape} dtype {arr.dtype}"
        )
    ids = np.sort(arr.astype(np.int64))
    if ids.size and (ids[0] < 0 or ids[-1] >= n):
        raise ValueError(f"indices must lie in [0, {n}), got {ids[0]}..{ids[-1]}")
    if ids.size and np.any(np.diff(ids) == 0):
        dup = int(ids[1:][np.diff(ids) == 0][0])
        raise ValueError(
            f"indices contain id {dup} more than once; a sampler yields each selected "
            "id once per epoch"
        )
    keep = np.zeros(n, dtype=np.bool_)
    keep[ids] = True
    return keep


def select_ids(
    dataset: SizedDataset,
    indices: npt.ArrayLike | None,
    labels: Iterable[int | str] | None,
) -> IntArray | None:
    """Sorted selected ids, or None for all of them.

    Args:
        dataset: The dataset; ``labels`` needs ``dataset.labels``.
        indices: A boolean mask over the dataset or an array of distinct ids.
        labels: Label values to keep; combined with ``indices``.
    """
    n = len(dataset)
    keep = None if indices is None else _mask_of(indices, n)
    if labels is not None:
        wanted = list(labels)
        ds_labels = getattr(dataset, "labels", None)
        if ds_labels is None:
            raise ValueError(
                f"labels={wanted[:5]!r} filters by label, but {type(dataset).__name__} has no "
                "labels (dataset.labels is missing or None)"
            )
        lab = np.asarray(ds_labels)
        if lab.shape != (n,):
            raise ValueError(f"dataset.labels has shape {lab.shape}, expected ({n},)")
        by_label = np.isin(lab, np.asarray(wanted))
        keep = by_label if keep is None else keep & by_label
    if keep is None or bool(keep.all()):
        return None
    return np.flatnonzero(keep).astype(np.int64)


# --------------------------------------------------------------------------- index columns

_CORE = ("nbytes", "crc32")
_EXTRA = ("width", "height")


def _sources(dataset: Any) -> list[Any] | None:
    """The parts of a concatenation (``.datasets`` or ``.sources``, with ``.offsets``).

    None when `dataset` is no concatenation.
    """
    if getattr(dataset, "offsets", None) is None:
        return None
    parts = getattr(dataset, "datasets", None)
    if parts is None:
        parts = getattr(dataset, "sources", None)
    return None if parts is None else list(parts)


def index_columns(dataset: Any, *names: str) -> list[npt.NDArray[Any]] | None:
    """Columns of a dataset's index, one entry per sample each, or None when one is missing.

    ``nbytes`` and ``crc32`` come from ``dataset.index``; ``width`` and ``height`` from
    ``dataset.index.extra`` when loaded, else from the dataset's index files, once
    (``readers.index.load_index(root, extra=...)``; no record is read or decoded). A
    concatenation (``.datasets`` and ``.offsets``, like ``readers.ConcatDataset``) joins its
    parts' columns; a dataset may also answer itself with ``dataset.index_column(name)``.

    Raises:
        ValueError: a name is not one of ``nbytes``, ``crc32``, ``width``, ``height``.
    """
    for name in names:
        if name not in _CORE + _EXTRA:
            raise ValueError(f"unknown index column {name!r}; expected one of {_CORE + _EXTRA}")
    own = getattr(dataset, "index_column", None)
    if callable(own):
        found = [own(name) for name in names]
        return None if any(c is None for c in found) else [np.asarray(c) for c in found]
    parts = _sources(dataset)
    if parts is not None:
        per_part = [index_columns(part, *names) for part in parts]
        if any(p is None for p in per_part):
            return None
        return [
            np.concatenate([np.asarray(p[j]) for p in per_part if p is not None])
            if per_part
            else np.zeros(0, np.int64)
            for j in range(len(names))
        ]
    index = getattr(dataset, "index", None)
    if index is None:
        return None
    extra = dict(getattr(index, "extra", None) or {})
    root = getattr(index, "root", None)
    if root is not None and any(n in _EXTRA and n not in extra for n in names):
        from readers.index import load_index  # lazy: only for datasets with index files

        extra |= load_index(root, extra=_EXTRA).extra
    cols = [getattr(index, n, None) if n in _CORE else extra.get(n) for n in names]
    if any(c is None or len(c) != len(dataset) for c in cols):
        return None
    return [np.asarray(c) for c in cols]


def dataset_records_crc32(dataset: Any) -> int | None:
    """CRC-32 over the CRC-32s of every record in the index; None without an index.

    It is the same for the same stored records in the same order, whatever the copy.
    """
    found = index_columns(dataset, "crc32")
    if found is None:
        return None
    return zlib.crc32(np.ascontiguousarray(found[0], dtype="<u4").tobytes())
