"""`WebDatasetDataset`: WebDataset ``.tar`` shards as a map-style Dataset (read-only, bare)."""

from __future__ import annotations

from typing import Any

import numpy as np

from readers.datasets.base import ShardedDataset
from readers.errors import DatasetFormatError, RecordError
from readers.formats.webdataset import FORMAT, TAR_SUFFIX, scan_tars
from readers.io import handles


class WebDatasetDataset(ShardedDataset):
    """WebDataset tar shards: ``ds[i] -> (image, label)`` over the samples with an image member.

    The tars are scanned once at opening (member headers only), past damaged headers;
    samples without a usable image member are left out (``packer convert`` lists them, and
    every other member it does not pack, in errors.jsonl). Labels are the
    ``cls`` (int), ``txt`` (text) or ``json`` member. Image bytes are read from a shared
    read-only mapping of each tar.

    Args:
        path: a directory of ``.tar`` shards, or one ``.tar``.
        transform, decode, on_error: as for `ShardedDataset` (there is no index: no CRC).

    Raises:
        DatasetFormatError: `path` holds no readable tar, or no sample with an image.
    """

    shard_format = FORMAT
    format = FORMAT.name

    def _open_bare(self) -> None:
        tars = FORMAT.find_bare(self.root)
        if tars is None:
            raise DatasetFormatError(f"{self.root}: holds no {TAR_SUFFIX} shards")
        samples = [s for s in scan_tars(tars).samples if not s.problem]
        if not samples:
            raise DatasetFormatError(f"{self.root}: no sample of its tars has an image member")
        self.samples = samples
        self._shard_paths = [str(t) for t in tars]
        counts = np.bincount([s.tar for s in samples], minlength=len(tars))
        self.shard_bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def _open(self, path: str) -> Any:
        return handles.shared_mmap(path)

    def _byte_range(self, shard: int, lo: int, hi: int) -> tuple[str, int, int] | None:
        chunk = self.samples[lo:hi]  # a link's bytes may lie before its neighbours'
        begin = min(s.offset for s in chunk)
        return self._shard_paths[shard], begin, max(s.offset + s.size for s in chunk)

    def _read(self, i: int, shard: int, *, as_bytes: bool) -> tuple[Any, Any]:
        s = self.samples[i]
        buf = self._handle(shard)
        if s.offset + s.size > len(buf):
            raise RecordError(f"{self._shard_paths[shard]} member {s.member}: cut short")
        data = bytes(buf[s.offset : s.offset + s.size])
        if as_bytes or self.decode == "bytes":
            return data, s.label
        try:
            return self.decode_stored(data, i), s.label
        except ValueError as exc:
            raise RecordError(
                f"{self._shard_paths[shard]} member {s.member}: cannot decode ({exc})"
            ) from exc

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label when every label is a ``cls`` class id, else None."""
        values = [s.label for s in self.samples]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return np.asarray(values, dtype=np.int64)
        return None
