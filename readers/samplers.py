"""Chunked, cache-friendly samplers around the pure orders of :mod:`readers.order`.

The order of an epoch is ``readers.order.chunk_order`` (chunks of neighbouring ids in shuffled
order, mixed inside blocks of ``window`` chunks) split into contiguous rank shares
(``split_for_rank``); a default chunk holds about ``CHUNK_BYTES`` of stored bytes. Samplers
never change the order inside ``__iter__``: ``set_epoch`` chooses the epoch, and
``state_dict``/``load_state_dict`` resume mid-epoch, at the saved world size or another
(:mod:`readers.resume`; see :class:`ChunkShuffleSampler`). Each
chunk is hinted to ``dataset.prefetch`` a bounded distance ahead of its first read
(:mod:`readers.hints`). Over a ``readers.ConcatDataset``, ``weights=``/``epoch_samples=``/``mix=``
draw exact per-source counts each epoch instead (:mod:`readers.mixing`). When the dataset's
transform takes a keyword ``rng``, the ids are `readers.augment_rng.SampleRef` ints that carry
the sampler's seed and epoch to whichever worker reads them (reproducible augmentation).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from readers.epochs import DEFAULT_WINDOW, RankedEpochs
from readers.io.hints import (
    CHUNK_BYTES,
    DEFAULT_CHUNK_SIZE,
    PREFETCH_BYTES,
    ChunkHints,
    lookahead_samples,
    resolve_chunk_size,
)
from readers.mixture import Mixture, mixture_of
from readers.order import (
    IntArray,
    check_nonneg,
    chunk_order,
    chunk_ranges,
    split_for_rank,
)
from readers.resume import Segment, read_sampler_state, sampler_state
from readers.reweight import changed_mixtures, reweighted_order
from readers.selection import SizedDataset, dataset_bounds, select_ids

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_WINDOW",
    "PREFETCH_BYTES",
    "ChunkShuffleBatchSampler",
    "ChunkShuffleSampler",
    "chunk_order",
    "chunk_ranges",
    "split_for_rank",
]


@dataclass
class _Pass:
    """One iteration over this rank's share, from a start offset; ``done`` counts yields."""

    ids: IntArray  # this rank's remaining ids
    base: int  # samples of the epoch consumed before this pass
    hints: ChunkHints | None  # None: the dataset takes no hints
    done: int = 0


