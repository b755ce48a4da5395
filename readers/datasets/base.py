"""What every packed-format Dataset shares, from options and the index to page-cache hints.

That is: options, the index, lazy per-process shard handles, bounds checks, pickling without
handles, decoding, ``on_error`` and page-cache hints.

A format's Dataset (``readers/datasets/<fmt>.py``) subclasses `ShardedDataset`, names its
`ShardFormat`, and implements opening a bare copy, reading one sample and the byte range of a
run of samples.
"""

from __future__ import annotations

import os
import warnings
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import cv2
import numpy as np
import paddle

from readers.augment_rng import LendRng, RngEpoch, lent_rng, transform_rng
from readers.decode import check_mode, decode_sample, decompress
from readers.draft import Draft, DraftSizes, check_draft, returned_size
from readers.errors import DatasetFormatError, DatasetRebuiltError, RecordError
from readers.fastzlib import crc32
from readers.files import check_shard_files
from readers.formats import REGISTRY
from readers.formats.base import ShardFormat
from readers.formats.layout import META_NAME
from readers.index import COMPRESSIONS, DatasetIndex, load_index
from readers.io import handles
from readers.io.identity import DatasetIdentity, identify_dataset, meta_read
from readers.io.readahead import Readahead, willneed
from readers.not_dataset import explain_not_dataset
from readers.remote import default_cache_dir, is_url
from readers.staging import stage
from readers.transforms import PlannedImage, is_planner, run_transform

ON_ERROR = ("raise", "skip")

SIZE_COLUMNS = ("width", "height", "format")
"""The index columns ``draft=`` and planned transforms need (`readers.draft.DraftSizes`)."""

OWN_TRANSFORM: Any = object()
"""`ShardedDataset.decode_stored`'s default planner: the dataset's own transform."""


def advise_willneed(
    bounds: np.ndarray,
    start: int,
    stop: int,
    byte_ranges: Callable[[int, int, int], list[tuple[str, int, int]]],
) -> None:
    """``POSIX_FADV_WILLNEED`` the bytes of samples ``start..stop-1``, shard by shard.

    ``byte_ranges(shard, lo, hi)`` says which file ranges hold them (`readers.readahead.willneed`:
    in pieces the kernel reads whole). Errors are ignored.
    """
    start, stop = max(0, int(start)), min(int(bounds[-1]), int(stop))
    if start >= stop or not hasattr(os, "posix_fadvise"):
        return
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    last = int(np.searchsorted(bounds, stop - 1, side="right")) - 1
    for shard in range(first, last + 1):
        lo = max(start, int(bounds[shard]))
        hi = min(stop, int(bounds[shard + 1]))
        try:
            for path, begin, end in byte_ranges(shard, lo, hi):
                willneed(path, begin, end)
        except Exception:  # a hint must never fail a read
            continue


def refuse_non_dataset(root: Path, fmt: ShardFormat) -> None:
    """Raise when `root` is no bare copy of `fmt` and does not exist or holds loose images.

    Raises:
        DatasetFormatError: the path does not exist, or is a folder of images to pack first.
    """
    if fmt.find_bare(root) is None and (why := explain_not_dataset(root)) is not None:
        raise DatasetFormatError(why)


def load_packed_index(
    root: Path, fmt: ShardFormat, meta: Any = None, extra: tuple[str, ...] = ()
) -> DatasetIndex:
    """The index of the packed dataset at `root`, which must be of format `fmt`.

    Raw records are known from the index's ``format``, their dimensions loaded with it;
    the `extra` columns are loaded too.

    Raises:
        DatasetFormatError: the index does not load, or the dataset is of another format.
    """
    index = load_index(root, meta=meta, extra=extra)
    if index.format != fmt.name:
        other = REGISTRY.get(index.format)
        use = other.dataset_name if other is not None else "the matching dataset class"
        raise DatasetFormatError(
            f"{root}: a {index.format} dataset, not {fmt.title}; use {use} or open_dataset()"
        )
    return index


