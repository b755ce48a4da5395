"""What the samplers and ``ShardStream`` share: ranks, epochs, lengths and resume parameters.

That is: the rank and world size they split an order over, the epoch ``set_epoch`` chooses, a
rank's length, the parameters a resume state records, and the rest of an epoch resumed at another
world size (no paddle import unless the rank is left to ``paddle.distributed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from readers.augment_rng import tagged_batches, tagged_samples
from readers.order import IntArray, check_nonneg, chunk_order, rank_share, rank_span
from readers.resume import Segment, fingerprint, resume_share
from readers.selection import dataset_records_crc32

__all__ = ["DEFAULT_WINDOW", "RankedEpochs", "check_rank"]

DEFAULT_WINDOW = 8
"""Chunks per shuffle block of the samplers, and chunks per default shuffle buffer of
``ShardStream``: samples are mixed across this many chunks."""


def check_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``, from ``paddle.distributed`` where not given, validated."""
    if rank is None or world_size is None:
        import paddle.distributed as dist  # lazy: importing paddle is slow

        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    check_nonneg("world_size", world_size, 1)
    check_nonneg("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size, got rank={rank} world_size={world_size}")
    return int(rank), int(world_size)


class RankedEpochs:
    """An order of ``num_ordered`` samples split over ranks, one epoch at a time.

    The shared part of a sampler and a stream: ``epoch``, ``rank``, ``world_size``, this
    rank's length, ``set_epoch`` (which never runs inside ``__iter__``) and the parameters
    every resume state records. Subclasses call `_setup_epochs` in their constructor and
    extend `_order_params` and `_start_epoch`.

    After an elastic load (`_set_history`), the epoch named there is the rest of the saved
    epoch: ``_rest`` holds the positions of its global order still to yield
    (``readers.resume.rest_positions``), and ranks split those; `set_epoch` to another epoch
    forgets them.
    """

    _rank: int
    _world_size: int
    _seed: int
    _chunk_size: int
    _shuffle: bool
    _drop_last: bool
    _num_ordered: int
    _unit: int
    _epoch: int
    _fingerprint: int | None
    _records_crc32: int | None
    _history: tuple[Segment, ...]
    _rest: IntArray | None

    def _setup_epochs(
        self,
        *,
        rank: int | None,
        world_size: int | None,
        seed: int,
        chunk_size: int,
        shuffle: bool,
        drop_last: bool,
        num_ordered: int,
        unit: int = 1,
    ) -> None:
        """Set the split's parameters; ``unit`` samples make one unit of the split.

        ``unit`` is 1 (ranks split samples), or the batch size of a ``mix="batch"`` mixture
        (ranks split whole batches; ``num_ordered`` is then a multiple of it).
        """
        check_nonneg("seed", seed)
        check_nonneg("unit", unit, 1)
        self._rank, self._world_size = check_rank(rank, world_size)
        self._seed = int(seed)
        self._chunk_size = int(chunk_size)
        self._shuffle = bool(shuffle)
        self._drop_last = bool(drop_last)
        self._num_ordered = int(num_ordered)
        self._unit = int(unit)
        self._epoch = 0
        self._fingerprint = None
        self._records_crc32 = -1  # not computed yet; None: the dataset has no record CRCs
        self._history = ()
        self._rest = None

    @property
    def epoch(self) -> int:
        """The epoch the next pass yields (chosen by ``set_epoch``)."""
        return self._epoch

    @property
    def rank(self) -> int:
        """This rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks the order is split over."""
        return self._world_size

    @property
    def chunk_size(self) -> int:
        """Samples per chunk: the ``chunk_size`` given, or the one chosen by stored bytes."""
        return self._chunk_size

    @property
    def history(self) -> tuple[Segment, ...]:
        """The current epoch's earlier stretches at other world sizes (elastic resume)."""
        return self._history

    def _units_now(self) -> int:
        """Units of the current epoch's order the ranks split: all, or the rest after history."""
        return self._num_ordered // self._unit if self._rest is None else int(self._rest.size)

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (every rank the same).

        After an elastic load, those of its share of the rest.
        """
        start, stop = rank_span(
            self._units_now(),
            rank=self._rank,
            world_size=self._world_size,
            drop_last=self._drop_last,
        )
        return (stop - start) * self._unit

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next pass yields; a new epoch starts at 0."""
        check_nonneg("epoch", epoch)
        if int(epoch) != self._epoch:
            self._epoch = int(epoch)
            self._history, self._rest = (), None
            self._start_epoch()

    def _tag_samples(self, ids: Iterator[int]) -> Iterator[int]:
        """`ids` as `readers.augment_rng.SampleRef` when ``_dataset``'s transform takes rng.

        They carry this seed and epoch (the epoch when the pass starts).
        """
        return tagged_samples(ids, getattr(self, "_dataset", None), self._seed, self._epoch)

    def _tag_batches(self, batches: Iterator[list[int]]) -> Iterator[list[int]]:
        """`batches`, tagged as `_tag_samples` tags ids."""
        return tagged_batches(batches, getattr(self, "_dataset", None), self._seed, self._epoch)

    def _set_history(self, epoch: int, history: tuple[Segment, ...], rest: IntArray | None) -> None:
        """Make `epoch` current, as the rest of the saved epoch after `history`."""
        self._epoch = int(epoch)
        self._history, self._rest = tuple(history), rest

    def _share_of(self, order: IntArray, epoch: int) -> IntArray:
        """This rank's share of `epoch`'s global `order`, after any elastic resume.

        ``order`` holds ``num_ordered`` samples; with a ``unit`` above 1 the ranks split its
        whole units (``order[u * unit : (u + 1) * unit]`` is unit ``u``).
        """
        rest = self._rest if epoch == self._epoch else None
        if self._unit == 1:
            return resume_share(
                order,
                rest=rest,
                rank=self._rank,
                world_size=self._world_size,
                drop_last=self._drop_last,
            )
        units = resume_share(
            np.arange(order.size // self._unit, dtype=np.int64),
            rest=rest,
            rank=self._rank,
            world_size=self._world_size,
            drop_last=self._drop_last,
        )
        pos = units[:, None] * self._unit + np.arange(self._unit, dtype=np.int64)
        share: IntArray = order[pos.ravel()]
        return share

    def _rank_share(
        self, bounds: IntArray, *, epoch: int, window: int, ids: IntArray | None = None
    ) -> IntArray:
        """This rank's share of the global order of `epoch` (``readers.order.rank_share``)."""
        if self._rest is not None and epoch == self._epoch:
            order = chunk_order(
                bounds,
                chunk_size=self._chunk_size,
                window=window,
                seed=self._seed,
                epoch=epoch,
                shuffle=self._shuffle,
                ids=ids,
            )
            return self._share_of(order, epoch)
        return rank_share(
            bounds,
            chunk_size=self._chunk_size,
            window=window,
            seed=self._seed,
            epoch=epoch,
            rank=self._rank,
            world_size=self._world_size,
            drop_last=self._drop_last,
            shuffle=self._shuffle,
            ids=ids,
        )

    def _split_args(self) -> dict[str, Any]:
        """The arguments besides the epoch that split an order over the ranks."""
        return {
            "seed": self._seed,
            "shuffle": self._shuffle,
            "rank": self._rank,
            "world_size": self._world_size,
            "drop_last": self._drop_last,
        }

    def _start_epoch(self) -> None:
        """Forget the resume point of the previous epoch (`set_epoch` chose another)."""

    def _layout_crc32(self, *layout: IntArray | None) -> int:
        """A CRC-32 of the `layout` arrays (shard bounds, selection), computed once."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(*layout)
        return self._fingerprint

    def _dataset_crc32(self, dataset: Any) -> int | None:
        """CRC-32 of `dataset`'s record CRCs (``readers.selection.dataset_records_crc32``).

        It is computed once; None for a dataset without them.
        """
        if self._records_crc32 == -1:
            self._records_crc32 = dataset_records_crc32(dataset)
        return self._records_crc32

    def _order_params(self) -> dict[str, Any]:
        """The order parameters every resume state records and checks on load.

        The world size is not among them: a state records it apart, and loads at another
        (elastic resume, ``readers.resume``).
        """
        return {
            "seed": self._seed,
            "chunk_size": self._chunk_size,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
        }