class ChunkShuffleSampler(RankedEpochs):
    """Yields this rank's sample ids for the current epoch in chunked, cache-friendly order.

    Works wherever paddle expects a ``paddle.io.Sampler`` (``paddle.io.BatchSampler(sampler=...)``
    accepts any iterable with ``__len__``); it does not subclass it so that importing this
    module does not import paddle.

    Resuming: the order is fixed by ``set_epoch``; ``__iter__`` only reads it. A pass starts at
    the offset set by ``load_state_dict`` (0 otherwise); that offset is used once: it is reset
    by ``set_epoch`` to another epoch and after a pass runs to its end. ``state_dict()`` records
    the position in this rank's share of the epoch. Without an argument it is the number of
    ids this sampler has yielded, but a ``DataLoader`` draws indices ahead of the model
    (``prefetch_factor`` batches per worker), so that count runs ahead of training; pass
    ``state_dict(consumed_samples=k)`` with the number of samples the model consumed in this
    epoch (including those before any resume). Every rank has the same length, so the state
    saved on rank 0 resumes every rank; the order parameters and the dataset must match.

    Elastic resume: a state saved with ``N`` ranks loads into a sampler built with ``M``; the
    rest of the epoch is then the samples no rank had consumed, split over the ``M`` ranks
    (padded by repetition, or with fewer than ``M`` dropped under ``drop_last``; see
    :mod:`readers.resume`). With ``mix="batch"`` the units are whole mixed batches: the state
    must be saved at a batch boundary (``ChunkShuffleBatchSampler.state_dict(consumed_batches=
    k)``), the rest is the mixed batches no rank had consumed, and every batch after the
    resume still holds the per-source counts. Positions then count from the resume point:
    `start_position` is 0, ``len()`` is this rank's share of the rest.

    Args:
        dataset: Sized; optional ``shard_bounds``, ``labels`` and ``prefetch(start, stop)``.
        chunk_size: Neighbouring samples per chunk; default (None): about ``CHUNK_BYTES``
            (1 MiB) of stored bytes by the dataset's index, 64 to 4096 samples (64 without
            an index). The value used is ``.chunk_size`` and is part of the resume state.
        window: Chunks per shuffle block; 0 keeps each chunk in id order.
        shuffle: False yields ids in ascending order (still split across ranks).
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop the remainder so ranks get ``n // world_size`` ids each, instead of
            padding to ``ceil(n / world_size)``.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
        indices: A boolean mask over the dataset or an array of ids: sample only these.
        labels: Label values to keep (needs ``dataset.labels``); combined with ``indices``.
        weights: Over a ``readers.ConcatDataset``: one positive weight per source; each epoch
            then draws ``epoch_samples`` samples, source ``i`` exactly
            ``round(N * w_i / sum(w))`` of them (largest remainder), without replacement
            within a source until it is exhausted, then a fresh pass of it, continuing across
            epochs (:mod:`readers.mixing`). Default (None): the sources' selected sizes when
            ``epoch_samples`` or ``mix`` asks for a mixture, else no mixing (one order over
            all samples, each once per epoch).
        epoch_samples: Samples per epoch of a mixture; default: all selected samples.
        mix: ``"epoch"`` (default) mixes the sources over the epoch; ``"batch"`` gives every
            batch of ``batch_size`` the same per-source counts (PaddleClas ``MixSampler``;
            ``ChunkShuffleBatchSampler`` passes its batch size).
        batch_size: The batch size whose per-source counts ``mix="batch"`` fixes.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        *,
        chunk_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        indices: npt.ArrayLike | None = None,
        labels: Iterable[int | str] | None = None,
        weights: Sequence[float] | None = None,
        epoch_samples: int | None = None,
        mix: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        if chunk_size is not None:
            check_nonneg("chunk_size", chunk_size, 1)
        check_nonneg("window", window)
        self._window = int(window)
        self._bounds = dataset_bounds(dataset)
        self._ids = select_ids(dataset, indices, labels)
        self._mix: Mixture | None = None
        if weights is not None or epoch_samples is not None or mix is not None:
            self._mix = mixture_of(
                dataset,
                ids=self._ids,
                chunk_size=chunk_size,
                weights=weights,
                epoch_samples=epoch_samples,
                mix="epoch" if mix is None else mix,
                batch_size=batch_size,
            )
        self._setup_epochs(
            rank=rank,
            world_size=world_size,
            seed=seed,
            chunk_size=(
                resolve_chunk_size(dataset, chunk_size, self._ids)
                if self._mix is None
                else self._mix.mean_chunk_size()
            ),
            shuffle=shuffle,
            drop_last=drop_last,
            num_ordered=(
                (int(self._bounds[-1]) if self._ids is None else self._ids.size)
                if self._mix is None
                else self._mix.num_ordered
            ),
            unit=1 if self._mix is None else self._mix.split_unit or 1,
        )
        self._dataset = dataset  # for the records' fingerprint of a resume state
        prefetch = getattr(dataset, "prefetch", None)
        self._prefetch = prefetch if callable(prefetch) else None
        self._lookahead = lookahead_samples(dataset, chunk_size=self._chunk_size, window=window)
        self._offset = 0  # where the next pass starts (set by load_state_dict)
        self._pass: _Pass | None = None  # the latest pass, for state_dict()
        self._cache: tuple[int, IntArray] | None = None  # (epoch, this rank's share)

    # ------------------------------------------------------------------ properties
    @property
    def num_selected(self) -> int:
        """Selected samples over all ranks (before padding or dropping).

        For a mixture, its samples per epoch.
        """
        return self._num_ordered

    @property
    def mixture(self) -> Mixture | None:
        """The weighted mixture of a ConcatDataset's sources, or None without one."""
        return self._mix

    @property
    def start_position(self) -> int:
        """Where the next pass starts in this rank's share.

        The loaded state's position at the saved world size, 0 after a load at another (or no
        load).
        """
        return self._offset

    # ------------------------------------------------------------------ order
    def _start_epoch(self) -> None:
        self._offset = 0
        self._pass = None
        self._cache = None  # it may hold a resumed epoch's share (after an elastic load)

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """This rank's full share of the order for ``epoch`` (default: the current one)."""
        epoch = self._epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            if self._mix is None:
                share = self._rank_share(
                    self._bounds, epoch=epoch, window=self._window, ids=self._ids
                )
            elif self._rest is not None and epoch == self._epoch:  # after an elastic load
                order = _mixed_order(self, self._mix, epoch)
                share = self._share_of(order, epoch)
            else:
                share = self._mix.rank_share(epoch, window=self._window, **self._split_args())
            self._cache = (epoch, share)
        return self._cache[1]

    def _start_pass(self) -> _Pass:
        ids = self.rank_order()[self._offset :]
        hints = None
        if self._prefetch is not None:
            hints = ChunkHints(
                self._prefetch,
                ids,
                bounds=self._bounds,
                chunk_size=self._chunk_size,
                selected=self._ids,
                chunks=None if self._mix is None else self._mix.chunk_table(),
            )
        self._pass = _Pass(ids=ids, base=self._offset, hints=hints)
        return self._pass

    def _finish_pass(self, p: _Pass) -> None:
        if self._pass is p:
            self._offset = 0  # the resume offset is used once

    def __iter__(self) -> Iterator[int]:
        return self._tag_samples(self._samples(self._start_pass()))

    def _samples(self, p: _Pass) -> Iterator[int]:
        piece = 4096  # tolist() in pieces: python ints without one huge list
        ahead, hints = self._lookahead, p.hints
        due = -1
        for s in range(0, p.ids.size, piece):
            stop = min(s + piece, p.ids.size)
            if hints is None:
                for j, idx in enumerate(p.ids[s:stop].tolist(), s):
                    p.done = j + 1
                    yield idx
                continue
            for j, idx in enumerate(p.ids[s:stop].tolist(), s):
                if j >= due >= 0 or j == 0:
                    hints.until(j + 1 + ahead)
                    due = hints.due(ahead)
                p.done = j + 1
                yield idx
        self._finish_pass(p)

    def _batches(self, batch_size: int, drop_last: bool) -> Iterator[list[int]]:
        return self._tag_batches(self._iter_batches(self._start_pass(), batch_size, drop_last))

    def _iter_batches(self, p: _Pass, batch_size: int, drop_last: bool) -> Iterator[list[int]]:
        n = p.ids.size
        end = n - n % batch_size if drop_last else n
        for s in range(0, end, batch_size):
            stop = min(s + batch_size, n)
            if p.hints is not None:
                p.hints.until(stop + self._lookahead)
            p.done = stop
            yield p.ids[s:stop].tolist()
        self._finish_pass(p)

    # ------------------------------------------------------------------ resume
    def _params(self, mix: Mixture | None = None) -> dict[str, Any]:
        mix = self._mix if mix is None else mix
        params = self._order_params() | {
            "window": self._window,
            "num_selected": self._num_ordered,
            "selection_crc32": self._layout_crc32(self._bounds, self._ids),
            "records_crc32": self._dataset_crc32(self._dataset),
        }
        if mix is None:
            return params
        return params | mix.params() | {"chunk_size": mix.mean_chunk_size()}

    def state_dict(self, consumed_samples: int | None = None) -> dict[str, Any]:
        """The resume state: epoch, position in this rank's share, and the order parameters.

        The format (version 3, plain JSON) is in :mod:`readers.resume`.

        Args:
            consumed_samples: Samples of this rank's share the model consumed in the current
                epoch, counted from the epoch's start (after a load at another world size:
                from that resume point). Default: the number this sampler has yielded, which
                runs ahead of training under a prefetching ``DataLoader``.
        """
        if consumed_samples is None:
            p = self._pass
            position = self._offset if p is None else p.base + p.done
        else:
            check_nonneg("consumed_samples", consumed_samples)
            if consumed_samples > len(self):
                raise ValueError(
                    f"consumed_samples={consumed_samples} exceeds this rank's "
                    f"{len(self)} samples per epoch"
                )
            position = int(consumed_samples)
        return sampler_state(
            kind="ChunkShuffleSampler",
            epoch=self._epoch,
            position=position,
            world_size=self._world_size,
            history=self._history,
            params=self._params(),
        )

    def load_state_dict(
        self, state: dict[str, Any], *, weights: Sequence[float] | None = None
    ) -> None:
        """Resume: the next pass yields the rest of the saved epoch.

        At the saved world size, from the saved position of this rank's share; at another,
        this rank's share of the samples no rank had consumed (see the class docstring).

        Args:
            state: As ``state_dict`` saved it.
            weights: A mixture's new weights for the rest of the saved epoch and later epochs:
                the consumed samples stay consumed, the epoch's other draws are drawn anew by
                these weights and split over the ranks as an elastic resume splits them
                (:mod:`readers.reweight`). Without it, a state of other weights is refused.

        Raises:
            ValueError: the state is incomplete, of another dataset or selection of samples,
                or was saved with other order parameters (the order would differ, so resuming
                would repeat some samples and skip others); or ``weights`` are bad.
        """
        mix, saved = changed_mixtures(self._mix, state, weights)
        r = read_sampler_state(
            state,
            self._params(saved or mix),
            kind="ChunkShuffleSampler",
            world_size=self._world_size,
            num_units=self._num_ordered // self._unit,
            drop_last=self._drop_last,
            unit=self._unit,
            reweight_from=None if saved is None else saved.weights,
        )
        if mix is not self._mix and mix is not None:  # new weights: new counts, chunk mean
            self._mix, self._chunk_size = mix, mix.mean_chunk_size()
            self._lookahead = lookahead_samples(
                self._dataset, chunk_size=mix.mean_chunk_size(), window=self._window
            )
        self._set_history(r.epoch, r.history, r.rest)
        self._offset = r.position
        self._pass = None
        self._cache = None


