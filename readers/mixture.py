"""The weighted mixture of a ConcatDataset's sources: its checked parameters and epoch orders.

It is a value object around the pure functions of :mod:`readers.mixing`; no paddle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.io.hints import resolve_chunk_size
from readers.mixing import (
    MIXES,
    MixSource,
    batch_order,
    check_weights,
    epoch_order,
    mix_counts,
    rank_share,
)
from readers.order import IntArray, check_nonneg, chunk_ranges, rank_span
from readers.selection import dataset_bounds

__all__ = ["Mixture", "mixture_of"]


@dataclass(frozen=True)
class Mixture:
    """Sources, weights and counts of a weighted mixture; the orders of its epochs.

    Args:
        sources: The sources, in the order of their offsets.
        weights: Positive weights, one per source (`check_weights`).
        epoch_samples: Samples per epoch ``N`` (>= 1); with ``mix="batch"`` rounded down to
            whole batches.
        mix: ``"epoch"`` or ``"batch"``.
        batch_size: The batch size, for ``mix="batch"``.
    """

    sources: tuple[MixSource, ...]
    weights: tuple[float, ...]
    epoch_samples: int
    mix: str = "epoch"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ValueError(f"mix={self.mix!r}: expected 'epoch' or 'batch'")
        check_nonneg("epoch_samples", self.epoch_samples, 1)
        object.__setattr__(self, "weights", check_weights(self.weights, len(self.sources)))
        if self.mix == "batch":
            if self.batch_size is None:
                raise ValueError(
                    "mix='batch' fixes the per-source counts of every batch, so it needs the "
                    "batch size: use ChunkShuffleBatchSampler(..., mix='batch')"
                )
            check_nonneg("batch_size", self.batch_size, 1)
            if self.epoch_samples < self.batch_size:
                raise ValueError(
                    f"mix='batch' draws whole batches, but epoch_samples={self.epoch_samples} "
                    f"is less than one batch of {self.batch_size}"
                )
            comp = mix_counts(self.batch_size, self.weights)
            if np.any(comp == 0):
                i = int(np.flatnonzero(comp == 0)[0])
                raise ValueError(
                    f"mix='batch': weights {list(self.weights)} give source {i} no sample in "
                    f"a batch of {self.batch_size} (per-batch counts {comp.tolist()}); raise "
                    "its weight or the batch size"
                )
        for i, (src, c) in enumerate(zip(self.sources, self.counts.tolist(), strict=True)):
            if c > 0 and src.size == 0:
                raise ValueError(
                    f"source {i} has no selected samples, but weights {list(self.weights)} "
                    f"give it {c} of each epoch; drop it from the ConcatDataset or the selection"
                )

    @property
    def composition(self) -> IntArray:
        """Samples of each source in every batch (mix="batch")."""
        assert self.batch_size is not None
        return mix_counts(self.batch_size, self.weights)

    @property
    def num_batches(self) -> int:
        """Batches per epoch (mix="batch")."""
        assert self.batch_size is not None
        return self.epoch_samples // self.batch_size

    @property
    def counts(self) -> IntArray:
        """Draws of each source per epoch; their sum is `num_ordered`."""
        if self.mix == "batch":
            return self.composition * self.num_batches
        return mix_counts(self.epoch_samples, self.weights)

    @property
    def num_ordered(self) -> int:
        """Samples in the global order of an epoch."""
        return int(self.counts.sum())

    @property
    def split_unit(self) -> int | None:
        """The batch size ranks split by (mix="batch"), else None (by samples)."""
        return self.batch_size if self.mix == "batch" else None

    def order(self, epoch: int, *, window: int, seed: int, shuffle: bool = True) -> IntArray:
        """The global order of ``epoch`` (the same for every world size)."""
        if self.mix == "batch":
            return batch_order(
                self.sources,
                self.composition,
                num_batches=self.num_batches,
                window=window,
                seed=seed,
                epoch=epoch,
                shuffle=shuffle,
            )
        return epoch_order(
            self.sources, self.counts, window=window, seed=seed, epoch=epoch, shuffle=shuffle
        )

    def rank_share(
        self,
        epoch: int,
        *,
        window: int,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
        drop_last: bool,
    ) -> IntArray:
        """This rank's slice of the global order of ``epoch`` (``readers.mixing.rank_share``)."""
        return rank_share(
            self.order(epoch, window=window, seed=seed, shuffle=shuffle),
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            batch_size=self.split_unit,
        )

    def rank_length(self, *, world_size: int, drop_last: bool) -> int:
        """Samples each rank gets per epoch (every rank the same)."""
        unit = self.split_unit or 1
        start, stop = rank_span(
            self.num_ordered // unit, rank=0, world_size=world_size, drop_last=drop_last
        )
        return (stop - start) * unit

    def mean_chunk_size(self) -> int:
        """Return the sources' chunk sizes averaged by their draws per epoch (at least 1).

        It is one number for what reads ahead by chunks.
        """
        counts = self.counts
        sizes = np.array([s.chunk_size for s in self.sources], dtype=np.int64)
        total = int(counts.sum())
        return max(1, round(float((sizes * counts).sum()) / total)) if total else 1

    def chunk_table(self) -> tuple[IntArray, IntArray]:
        """Every source's chunks as global id ranges ``(lo, hi)``, in id order."""
        los, his = [], []
        for src in self.sources:
            lo, hi = chunk_ranges(src.bounds, chunk_size=src.chunk_size, ids=src.ids)
            los.append(lo + src.offset)
            his.append(hi + src.offset)
        if not los:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        return np.concatenate(los), np.concatenate(his)

    def params(self) -> dict[str, object]:
        """What a resume state records of the mixture (JSON-friendly)."""
        return {
            "weights": list(self.weights),
            "epoch_samples": self.epoch_samples,
            "mix": self.mix,
            "mix_batch_size": self.split_unit,
            "chunk_sizes": [s.chunk_size for s in self.sources],
            "source_sizes": [s.size for s in self.sources],
        }