def load_pinned_index(
    root: Path, fmt: ShardFormat, extra: tuple[str, ...] = ()
) -> tuple[DatasetIndex, DatasetIdentity]:
    """`load_packed_index`, and the identity of the build that index belongs to."""
    for attempt in range(2):  # the identity is of the meta.json the index was read with
        identity = identify_dataset(root)
        meta = meta_read(root, identity.meta)  # as open_dataset read it, if it did
        index = load_packed_index(root, fmt, meta, extra)
        try:
            identity.check_meta()
            break
        except DatasetRebuiltError:
            if attempt:
                raise
    return index, identity


def take_sizes(index: DatasetIndex) -> DraftSizes:
    """Return `DraftSizes` from an index loaded with `SIZE_COLUMNS`.

    The index's wide copies of those columns are then dropped (the dimensions of raw records
    stay where ``raw_dims`` needs them).
    """
    extra = index.extra
    sizes = DraftSizes.from_columns(extra["format"], extra["height"], extra["width"])
    del extra["format"]
    if index.raw is None:
        del extra["width"], extra["height"]
    return sizes


def load_draft_sizes(root: Path, index: DatasetIndex) -> DraftSizes:
    """Load the sizes ``draft=`` needs from the index of `root`, once it is open without them.

    Raises:
        DatasetRebuiltError: the index changed since `index` was loaded.
    """
    sized = load_index(root, extra=SIZE_COLUMNS, meta=index.meta)
    if len(sized) != len(index):
        raise DatasetRebuiltError.of(str(root), "the index changed")
    return take_sizes(sized)


def decode_encoded(
    ds: ShardedDataset,
    data: Any,
    i: int,
    mode: str,
    *,
    planner: Any,
    rng: np.random.Generator | None,
) -> Any:
    """`ShardedDataset.decode_stored` of an encoded image (not raw pixels).

    At ``ds.draft``, or planned by `planner` (with `rng` when given) from the index's size.
    """
    if mode == "bytes" or ds.index is None:
        return decode_sample(data, mode)
    planned = is_planner(planner)
    if not planned and ds.draft is None:
        return decode_sample(data, mode)
    sizes = ds.draft_sizes()
    stored = sizes.of(i) if sizes is not None else None
    if stored is None:
        return decode_sample(data, mode)
    if not planned:
        h, w = stored
        return decode_sample(data, mode, stored="jpeg", height=h, width=w, draft=ds.draft)
    size = returned_size(data, *stored, mode)
    plan = planner.plan(*size) if rng is None else planner.plan(*size, rng=rng)
    image = decode_sample(data, mode, stored="jpeg", scale=plan.scale)
    return PlannedImage(image, plan)


class ClassNames:
    """``classes`` and ``num_classes`` of a dataset with an ``index`` (from its ``meta.json``)."""

    @property
    def classes(self) -> list[str] | None:
        """The class names by class id, from ``meta.json``; None when it has none.

        ``packer build`` records them when labels are class names (class folders, or a list
        file of names); bare datasets, WebDataset tars and other labels have none.
        """
        cached = self.__dict__.get("_class_names", False)
        if cached is False:
            meta = getattr(getattr(self, "index", None), "meta", None)
            names = meta.get("classes") if isinstance(meta, dict) else None
            cached = [str(n) for n in names] if isinstance(names, list) and names else None
            self.__dict__["_class_names"] = cached
        return cached  # type: ignore[no-any-return]

    @property
    def num_classes(self) -> int | None:
        """``len(classes)``, or None without class names (labels are then not counted)."""
        classes = self.classes
        return None if classes is None else len(classes)


