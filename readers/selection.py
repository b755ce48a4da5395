"""What samplers and streams read from a dataset: its shard bounds and the selected ids."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from readers.order import IntArray, as_bounds

__all__ = ["SizedDataset", "dataset_bounds", "select_ids"]


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