def _is_concat(dataset: Any) -> bool:
    return hasattr(dataset, "datasets") and hasattr(dataset, "offsets")


def mixture_of(
    dataset: Any,
    *,
    ids: IntArray | None,
    chunk_size: int | None,
    weights: Sequence[float] | None,
    epoch_samples: int | None,
    mix: str = "epoch",
    batch_size: int | None = None,
) -> Mixture:
    """The weighted mixture of a `ConcatDataset`'s sources, as the samplers and streams use it.

    Args:
        dataset: A ConcatDataset (anything with ``datasets`` and ``offsets``).
        ids: The selected global ids (sorted), or None for all.
        chunk_size: Samples per chunk of every source; None: each source's own size-based
            default (``readers.io.hints.resolve_chunk_size``).
        weights: One positive weight per source; None: the sources' selected sizes.
        epoch_samples: Samples per epoch; None: the selected samples of all sources.
        mix: ``"epoch"`` or ``"batch"``.
        batch_size: For ``mix="batch"``.

    Raises:
        ValueError: ``dataset`` is not a ConcatDataset, or the mixture's parameters are bad
            (`readers.mixing.Mixture`).
    """
    if not _is_concat(dataset):
        raise ValueError(
            f"weights=, epoch_samples= and mix= mix the sources of a readers.ConcatDataset, "
            f"but got a {type(dataset).__name__}; wrap the datasets: ConcatDataset([a, b, ...])"
        )
    offsets = np.asarray(dataset.offsets, dtype=np.int64)
    sources = []
    for s, d in enumerate(dataset.datasets):
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        local = None
        if ids is not None:
            part = ids[(ids >= lo) & (ids < hi)] - lo
            local = None if part.size == hi - lo else part.astype(np.int64)
        size = resolve_chunk_size(d, chunk_size, local)
        sources.append(MixSource(dataset_bounds(d), local, int(size), lo))
    if epoch_samples is None:
        epoch_samples = sum(src.size for src in sources)
        if epoch_samples == 0:
            raise ValueError("the ConcatDataset has no selected samples to mix")
    if weights is None:
        weights = [float(max(src.size, 0)) for src in sources]
    return Mixture(tuple(sources), tuple(weights), epoch_samples, mix, batch_size)
