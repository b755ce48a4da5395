"""``ConcatDataset``: several datasets as one map-style dataset, ``ds[offsets[s] + j] == src_s[j]``.

Each source keeps its own shards, index, handles and read-ahead: ``ds[i]`` is the source's
``ds[j]`` for the local id ``j = i - offsets[s]``, so the source's read-ahead watches its own
local ids. The concatenation answers what the samplers ask of one dataset (``shard_bounds``,
``index.nbytes``, ``labels``, ``prefetch``) with the offsets applied, and exposes its sources
(``datasets``, ``offsets``) for weighted mixing (:mod:`readers.mixture`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from readers.augment_rng import RngEpoch, SampleRef, relocated, rng_use
from readers.order import IntArray
from readers.selection import dataset_bounds
from readers.stream_reader import finish_item, open_source

__all__ = [
    "CLASSES",
    "ConcatDataset",
    "ConcatIndex",
    "StreamSources",
    "open_stream_sources",
]

CLASSES = ("keep", "union")
"""How a ConcatDataset treats int class ids: as each source stores them, or remapped into the
union of the sources' class names (``meta.json`` ``classes``)."""


@dataclass(frozen=True)
class ConcatIndex:
    """The part of a packed index that samplers read (stored sizes), over all sources."""

    nbytes: np.ndarray


def _class_names(dataset: Any, source: int) -> list[str]:
    """The class names in ``meta.json`` of a source (index = class id), or ValueError."""
    meta = getattr(getattr(dataset, "index", None), "meta", None)
    names = meta.get("classes") if isinstance(meta, dict) else None
    if not isinstance(names, list) or not names:
        where = getattr(dataset, "root", type(dataset).__name__)
        raise ValueError(
            f"classes='union' maps class ids by name, but source {source} ({where}) has no "
            "'classes' list in its meta.json; use classes='keep' and map its labels yourself"
        )
    return [str(n) for n in names]


def _shared_classes(datasets: Sequence[Any]) -> list[str] | None:
    """The class names every source has, when they are one list; else None."""
    first = getattr(datasets[0], "classes", None)
    if not first or any(getattr(d, "classes", None) != first for d in datasets[1:]):
        return None
    return list(first)