class ShardedDataset(ClassNames, RngEpoch, paddle.io.Dataset[tuple[Any, Any]]):
    """A map-style Dataset over the shards of one format: ``ds[i] -> (image, label)``.

    The constructor checks the options, then opens a packed dataset (``meta.json``) through
    its index, or else a bare copy of the format (``_open_bare``). Subclasses implement
    ``_open_bare()``, ``_read(i, shard, as_bytes=...)`` and ``_byte_range(shard, lo, hi)``,
    and may extend ``_open_packed(index)``.

    Args:
        path: the dataset directory written by ``packer build``, or a bare copy of the format,
            or the URL of a dataset published in object storage (``s3://bucket/out.lmdb``).
        transform: applied to the decoded image; a `readers.transforms.DecodePlanner` plans
            each JPEG's decode from the index first. One that takes a keyword ``rng`` gets a
            generator of the sample, the sampler's seed and epoch (`readers.augment_rng`).
        decode: ``rgb`` (default), ``bgr``, ``gray``, ``unchanged`` or ``bytes`` (the stored
            bytes untouched).
        draft: ``S`` (shorter side) or ``(H, W)``: JPEGs decode at the largest DCT reduction
            that keeps them at least that large, chosen from the index (`readers.draft`).
        verify_crc: check each record's CRC-32 against the index on read.
        on_error: ``raise`` (default): a bad sample raises `RecordError`; ``skip``: the next
            readable one in id order replaces it (counted in ``skipped``). Structural damage,
            `DatasetRebuiltError` and EMFILE/ENFILE/ENOMEM always raise.
        cache_dir: read a once-per-machine copy in this local directory (`readers.staging`).
        cache_limit: the most bytes `cache_dir` may hold (``"20GiB"``; LRU eviction).
        storage_options: for a URL `path`, its fsspec filesystem's keyword arguments. Without
            `cache_dir`, RecordIO reads objects by range; others stage to the default cache.

    Raises:
        DatasetFormatError: the path is not a dataset of this format, or its files disagree.
    """

    shard_format: ClassVar[ShardFormat]
    format: ClassVar[str]
    reads_ranges: ClassVar[bool] = False
    """Whether a URL without ``cache_dir`` is read in place by byte range (`_open_remote`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: str = "rgb",
        *,
        verify_crc: bool = False,
        on_error: str = "raise",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        draft: Draft | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        check_mode(decode)
        self.draft = check_draft(draft)
        remote = is_url(path) and cache_dir is None and self.reads_ranges
        if is_url(path) and not remote:  # object storage: read a node-local copy
            cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        if cache_dir is not None:  # read a node-local copy (readers.staging)
            path = stage(path, cache_dir, cache_limit=cache_limit, storage_options=storage_options)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
        self.url: str | None = str(path) if remote else None
        """The dataset's URL when it is read from object storage without a local copy."""
        self.root = Path(path)
        self.transform = transform
        self.decode = decode
        self.verify_crc = verify_crc
        self.on_error = on_error
        self.skipped = 0
        """Samples this process replaced by another (``on_error="skip"``); a DataLoader
        worker's count stays in that worker."""
        self._bad: set[int] = set()
        self._warned = False
        self.index: DatasetIndex | None = None
        self.shard_bounds: np.ndarray = np.zeros(1, dtype=np.int64)
        self._shard_paths: list[str] = []
        self._raw_dims: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._shards = handles.ShardHandles()
        self._sizes: DraftSizes | None = None
        self.identity: DatasetIdentity | None = None
        """The build opened (packed datasets): shards opened later are checked against it."""
        self._ahead = Readahead()  # hints ahead of (nearly) increasing reads, per process
        if remote:
            self._open_remote(str(path), storage_options)
        elif (self.root / META_NAME).exists():
            self._open_packed(self._load_packed())
        else:
            refuse_non_dataset(self.root, self.shard_format)
            self._open_bare()

    # --- opening ---------------------------------------------------------------------------

    def _load_packed(self) -> DatasetIndex:
        extra = SIZE_COLUMNS if self._needs_sizes() else ()
        index, identity = load_pinned_index(self.root, self.shard_format, extra)
        check_shard_files(self.root, self.shard_format, index.shard_names)
        self.index, self.identity = index, identity
        self._raw_dims = index.raw_dims()
        if "format" in index.extra:
            self._sizes = take_sizes(index)
        self.shard_bounds = index.shard_bounds
        return index

    def _open_packed(self, index: DatasetIndex) -> None:
        """Find the shards of a packed dataset; every listed shard's data file must exist."""
        fmt = self.shard_format
        self._shard_paths = [fmt.shard_path(self.root, name) for name in index.shard_names]
        for number, shard_path in enumerate(self._shard_paths):
            data = fmt.data_file(shard_path)
            if not os.path.isfile(data):
                raise DatasetFormatError(
                    f"{data}: missing ({META_NAME} lists {len(self._shard_paths)} shards; "
                    f"this is shard {number})"
                )

    def _open_bare(self) -> None:
        raise NotImplementedError

    def _open_remote(self, url: str, storage_options: dict[str, Any] | None) -> None:
        """Open a dataset in object storage in place (formats with ``reads_ranges``)."""
        raise NotImplementedError

    # --- decoding --------------------------------------------------------------------------

    def _needs_sizes(self) -> bool:
        """Whether reads need the index's sizes (``draft=`` or a planned transform)."""
        return self.draft is not None or is_planner(self.transform)

    def draft_sizes(self) -> DraftSizes | None:
        """Return, per sample, JPEG or not and stored size (for ``draft=``); None: no index."""
        if self._sizes is None and self.index is not None:
            self._sizes = load_draft_sizes(self.root, self.index)
        return self._sizes

    def decode_stored(
        self,
        data: Any,
        i: int,
        mode: str | None = None,
        *,
        planner: Any = OWN_TRANSFORM,
        rng: np.random.Generator | None = None,
    ) -> Any:
        """Decode the stored bytes `data` of sample `i` as `mode` (default: ``self.decode``).

        Raw pixels (``--encode raw``) are included; JPEGs decode at the reduction
        ``self.draft`` allows.

        With a `planner` (default: ``self.transform`` when it is one, see
        `readers.transforms`), a JPEG of known size is planned for first and comes back as
        a `readers.transforms.PlannedImage` for ``planner.apply`` (`run_transform` does it).
        A planner that takes ``rng`` plans with `rng` (default: the generator ``__getitem__``
        lent to this read, `readers.augment_rng.LendRng`).

        Raises:
            ValueError: the bytes do not decode.
        """
        mode = self.decode if mode is None else mode
        index = self.index
        if planner is OWN_TRANSFORM:
            planner, rng = self.transform, lent_rng(self) if rng is None else rng
        try:
            if self._raw_dims is None or index is None or index.raw is None or not index.raw[i]:
                return decode_encoded(self, data, i, mode, planner=planner, rng=rng)
            h, w, c = (int(column[i]) for column in self._raw_dims)
            if mode != "bytes" and index.compression is not None and index.compression[i]:
                data = decompress(data, COMPRESSIONS[index.compression[i]], h * w * c)
            return decode_sample(data, mode, stored="raw", height=h, width=w, channels=c)
        except cv2.error as exc:  # some corrupt headers make OpenCV raise instead of fail
            raise ValueError(f"OpenCV: {exc}") from exc

    def _check_crc(self, i: int, data: Any, where: Callable[[], str]) -> None:
        """With ``verify_crc``, raise `RecordError` unless `data` has sample `i`'s CRC-32.

        `where` names the sample for the message; it is called only on a mismatch, because
        finding the source path reads the index file.
        """
        if self.verify_crc and self.index is not None:
            crc = crc32(data)
            if crc != int(self.index.crc32[i]):
                raise RecordError(
                    f"{where()}: CRC-32 {crc:08x} does not match the index "
                    f"({int(self.index.crc32[i]):08x})"
                )

    # --- handles and bounds ----------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = handles.ShardHandles()
        state["skipped"] = 0  # counts are per process
        state["_bad"] = set()
        state["_warned"] = False
        return state

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label (when labels are class ids), for samplers and filters."""
        return self.index.labels.as_ints() if self.index is not None else None

    def _open(self, path: str) -> Any:
        return self.shard_format.open_shard(path)

    @property
    def _handles(self) -> list[Any]:
        return self._shards.handles

    def _handle(self, shard: int) -> Any:
        """The open handle of `shard`.

        It is opened on first use in this process, and again after it was closed to bound the
        open files (`readers.io.handles`).
        """
        return self._shards.get(shard, len(self._shard_paths), self._open_checked)

    def _open_checked(self, shard: int) -> Any:
        """Open `shard`, checked to be of the build opened (`DatasetRebuiltError`)."""
        handle = self._open(self._shard_paths[shard])
        if self.identity is not None:
            self.identity.check_shard(self._shard_paths[shard])
        return handle

    def _source(self, i: int) -> str:
        path = self.index.path_of(i) if self.index is not None else None
        return f" (source {path})" if path else ""

    def _locate(self, i: int) -> tuple[int, int]:
        """``(i, shard)`` for a possibly negative sample number; IndexError when out of range."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for a dataset of {n}")
        return i, _shard_of(self, i)

    # --- reading ---------------------------------------------------------------------------

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        raise NotImplementedError

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        """The file and byte range ``[start, stop)`` holding samples ``lo..hi-1`` of `shard`."""
        raise NotImplementedError

    def _byte_ranges(self, shard: int, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """The file ranges to read for samples ``lo..hi-1`` of `shard`.

        A format whose records may lie apart returns several.
        """
        found = self._byte_range(shard, lo, hi)
        return [] if found is None else [found]

    def prefetch(self, start: int, stop: int) -> None:
        """Ask the OS to read the bytes of samples ``start..stop-1`` into the page cache now.

        Samplers call this when they enter a chunk, so that the chunk arrives in one large
        sequential read instead of one small read per record (``POSIX_FADV_WILLNEED``; the
        hint is for the whole machine, so calling it from the main process serves every
        DataLoader worker). A hint only: errors are ignored, and single random reads work
        without it.
        """
        self._ahead.covered(start, stop)
        advise_willneed(self.shard_bounds, start, stop, self._byte_ranges)

    def read_bytes(self, i: int) -> bytes:
        """The stored bytes of sample `i`."""
        i, shard = self._locate(i)
        return self._read_sample(i, shard, as_bytes=True)[0]  # type: ignore[no-any-return]

    def _read_sample(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        """`_read`, once more when the shard's handle was closed during the read.

        Another thread made room for its own: that is no bad record.
        """
        try:
            return self._read(i, shard, as_bytes=as_bytes)
        except RecordError:
            if not self._shards.closed(shard):
                raise
        return self._read(i, shard, as_bytes=as_bytes)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        n, shard = self._locate(int(i))
        self._ahead.note(n, self)
        rng = transform_rng(self.transform, i, n, self.rng_epoch)  # None: no rng asked for
        with LendRng(self, rng):  # a planner draws its plan inside the read
            try:
                image, label = self._read_sample(n, shard, as_bytes=False)
            except RecordError as exc:
                if self.on_error != "skip":
                    raise
                image, label = substitute_sample(self, n, exc)
        if self.transform is not None:
            image = run_transform(self.transform, image, rng)
        return image, label


def substitute_sample(ds: ShardedDataset, i: int, error: RecordError) -> tuple[Any, Any]:
    """The next readable sample after `i` in id order (wrapping), for ``on_error="skip"``.

    Deterministic: the same bad sample is always replaced by the same good one, in every
    process and epoch, whatever was read before; samples found bad are remembered (per
    process) so that a run of them is not re-read at every call.
    """
    ds._bad.add(i)
    ds.skipped += 1
    n = len(ds)
    for step in range(1, n):
        j = (i + step) % n
        if j in ds._bad:
            continue
        try:
            found = ds._read_sample(j, ds._locate(j)[1], as_bytes=False)
        except RecordError:
            ds._bad.add(j)
            continue
        if not ds._warned:
            ds._warned = True
            warnings.warn(
                f"{error}; returning sample {j} in its place (on_error='skip'). Further "
                "bad samples are replaced without a warning and counted in .skipped",
                RuntimeWarning,
                stacklevel=3,
            )
        return found
    raise RecordError(f"{ds.root}: no sample of {n} could be read (the first: {error})")


def _shard_of(ds: ShardedDataset, i: int) -> int:
    """The shard of `ds` holding sample `i`: a bisect on a list of its bounds, kept in `ds`.

    Not ``np.searchsorted``: 20 times the time (1.36 us), and numpy releases the GIL for it,
    which lets a reader thread (ranged GETs) cut in on every read.
    """
    cached = ds.__dict__.get("_bounds_list")
    if cached is None or cached[0] is not ds.shard_bounds:
        cached = ds.__dict__["_bounds_list"] = (ds.shard_bounds, ds.shard_bounds.tolist())
    return bisect_right(cached[1], i) - 1
