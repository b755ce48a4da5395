"""A random generator per sample, so that augmentation survives resumes and other worker counts.

A transform that takes a keyword ``rng`` (``def aug(image, *, rng): ...``, or a
`readers.transforms.DecodePlanner` whose ``plan`` takes it) is called with
``rng=sample_rng(seed, epoch, sample_id)``: a ``numpy.random.Generator`` that depends on nothing
else, so a sample gets the same augmentation whatever the number of DataLoader workers or ranks
and wherever a run resumed. Which transforms take it is read from their signature once
(`rng_use`, cached).

Where ``(seed, epoch)`` come from: a DataLoader's batch sampler runs in the main process and
``__getitem__`` in the workers, which may be persistent (forked once, so a later ``set_epoch``
in the main process never reaches them). So the samplers (``ChunkShuffleSampler``,
``ChunkShuffleBatchSampler``, ``BucketBatchSampler``) hand the seed and epoch over with each id:
when their dataset's transform takes ``rng``, they yield `SampleRef` ids, ints that carry the
sampler's seed and epoch through the loader's index queue (they pickle with them). ``ShardStream``
gives its own seed and epoch the same way. A plain int id (``ds[i]``, paddle's own samplers)
carries none: the dataset then uses those of its own ``set_epoch(epoch, seed=...)`` (`RngEpoch`;
it reaches workers forked after the call, not persistent ones), and without that call it passes
``rng`` only to transforms that require it (no default), seeded with ``(0, 0)``; a transform whose
``rng`` defaults to None keeps its old behaviour (`readers.transforms.RandomResizedCropDraft` then
draws from numpy's and Python's global generators, as paddle's ``RandomResizedCrop`` does).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "AUGMENT_TAG",
    "NO",
    "OPTIONAL",
    "REQUIRED",
    "LendRng",
    "RngEpoch",
    "SampleRef",
    "dataset_wants_rng",
    "lent_rng",
    "refs",
    "relocated",
    "rng_kwargs",
    "rng_use",
    "sample_rng",
    "tagged_batches",
    "tagged_samples",
    "transform_rng",
]

AUGMENT_TAG = 0x415547  # "AUG": keeps these generators apart from the orders' and mixing's

NO, OPTIONAL, REQUIRED = 0, 1, 2
"""What `rng_use` says of a callable: no ``rng`` parameter, one with a default, one without."""


def sample_rng(seed: int, epoch: int, sample: int) -> np.random.Generator:
    """The generator of sample id `sample` in `epoch`: ``default_rng([seed, epoch, sample, TAG])``.

    Over a ``ConcatDataset`` (or a ``ShardStream`` of several sources) `sample` is the id in the
    concatenation.
    """
    return np.random.default_rng([int(seed), int(epoch), int(sample), AUGMENT_TAG])


class SampleRef(int):
    """A sample id that carries the seed and epoch of the sampler (or stream) that drew it.

    It is the int id everywhere (indexing, arithmetic, ``==``); a dataset whose transform takes
    ``rng`` seeds it from ``(seed, epoch, sample)``. ``sample`` is the id the generator is
    keyed by: the id itself, or the id in a ``ConcatDataset`` when the int is a source's local
    id (`relocated`).
    """

    seed: int
    epoch: int
    sample: int

    def __new__(cls, value: int, seed: int, epoch: int, sample: int | None = None) -> SampleRef:
        """An id `value` drawn in `epoch` with `seed` (keyed by `sample`, default `value`)."""
        ref = super().__new__(cls, value)
        ref.seed, ref.epoch = int(seed), int(epoch)
        ref.sample = int(value) if sample is None else int(sample)
        return ref

    def __reduce__(self) -> tuple[Any, ...]:
        return SampleRef, (int(self), self.seed, self.epoch, self.sample)

    def __repr__(self) -> str:
        return f"SampleRef({int(self)}, seed={self.seed}, epoch={self.epoch}, sample={self.sample})"

    def rng(self) -> np.random.Generator:
        """`sample_rng` of this id."""
        return sample_rng(self.seed, self.epoch, self.sample)


def relocated(ref: int, local: int) -> int:
    """`local` (a source's id of the concatenation's id `ref`), carrying `ref`'s seed and epoch."""
    if isinstance(ref, SampleRef):
        return SampleRef(local, ref.seed, ref.epoch, ref.sample)
    return local


def refs(ids: list[int], seed: int, epoch: int) -> list[int]:
    """`ids` as `SampleRef` of `seed` and `epoch`."""
    return [SampleRef(i, seed, epoch) for i in ids]


# --------------------------------------------------------------------------- which transforms

_USE: dict[int, tuple[Any, int]] = {}  # id of what was inspected -> (it, kept alive; its use)
_USE_LIMIT = 1024  # forget all past this many (lambdas made per call must not grow it forever)


def _signature_target(fn: Any) -> Any:
    """What `fn`'s signature is read from.

    A bound method's function, a callable object's class's ``__call__`` (the same for every
    instance), else `fn` itself.
    """
    if inspect.ismethod(fn):
        return fn.__func__
    if inspect.isroutine(fn):
        return fn
    owner = next((k for k in type(fn).__mro__ if "__call__" in k.__dict__), None)
    call = None if owner is None else owner.__dict__["__call__"]
    return call if inspect.isfunction(call) else fn