class ConcatDataset(RngEpoch, paddle.io.Dataset[tuple[Any, Any]]):
    """Several datasets (any mix of formats) as one: ``ds[offsets[s] + j]`` is ``datasets[s][j]``.

    Labels are each source's own by default (``classes="keep"``): class id 3 of one dataset
    and class id 3 of another are the same number; tell them apart with `source_of`.
    ``classes="union"`` remaps int class ids into the union of the sources' class names (from
    each ``meta.json``: source 0's classes in their order, then each later source's new names),
    so that equal names share one id and different names never do; the union is ``.classes``.
    With ``"keep"``, ``.classes`` is the sources' list when they all have the same one, else
    None; ``.num_classes`` is its length (or None).

    Pickles and forks like its sources (each drops its handles; nothing else is held).

    A source's transform that takes ``rng`` gets the generator of the id in the concatenation
    (`readers.augment_rng`): the seed and epoch of the sampler's `SampleRef` ids, or of this
    dataset's ``set_epoch`` for plain ids.

    Args:
        datasets: The sources, in order: open datasets, or paths opened with
            ``readers.open_dataset(path, **open_kwargs)``.
        classes: ``"keep"`` or ``"union"`` (see above).
        **open_kwargs: For the sources given as paths (``transform``, ``decode``, ...).

    Raises:
        ValueError: no sources, an unknown ``classes``, or ``classes="union"`` over a source
            without class names or with labels that are not class ids.
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        *,
        classes: str = "keep",
        **open_kwargs: Any,
    ) -> None:
        if isinstance(datasets, str | os.PathLike) or len(datasets) == 0:
            raise ValueError(
                f"ConcatDataset needs a list of datasets or paths, got {datasets!r}; "
                "give ConcatDataset([ds_a, ds_b, ...])"
            )
        if classes not in CLASSES:
            raise ValueError(f"classes={classes!r}: expected 'keep' or 'union'")
        from readers.datasets import open_dataset

        self.datasets: list[Any] = [
            open_dataset(d, **open_kwargs) if isinstance(d, str | os.PathLike) else d
            for d in datasets
        ]
        self.class_mode = classes
        sizes = [len(d) for d in self.datasets]
        self.offsets: IntArray = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        """Source ``s`` holds ids ``[offsets[s], offsets[s + 1])``; ``offsets[-1] == len``."""
        starts = self.offsets[:-1].tolist()
        ends = [dataset_bounds(d)[1:] + o for d, o in zip(self.datasets, starts, strict=True)]
        self.shard_bounds: IntArray = np.concatenate([[0], *ends]).astype(np.int64)
        self.index: ConcatIndex | None = self._concat_index()
        self.classes: list[str] | None = _shared_classes(self.datasets)
        """Class names by id: with ``classes="keep"`` the sources' when they all have the
        same list (else None, as ids of different sources may name different classes);
        with ``"union"`` the union."""
        self._remap: list[np.ndarray] | None = None
        if classes == "union":
            self._union_classes()

    # --- layout --------------------------------------------------------------------------------

    def _concat_index(self) -> ConcatIndex | None:
        parts = []
        for d in self.datasets:
            nbytes = getattr(getattr(d, "index", None), "nbytes", None)
            if nbytes is None or len(nbytes) != len(d):
                return None
            parts.append(np.asarray(nbytes, dtype=np.int64))
        return ConcatIndex(np.concatenate(parts))

    def _union_classes(self) -> None:
        union: dict[str, int] = {}
        tables = []
        for s, d in enumerate(self.datasets):
            names = _class_names(d, s)
            tables.append(np.array([union.setdefault(n, len(union)) for n in names], np.int64))
        self.classes = list(union)
        self._remap = tables
        for s, d in enumerate(self.datasets):
            if getattr(d, "labels", None) is None:
                raise ValueError(
                    f"classes='union' remaps int class ids, but the labels of source {s} "
                    f"({getattr(d, 'root', type(d).__name__)}) are not all class ids"
                )

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_classes(self) -> int | None:
        """``len(classes)``, or None when ``classes`` is None."""
        return None if self.classes is None else len(self.classes)

    def source_of(self, i: int) -> int:
        """The number of the source that holds id ``i`` (negative ids count from the end)."""
        return self.locate(i)[0]

    def locate(self, i: int) -> tuple[int, int]:
        """``(source, local id)`` of id ``i``; IndexError when out of range."""
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for a ConcatDataset of {n}")
        s = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return s, i - int(self.offsets[s])

    @property
    def labels(self) -> np.ndarray | None:
        """Return every sample's int label (remapped with ``classes="union"``).

        None when some source's labels are not all class ids.
        """
        parts = []
        for s, d in enumerate(self.datasets):
            lab = getattr(d, "labels", None)
            if lab is None:
                return None
            lab = np.asarray(lab, dtype=np.int64)
            parts.append(lab if self._remap is None else self._remap[s][lab])
        return np.concatenate(parts)

    # --- reading -------------------------------------------------------------------------------

    def _label(self, s: int, label: Any) -> Any:
        if self._remap is None or not isinstance(label, int | np.integer):
            return label
        return int(self._remap[s][int(label)])

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        s, j = self.locate(i)
        if not isinstance(i, SampleRef) and self.rng_epoch is not None:
            i = SampleRef(int(self.offsets[s]) + j, *self.rng_epoch)
        image, label = self.datasets[s][relocated(i, j)]
        return image, self._label(s, label)

    def read_bytes(self, i: int) -> bytes:
        """The stored bytes of sample ``i`` (its source's ``read_bytes``)."""
        s, j = self.locate(i)
        return self.datasets[s].read_bytes(j)  # type: ignore[no-any-return]

    def decode_stored(self, data: Any, i: int, mode: str | None = None) -> Any:
        """Decode the stored bytes of sample ``i`` as its source does."""
        s, j = self.locate(i)
        return self.datasets[s].decode_stored(data, j, mode)

    def prefetch(self, start: int, stop: int) -> None:
        """Hint ids ``[start, stop)`` to the sources that hold them (those with ``prefetch``)."""
        start, stop = max(0, int(start)), min(len(self), int(stop))
        for s, d in enumerate(self.datasets):
            lo, hi = max(start, int(self.offsets[s])), min(stop, int(self.offsets[s + 1]))
            hint = getattr(d, "prefetch", None)
            if lo < hi and callable(hint):
                hint(lo - int(self.offsets[s]), hi - int(self.offsets[s]))


# --------------------------------------------------------------------------- for ShardStream


@dataclass(frozen=True)
class StreamSources:
    """What ShardStream reads: one dataset (``single``) or the concatenation of several.

    It also holds each source's decode mode (None: not packed) and transform.
    """

    dataset: Any
    decodes: tuple[str | None, ...]
    transforms: tuple[Callable[[Any], Any] | None, ...]
    single: bool
    draft: Any = None
    """The ``draft=`` the sources decode JPEGs at (`readers.draft`), or None."""

    def opened(
        self, decode: str | None, transform: Callable[[Any], Any] | None
    ) -> tuple[Any, str | None, Callable[[Any], Any] | None]:
        """Return ``(dataset, decode, transform)`` of the one source, or of the ones asked for.

        Each of several sources decodes with its own.
        """
        if self.single:
            return self.dataset, self.decodes[0], self.transforms[0]
        return self.dataset, decode, transform

    def finish(self, i: int, item: Any) -> Any:
        """``finish_item`` of sample ``i`` with the decode mode and transform of its source."""
        if self.single:
            return finish_item(
                self.dataset, i, item, decode=self.decodes[0], transform=self.transforms[0]
            )
        s, j = self.dataset.locate(i)
        source = self.dataset.datasets[s]
        j = relocated(i, j)  # a transform's rng is keyed by the id in the concatenation
        return finish_item(source, j, item, decode=self.decodes[s], transform=self.transforms[s])

    def finisher(self, seed: int, epoch: int) -> Callable[[int, Any], Any]:
        """`finish`, with ids that carry `seed` and `epoch` when a transform takes ``rng``."""
        if not any(rng_use(t) for t in self.transforms):
            return self.finish
        return lambda i, item: self.finish(SampleRef(i, seed, epoch), item)


def open_stream_sources(
    source: Any,
    *,
    decode: str | None,
    transform: Callable[[Any], Any] | None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    draft: Any = None,
) -> StreamSources:
    """Return what a stream reads from ``source``.

    That is one dataset, opened as ``readers.stream_reader.open_source`` opens it, or, for a
    list of sources or a `ConcatDataset` (which keeps its ``classes`` mode), each of them so,
    concatenated.
    """
    kw: dict[str, Any] = {"decode": decode, "transform": transform}
    kw |= {"cache_dir": cache_dir, "cache_limit": cache_limit, "draft": draft}
    if not isinstance(source, list | tuple | ConcatDataset):
        one = open_source(source, **kw)
        return StreamSources(
            one.dataset, (one.decode,), (one.transform,), single=True, draft=one.draft
        )
    classes = "keep"
    if isinstance(source, ConcatDataset):
        classes, source = source.class_mode, source.datasets
    opened = [open_source(s, **kw) for s in source]
    return StreamSources(
        ConcatDataset([o.dataset for o in opened], classes=classes),
        tuple(o.decode for o in opened),
        tuple(o.transform for o in opened),
        single=False,
        draft=draft,
    )