def _mixed_order(s: ChunkShuffleSampler, mix: Mixture, epoch: int) -> IntArray:
    """The global order of a mixture's ``epoch``, after any change of weights in its history."""
    return reweighted_order(
        mix,
        s.history if epoch == s.epoch else (),
        epoch=epoch,
        window=s._window,
        seed=s._seed,
        shuffle=s._shuffle,
        drop_last=s._drop_last,
        unit=s._unit,
    )


class ChunkShuffleBatchSampler:
    """Batches of :class:`ChunkShuffleSampler` ids, for ``DataLoader(batch_sampler=...)``.

    A plain class: ``paddle.io.DataLoader`` only iterates a batch sampler and takes its
    ``len``. Positions in ``state_dict`` are in samples, like the sampler's; ``consumed_batches``
    is a shorthand for ``consumed_batches * batch_size`` samples.

    Args:
        dataset: As for :class:`ChunkShuffleSampler`.
        batch_size: Ids per batch.
        drop_last: Drop the last partial batch, and also the remainder that does not divide
            among ranks (instead of padding it); all ranks yield the same number of batches.
        **kwargs: The other arguments of :class:`ChunkShuffleSampler`; with
            ``mix="batch"`` every batch holds the same per-source counts.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        *,
        batch_size: int,
        drop_last: bool = False,
        chunk_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        indices: npt.ArrayLike | None = None,
        labels: Iterable[int | str] | None = None,
        weights: Sequence[float] | None = None,
        epoch_samples: int | None = None,
        mix: str | None = None,
    ) -> None:
        check_nonneg("batch_size", batch_size, 1)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.sampler = ChunkShuffleSampler(
            dataset,
            chunk_size=chunk_size,
            window=window,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            indices=indices,
            labels=labels,
            weights=weights,
            epoch_samples=epoch_samples,
            mix=mix,
            batch_size=batch_size,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next pass yields."""
        return self.sampler.epoch

    @property
    def history(self) -> tuple[Segment, ...]:
        """See :attr:`readers.epochs.RankedEpochs.history`."""
        return self.sampler.history

    @property
    def chunk_size(self) -> int:
        """Samples per chunk: the ``chunk_size`` given, or the one chosen by stored bytes."""
        return self.sampler.chunk_size

    @property
    def start_batch(self) -> int:
        """Batches of the epoch the next pass skips.

        The loaded state's position at the saved world size, 0 after a load at another (count
        consumed batches on from here).
        """
        return -(-self.sampler.start_position // self.batch_size)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler._batches(self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """See :meth:`ChunkShuffleSampler.set_epoch`."""
        self.sampler.set_epoch(epoch)

    def state_dict(
        self, consumed_batches: int | None = None, *, consumed_samples: int | None = None
    ) -> dict[str, Any]:
        """The sampler's state; position in samples. Give at most one of the two counts.

        Args:
            consumed_batches: Batches of the current epoch the model consumed, from its start
                (after a load at another world size: from that resume point, `start_batch`).
            consumed_samples: The same, in samples.
        """
        if consumed_batches is not None:
            if consumed_samples is not None:
                raise ValueError("give consumed_batches or consumed_samples, not both")
            check_nonneg("consumed_batches", consumed_batches)
            if consumed_batches > len(self):
                raise ValueError(
                    f"consumed_batches={consumed_batches} exceeds the {len(self)} batches per epoch"
                )
            # The last batch may be partial (or dropped): clamp to the samples that exist.
            consumed_samples = min(consumed_batches * self.batch_size, len(self.sampler))
        return self.sampler.state_dict(consumed_samples)

    def load_state_dict(
        self, state: dict[str, Any], *, weights: Sequence[float] | None = None
    ) -> None:
        """See :meth:`ChunkShuffleSampler.load_state_dict` (``weights=``: new mixture weights)."""
        self.sampler.load_state_dict(state, weights=weights)
