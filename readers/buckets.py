"""``BucketBatchSampler``: bucket-pure batches of width, height or aspect for a DataLoader.

It has the seed, epoch, rank, ``drop_last`` and (elastic) resume semantics of the chunked sampler.

The order of an epoch is :mod:`readers.bucket_order` (buckets from the index's quantiles or
given boundaries, chunks inside buckets, batches merged over buckets, contiguous rank shares of
the epoch's list of batches); resume counts whole batches (:mod:`readers.resume`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from readers.bucket_keys import (
    KEYS,
    KeyCodes,
    assign_buckets,
    bucket_batch_sizes,
    bucket_edges,
    key_codes,
    key_values,
    plan_buckets,
)
from readers.bucket_order import bucket_batches
from readers.epochs import DEFAULT_WINDOW, RankedEpochs
from readers.io.hints import resolve_chunk_size
from readers.mixture import Mixture, mixture_of
from readers.order import IntArray, check_nonneg
from readers.resume import Segment, fingerprint, read_sampler_state, sampler_state
from readers.reweight import changed_mixtures, reweighted_batches
from readers.selection import SizedDataset, dataset_bounds, select_ids

__all__ = [
    "KEYS",
    "BucketBatchSampler",
    "KeyCodes",
    "assign_buckets",
    "bucket_batch_sizes",
    "bucket_batches",
    "bucket_edges",
    "key_codes",
    "key_values",
]


class BucketBatchSampler(RankedEpochs):
    """Bucket-pure batches of this rank, for ``paddle.io.DataLoader(batch_sampler=...)``.

    Each batch holds samples of one bucket of width, height or aspect (``width / height``),
    read from the dataset's index alone; the epoch is a pure function of ``(seed, epoch)`` and
    the index (see the module docstring), split over ranks so that every rank yields the same
    number of batches. ``set_epoch`` chooses the epoch; ``state_dict(consumed_batches=k)`` and
    ``load_state_dict`` resume mid-epoch, at the saved world size or another (then the rest is
    the batches no rank had consumed, split over the new ranks; ``readers.resume``).

    Args:
        dataset: Sized, with an index holding ``width``/``height`` (a packed dataset, or a
            ``ConcatDataset`` of them), unless ``key`` is an array; optional ``shard_bounds``.
        batch_size: Samples per batch; with ``scale_batch``, those of the widest bucket.
        key: ``"width"``, ``"height"``, ``"aspect"``, or an array of one value per sample.
        buckets: ``K``: quantile buckets of the selected samples (at most ``K``, none empty);
            or the boundaries ``[e1, ..., e(K-1)]``, bucket ``b`` holding
            ``e(b) <= value < e(b+1)``.
        batch_sizes: One batch size per bucket, instead of ``batch_size`` in each.
        scale_batch: Bucket ``b`` holds ``floor(batch_size * top / top_b)`` samples (``top_b``
            its largest value, ``top`` the largest of all), so ``batch size x width`` stays
            about constant.
        chunk_size: Neighbouring members of a bucket per chunk; default about 1 MiB of stored
            bytes by the index (as for the chunked sampler).
        window: Chunks of a bucket per shuffle block; 0 keeps each chunk in id order.
        shuffle: False: ids ascending and buckets in order.
        seed: Non-negative seed shared by all ranks.
        drop_last: Drop each bucket's short last batch, and the last ``B % world_size``
            batches, instead of keeping the short batches and padding by repetition.
        rank: This rank; default ``paddle.distributed.get_rank()``.
        world_size: Number of ranks; default ``paddle.distributed.get_world_size()``.
        indices: A boolean mask over the dataset or an array of ids: sample only these.
        labels: Label values to keep (needs ``dataset.labels``); combined with ``indices``.
        weights: Over a ``readers.ConcatDataset``: one positive weight per source. Each epoch
            then buckets ``epoch_samples`` draws, source ``i`` exactly
            ``round(N * w_i / sum(w))`` of them (largest remainder, so the counts add up to
            ``N``), drawn as ``ChunkShuffleSampler`` draws them (chunk by chunk, without
            replacement until a source is used up, passes going on across epochs;
            :mod:`readers.mixing`). The boundaries stay those of all selected
            samples; the number of batches then differs from epoch to epoch.
        epoch_samples: Draws per epoch of such a mixture; default: all selected samples.
    """

    def __init__(
        self,
        dataset: SizedDataset,
        batch_size: int,
        *,
        key: str | npt.ArrayLike = "width",
        buckets: int | Sequence[float] = 8,
        batch_sizes: Sequence[int] | None = None,
        scale_batch: bool = False,
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
    ) -> None:
        check_nonneg("batch_size", batch_size, 1)
        if chunk_size is not None:
            check_nonneg("chunk_size", chunk_size, 1)
        check_nonneg("window", window)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self._dataset = dataset
        self._window = int(window)
        self._key = key if isinstance(key, str) else "values"
        dataset_bounds(dataset)  # checks shard_bounds against len
        self._ids = select_ids(dataset, indices, labels)  # None: all
        plan = plan_buckets(
            dataset,
            key,
            ids=self._ids,
            buckets=buckets,
            batch_size=self.batch_size,
            batch_sizes=batch_sizes,
            scale_batch=scale_batch,
        )
        self._edges, self._bucket, self._sizes = plan.edges, plan.bucket, plan.sizes
        self._counts = plan.counts
        self._mix: Mixture | None = None
        if weights is not None or epoch_samples is not None:
            self._mix = mixture_of(
                dataset,
                ids=self._ids,
                chunk_size=chunk_size,
                weights=weights,
                epoch_samples=epoch_samples,
            )
        nb = self._counts // self._sizes if drop_last else -(-self._counts // self._sizes)
        self._setup_epochs(
            rank=rank,
            world_size=world_size,
            seed=seed,
            chunk_size=resolve_chunk_size(dataset, chunk_size, self._ids),
            shuffle=shuffle,
            drop_last=drop_last,
            num_ordered=int(nb.sum()),  # without a mixture: the same in every epoch
        )
        self._offset = 0  # where the next pass starts, in batches of this rank's share
        self._done: int | None = None  # batches the latest pass yielded (None: no pass)
        self._cache: tuple[int, IntArray, IntArray, IntArray] | None = None
        self._buckets_crc: int | None = None

    # ------------------------------------------------------------------ properties
    @property
    def boundaries(self) -> list[float]:
        """The boundaries between buckets (``len + 1`` buckets)."""
        return [float(e) for e in self._edges]

    @property
    def batch_sizes(self) -> list[int]:
        """Samples per batch in each bucket."""
        return [int(b) for b in self._sizes]

    @property
    def bucket_counts(self) -> list[int]:
        """Selected samples in each bucket."""
        return [int(c) for c in self._counts]

    @property
    def mixture(self) -> Mixture | None:
        """The weighted mixture of a ConcatDataset's sources, or None without one."""
        return self._mix

    @property
    def num_batches(self) -> int:
        """Batches of the current epoch over all ranks (before padding or dropping)."""
        return self._batches_in(self._epoch)

    def _batches_in(self, epoch: int) -> int:
        """Batches of ``epoch`` over all ranks: the same in every epoch without a mixture."""
        if self._mix is None:
            return self._num_ordered
        return int(self.epoch_batches(epoch)[2].size)

    def _units_now(self) -> int:
        return self._batches_in(self._epoch) if self._rest is None else int(self._rest.size)

    @property
    def start_batch(self) -> int:
        """Batches of this rank's share the next pass skips.

        The loaded state's position at the saved world size, 0 after a load at another (count
        consumed batches from here).
        """
        return self._offset

    def __len__(self) -> int:
        """Batches this rank yields per epoch (every rank the same)."""
        return RankedEpochs.__len__(self)

    # ------------------------------------------------------------------ order
    def _start_epoch(self) -> None:
        self._offset = 0
        self._done = None

    def epoch_batches(self, epoch: int | None = None) -> tuple[IntArray, IntArray, IntArray]:
        """The epoch's global batches, ``(flat, bounds, batch_bucket)`` (`bucket_batches`)."""
        epoch = self._epoch if epoch is None else int(epoch)
        if self._cache is None or self._cache[0] != epoch:
            history = self._history if epoch == self._epoch else ()
            (flat, bounds, bucket), _ = _plan(self, self._mix, epoch, history)
            self._cache = (epoch, flat, bounds, bucket)
        return self._cache[1], self._cache[2], self._cache[3]

    def rank_order(self, epoch: int | None = None) -> IntArray:
        """The numbers of this rank's batches in ``epoch`` (into `epoch_batches`), in order."""
        epoch = self._epoch if epoch is None else int(epoch)
        return self._share_of(np.arange(self._batches_in(epoch), dtype=np.int64), epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return self._tag_batches(self._batches(self._epoch, self._offset))  # augment_rng

    def _batches(self, epoch: int, offset: int) -> Iterator[list[int]]:
        flat, bounds, _ = self.epoch_batches(epoch)
        share = self.rank_order(epoch)
        self._done = offset
        for j in range(offset, share.size):
            b = int(share[j])
            self._done = j + 1
            yield flat[bounds[b] : bounds[b + 1]].tolist()
        self._offset = 0  # the resume offset is used once

    # ------------------------------------------------------------------ resume
    def _params(self, mix: Mixture | None = None) -> dict[str, Any]:
        mix = self._mix if mix is None else mix
        if self._buckets_crc is None:
            self._buckets_crc = fingerprint(self._bucket, self._ids)
        params = self._order_params() | {
            "window": self._window,
            "key": self._key,
            "boundaries": self._edges.tolist(),
            "batch_sizes": self._sizes.tolist(),
            "num_selected": int(self._bucket.size),
            "buckets_crc32": self._buckets_crc,
            "records_crc32": self._dataset_crc32(self._dataset),
        }
        return params if mix is None else params | mix.params()

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The resume state (version 3, plain JSON; format in :mod:`readers.resume`).

        Args:
            consumed_batches: Batches of this rank's share the model consumed in the current
                epoch, counted from its start (or from an elastic resume). Default: the number
                this sampler has yielded, which runs ahead of training under a prefetching
                ``DataLoader``.
        """
        if consumed_batches is None:
            position = self._offset if self._done is None else self._done
        else:
            check_nonneg("consumed_batches", consumed_batches)
            if consumed_batches > len(self):
                raise ValueError(
                    f"consumed_batches={consumed_batches} exceeds this rank's {len(self)} "
                    "batches per epoch"
                )
            position = int(consumed_batches)
        return sampler_state(
            kind="BucketBatchSampler",
            epoch=self._epoch,
            position=position,
            world_size=self._world_size,
            history=self._history,
            params=self._params(),
        )

    def load_state_dict(
        self, state: dict[str, Any], *, weights: Sequence[float] | None = None
    ) -> None:
        """Resume: the next pass yields the rest of the saved epoch (see the class docstring).

        ``weights=``: new mixture weights for the rest of the epoch and later ones, as
        ``ChunkShuffleSampler.load_state_dict`` takes them; the consumed batches stay, the
        rest of the epoch's draws is drawn with them and bucketed anew
        (:func:`readers.reweight.reweighted_batches`).

        Raises:
            ValueError: the state is incomplete, of another sampler class or dataset, or was
                saved with other parameters (key, boundaries, batch sizes, seed, ...).
        """
        mix, saved = changed_mixtures(self._mix, state, weights)
        epoch, units, rest_of = state.get("epoch"), self._num_ordered, None
        if (
            isinstance(epoch, int)
            and not isinstance(epoch, bool)
            and epoch >= 0
            and mix is not None
        ):
            n_saved = len(state.get("history") or ())

            def rest_of(h: tuple[Segment, ...]) -> IntArray | None:  # a mixture's epochs differ
                return _plan(self, mix if len(h) > n_saved else saved or mix, epoch, h)[1]

            units = int(_plan(self, saved or mix, epoch, ())[0][2].size)
        r = read_sampler_state(
            state,
            self._params(saved or mix),
            kind="BucketBatchSampler",
            world_size=self._world_size,
            num_units=units,
            drop_last=self._drop_last,
            reweight_from=None if saved is None else saved.weights,
            rest_of=rest_of,
        )
        self._mix = mix
        self._set_history(r.epoch, r.history, r.rest)
        self._offset = r.position
        self._done = None
        self._cache = None


def _plan(
    s: BucketBatchSampler, mix: Mixture | None, epoch: int, history: tuple[Segment, ...]
) -> tuple[tuple[IntArray, IntArray, IntArray], IntArray | None]:
    """The batches of ``epoch`` after ``history``, and the positions of its rest."""

    def batches(members: IntArray | None, seed: int) -> tuple[IntArray, IntArray, IntArray]:
        bucket_of = s._bucket
        if members is not None:  # a mixture's draws, and their buckets
            bucket_of = s._bucket[members if s._ids is None else np.searchsorted(s._ids, members)]
        return bucket_batches(
            s._ids if members is None else members,
            bucket_of,
            batch_sizes=s._sizes,
            chunk_size=s._chunk_size,
            window=s._window,
            seed=seed,
            epoch=epoch,
            shuffle=s._shuffle,
            drop_last=s.drop_last,
        )

    if mix is None:
        return batches(None, s._seed), None
    return reweighted_batches(
        mix,
        history,
        epoch=epoch,
        seed=s._seed,
        shuffle=s._shuffle,
        drop_last=s._drop_last,
        batches=batches,
    )