def _read_use(target: Any) -> int:
    try:
        parameter = inspect.signature(target).parameters.get("rng")
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return NO
    if parameter is None or parameter.kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ):
        return NO
    return OPTIONAL if parameter.default is not inspect.Parameter.empty else REQUIRED


def rng_use(fn: Any) -> int:
    """Whether callable `fn` takes a keyword ``rng``: `NO`, `OPTIONAL` (a default) or `REQUIRED`.

    A planner (with ``plan`` and ``apply``) is asked of its ``plan``. Read once per function,
    or per class for callable objects (``inspect.signature``), then cached.
    """
    if fn is None:
        return NO
    plan = getattr(fn, "plan", None)
    if callable(plan) and callable(getattr(fn, "apply", None)):
        fn = plan
    target = _signature_target(fn)
    hit = _USE.get(id(target))
    if hit is not None and hit[0] is target:
        return hit[1]
    use = _read_use(target)
    if len(_USE) >= _USE_LIMIT:
        _USE.clear()
    _USE[id(target)] = (target, use)
    return use


def rng_kwargs(fn: Any, rng: np.random.Generator | None) -> dict[str, Any]:
    """``{"rng": rng}`` when `fn` takes it and there is one, else ``{}``."""
    return {"rng": rng} if rng is not None and rng_use(fn) else {}


def dataset_wants_rng(dataset: Any) -> bool:
    """Whether `dataset`'s transform, or a source's of a ``ConcatDataset``, takes ``rng``."""
    if rng_use(getattr(dataset, "transform", None)):
        return True
    sources = getattr(dataset, "datasets", None)
    return isinstance(sources, list | tuple) and any(dataset_wants_rng(d) for d in sources)


def transform_rng(
    transform: Any, i: int, sample: int, own: tuple[int, int] | None = None
) -> np.random.Generator | None:
    """The generator `transform` gets for id `i` (`sample`: the id as located), or None.

    From `i`'s seed and epoch when it is a `SampleRef`; else from `own` (a dataset's
    ``set_epoch``), or ``(0, 0)`` when `transform` requires ``rng``; None when `transform` does
    not take one, or takes it optionally and no seed and epoch are known.
    """
    use = rng_use(transform)
    if use == NO:
        return None
    if isinstance(i, SampleRef):
        return i.rng()
    if own is None and use == OPTIONAL:
        return None
    seed, epoch = (0, 0) if own is None else own
    return sample_rng(seed, epoch, sample)


class RngEpoch:
    """``set_epoch(epoch, seed=...)`` of a dataset: the seed and epoch of plain int ids."""

    rng_epoch: tuple[int, int] | None = None
    """``(seed, epoch)`` for the ids that carry none (not `SampleRef`), or None before
    `set_epoch`."""

    def set_epoch(self, epoch: int, *, seed: int = 0) -> None:
        """Seed the ``rng`` of transforms for plain int ids (``ds[i]``, paddle's own samplers).

        The samplers of `readers` and ``ShardStream`` pass their own seed and epoch with each
        id and need no call. A DataLoader's workers see this when they start after it: each
        epoch with ``persistent_workers=False``, never with persistent workers.
        """
        if int(epoch) < 0 or int(seed) < 0:
            raise ValueError(f"epoch and seed must be >= 0, got epoch={epoch} seed={seed}")
        self.rng_epoch = (int(seed), int(epoch))


# --------------------------------------------------------------------------- planning in a read

_LENT = threading.local()


class LendRng:
    """Within a ``with`` block, `lent_rng(dataset)` is `rng` in this thread (None: nothing lent).

    A dataset's planner draws its plan inside the format's read, before decoding: this is how
    the read learns the generator of the sample ``__getitem__`` was asked for.
    """

    __slots__ = ("_lent", "_saved")

    def __init__(self, dataset: Any, rng: np.random.Generator | None) -> None:
        self._lent = None if rng is None else (dataset, rng)
        self._saved: Any = None

    def __enter__(self) -> None:
        if self._lent is not None:
            self._saved = getattr(_LENT, "lent", None)
            _LENT.lent = self._lent

    def __exit__(self, *exc: object) -> None:
        if self._lent is not None:
            _LENT.lent = self._saved


def lent_rng(dataset: Any) -> np.random.Generator | None:
    """The generator lent to reads of `dataset` in this thread (`LendRng`), or None."""
    lent = getattr(_LENT, "lent", None)
    return lent[1] if lent is not None and lent[0] is dataset else None


def tagged_batches(
    batches: Iterator[list[int]], dataset: Any, seed: int, epoch: int
) -> Iterator[list[int]]:
    """`batches`, their ids as `SampleRef` when `dataset` wants ``rng``, else unchanged."""
    if not dataset_wants_rng(dataset):
        return batches
    return (refs(batch, seed, epoch) for batch in batches)


def tagged_samples(ids: Iterator[int], dataset: Any, seed: int, epoch: int) -> Iterator[int]:
    """`ids` as `SampleRef` when `dataset` wants ``rng``, else unchanged."""
    if not dataset_wants_rng(dataset):
        return ids
    return (SampleRef(i, seed, epoch) for i in ids)
