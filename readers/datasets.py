"""paddle.io Datasets over packed shards: ``ds[i] -> (HWC uint8 image, label)``."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from readers import handles
from readers.decode import check_mode, decode_image
from readers.errors import DatasetFormatError, RecordError
from readers.formats.layout import META_NAME
from readers.formats.lmdb_layout import DATA_FILE, NUM_SAMPLES_KEY, image_key, label_key
from readers.index import DatasetIndex, load_index


class LmdbDataset(paddle.io.Dataset):  # type: ignore[misc]
    """A packed LMDB dataset, or a bare LMDB in the PaddleOCR layout, as a map-style Dataset.

    Shards are opened lazily in the process that reads them, read-only and without locks, and
    shared with every other dataset object of that process; the object pickles without them.

    Args:
        path: the dataset directory written by ``packer build`` (or a bare LMDB directory
            holding ``data.mdb`` with ``num-samples``/``image-%09d``/``label-%09d`` keys).
        transform: applied to the decoded image.
        decode: ``rgb`` (default), ``bgr``, ``gray``, ``unchanged`` or ``bytes`` (the stored
            bytes untouched).
        verify_crc: check each record's CRC-32 against the index on read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        decode: str = "rgb",
        *,
        verify_crc: bool = False,
    ) -> None:
        check_mode(decode)
        self.root = Path(path)
        self.transform = transform
        self.decode = decode
        self.verify_crc = verify_crc
        self.index: DatasetIndex | None = None
        if (self.root / META_NAME).exists():
            self.index = load_index(self.root)
            if self.index.format != "lmdb":
                raise DatasetFormatError(
                    f"{self.root}: a {self.index.format} dataset, not LMDB; use "
                    "RecordIODataset or open_dataset()"
                )
            self.shard_bounds = self.index.shard_bounds
            self._shard_paths = [str(self.root / n) for n in self.index.shard_names]
        elif (self.root / DATA_FILE).exists():
            self._shard_paths = [str(self.root)]
            env = handles.shared_lmdb(str(self.root))
            with env.begin() as txn:
                raw = txn.get(NUM_SAMPLES_KEY)
            if raw is None:
                raise DatasetFormatError(
                    f"{self.root}: an LMDB without a 'num-samples' key; expected the PaddleOCR "
                    "layout (num-samples, image-%09d, label-%09d)"
                )
            self.shard_bounds = np.asarray([0, int(raw)], dtype=np.int64)
        else:
            raise DatasetFormatError(
                f"{self.root}: neither a packed dataset ({META_NAME}) nor an LMDB ({DATA_FILE})"
            )
        self._envs: list[Any] = []
        self._generation = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_envs"] = []
        state["_generation"] = -1
        return state

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    @property
    def labels(self) -> np.ndarray | None:
        """Every sample's int label (when labels are class ids), for samplers and filters."""
        return self.index.labels.as_ints() if self.index is not None else None

    def _env(self, shard: int) -> Any:
        if self._generation != handles.generation:
            self._envs = [None] * len(self._shard_paths)
            self._generation = handles.generation
        env = self._envs[shard]
        if env is None:
            env = handles.shared_lmdb(self._shard_paths[shard])
            self._envs[shard] = env
        return env

    def _where(self, i: int, shard: int, key: bytes) -> str:
        path = self.index.path_of(i) if self.index is not None else None
        source = f" (source {path})" if path else ""
        return f"{self._shard_paths[shard]} key {key.decode()} sample {i}{source}"

    def read_bytes(self, i: int) -> bytes:
        """The stored bytes of sample `i`."""
        return self._read(i, as_bytes=True)[0]  # type: ignore[no-any-return]

    def _read(self, i: int, *, as_bytes: bool) -> tuple[Any, Any]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range for a dataset of {n}")
        shard = int(np.searchsorted(self.shard_bounds, i, side="right")) - 1
        local = i - int(self.shard_bounds[shard]) + 1
        key = image_key(local)
        try:
            with self._env(shard).begin(buffers=True) as txn:
                buf = txn.get(key)
                if buf is None:
                    raise RecordError(f"{self._where(i, shard, key)}: the key is missing")
                if self.verify_crc and self.index is not None:
                    crc = zlib.crc32(buf)
                    if crc != int(self.index.crc32[i]):
                        raise RecordError(
                            f"{self._where(i, shard, key)}: CRC-32 {crc:08x} does not match "
                            f"the index ({int(self.index.crc32[i]):08x})"
                        )
                if as_bytes or self.decode == "bytes":
                    image: Any = bytes(buf)
                else:
                    image = decode_image(buf, self.decode)
                if self.index is not None:
                    label: Any = self.index.labels[i]
                else:
                    raw = txn.get(label_key(local))
                    label = None if raw is None else bytes(raw).decode("utf-8")
        except RecordError:
            raise
        except ValueError as exc:
            raise RecordError(f"{self._where(i, shard, key)}: cannot decode ({exc})") from exc
        except Exception as exc:
            if type(exc).__module__ == "lmdb" or isinstance(exc, OSError):
                raise RecordError(f"{self._where(i, shard, key)}: read failed ({exc})") from exc
            raise
        return image, label

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        image, label = self._read(int(i), as_bytes=False)
        if self.transform is not None:
            image = self.transform(image)
        return image, label


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> LmdbDataset:
    """Open whatever packed dataset is at `path` (a packed directory or a bare LMDB)."""
    root = Path(path)
    if (root / META_NAME).exists():
        fmt = json_format(root)
        if fmt == "lmdb":
            return LmdbDataset(root, **kwargs)
        raise DatasetFormatError(f"{root}: format {fmt!r} is not readable by this version")
    if (root / DATA_FILE).exists():
        return LmdbDataset(root, **kwargs)
    found = sorted(p.name for p in root.iterdir())[:10] if root.is_dir() else []
    raise DatasetFormatError(
        f"{root}: not a dataset packer can open: expected {META_NAME} (packer build output) or "
        f"{DATA_FILE} (a bare LMDB); found {found if root.is_dir() else 'no directory'}"
    )


def json_format(root: Path) -> str:
    """The ``format`` field of the meta.json at `root`."""
    from readers.index import load_meta

    return str(load_meta(root)["format"])
