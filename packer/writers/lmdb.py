"""LMDB shards in the PaddleOCR key layout, in the on-disk format every lmdb release reads."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.records import Record
from packer.writers.base import ShardWriter
from packer.writers.batch import RecordBatch
from readers.durable import fsync_path
from readers.formats.lmdb import (
    DATA_FILE,
    LOCK_FILE,
    NUM_SAMPLES_KEY,
    encode_label,
    encode_wh,
    image_key,
    label_key,
    value_offsets,
    wh_key,
)

# py-lmdb 3 bundles LMDB 0.9 and 1.0, whose files are mutually unreadable; 0 pins 0.9's.
LMDB_LIB_VERSION = 0
_COMMIT_RECORDS = 1000
_COMMIT_BYTES = 64 << 20
_KEYS_PER_RECORD = 3  # image-%09d, label-%09d, wh-%09d


def lmdb_versions() -> dict[str, str]:
    """The py-lmdb release and the LMDB library version that writes our shards."""
    return {"py_lmdb": lmdb.__version__, "lmdb": ".".join(map(str, lmdb.version()))}


def open_lmdb_for_writing(path: str, map_size: int) -> Any:
    """A new LMDB environment without writemap, pinned to the 0.9 on-disk format."""
    kwargs: dict[str, Any] = {}
    if int(lmdb.__version__.split(".")[0]) >= 3:
        kwargs["lib_version"] = LMDB_LIB_VERSION
    return lmdb.open(
        path,
        map_size=map_size,
        subdir=True,
        writemap=False,
        sync=False,
        metasync=False,
        meminit=True,  # zero unused page space: the same inputs give the same bytes
        max_dbs=0,
        **kwargs,
    )


class LmdbShardWriter(ShardWriter):
    """One LMDB environment ``shard-NNNNN/``.

    Every record is three keys: ``image-%09d`` (the stored bytes), ``label-%09d`` and
    ``wh-%09d`` (``"W_H"`` of the stored image, what PaddleOCR's ``RatioDataSet`` reads to
    bucket without decoding); ``num-samples`` is written at close.

    The map starts at `initial_map_size` and doubles whenever a commit hits MapFullError (the
    pending records are replayed), so a shard never fails for being larger than expected; and
    since writemap is off, the data file only ever holds the pages actually written, never a
    sparse file of the map's size.
    """

    format = "lmdb"
    late_offsets = True
    initial_map_size = 256 << 20

    @classmethod
    def paths(cls, base: Path) -> list[Path]:
        """Return the shard's one directory at `base`."""
        return [base]  # keys count from 1 in each shard: nothing to renumber

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Return the LMDB library versions that wrote the shard."""
        return lmdb_versions()

    reusable = True

    @classmethod
    def link(cls, source: Path, base: Path) -> bool:
        """Hard-link the shard's data file; its lock file is a copy (LMDB writes it in place)."""
        from packer.swap import link_entry

        base.mkdir()
        if (source / LOCK_FILE).exists():
            shutil.copyfile(source / LOCK_FILE, base / LOCK_FILE)
        return link_entry(source / DATA_FILE, base / DATA_FILE)

    @classmethod
    def shard_keys(cls, local: int, sample_id: int, count: int) -> list[str]:
        """Return ``image-%09d`` of the records (keys count within the shard)."""
        return [image_key(n).decode() for n in range(local, local + count)]

    @classmethod
    def shard_offsets(
        cls, base: Path, first_id: int, offsets: np.ndarray
    ) -> tuple[list[int | None], np.ndarray | None]:
        """Return where each record's value lies in data.mdb: the same file, the same offsets.

        (Not read again from the shard: py-lmdb refuses to open a data file that this
        process has open under another path, and the source's may be.)
        """
        del base, first_id
        known = None if len(offsets) == 0 or int(offsets.min()) < 0 else offsets
        return [None] * len(offsets), known

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.map_size = self.initial_map_size
        self.env = open_lmdb_for_writing(str(base), self.map_size)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self.count = 0
        self._offsets: np.ndarray | None = None

    def write(self, local: int, sample_id: int, record: Record) -> tuple[str, int | None]:
        """Queue the record, its label and its size; commit when enough is pending."""
        key = image_key(local)
        self._pending.append((key, record.data))
        self._pending.append((label_key(local), encode_label(record.label)))
        self._pending.append((wh_key(local), encode_wh(record.width, record.height)))
        self._pending_bytes += len(record.data)
        self.count = local
        if (
            len(self._pending) >= _KEYS_PER_RECORD * _COMMIT_RECORDS
            or self._pending_bytes >= _COMMIT_BYTES
        ):
            self._commit()
        return key.decode(), None

    def write_batch(
        self, local: int, sample_id: int, batch: RecordBatch
    ) -> tuple[list[str], list[int | None]]:
        """Queue the records of `batch` and commit where `write` of each in turn would."""
        del sample_id  # keys count within the shard
        n = len(batch)
        images = list(map(image_key, range(local, local + n)))
        labels = list(map(label_key, range(local, local + n)))
        if batch.int_labels is not None:
            values = [b"%d" % v for v in batch.label]  # encode_label of an int
        else:
            values = list(map(encode_label, batch.label))
        whs = list(map(wh_key, range(local, local + n)))
        sizes = list(map(encode_wh, batch.width, batch.height))
        data = batch.data
        i = 0
        while i < n:
            # the records up to the next commit: 1000 pending records, or 64 MiB pending
            end = min(n, i + _COMMIT_RECORDS - len(self._pending) // _KEYS_PER_RECORD)
            pending = self._pending_bytes
            for j in range(i, end):
                pending += len(data[j])
                if pending >= _COMMIT_BYTES:
                    end = j + 1
                    break
            items: list[tuple[bytes, bytes]] = [(b"", b"")] * (_KEYS_PER_RECORD * (end - i))
            items[0::3] = zip(images[i:end], data[i:end], strict=True)
            items[1::3] = zip(labels[i:end], values[i:end], strict=True)
            items[2::3] = zip(whs[i:end], sizes[i:end], strict=True)
            self._pending.extend(items)
            self._pending_bytes = pending
            self.count = local + end - 1
            if len(self._pending) >= _KEYS_PER_RECORD * _COMMIT_RECORDS or pending >= _COMMIT_BYTES:
                self._commit()
            i = end
        return [key.decode() for key in images], [None] * n

    def _commit(self, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
        items = self._pending + list(extra)
        while True:
            txn = self.env.begin(write=True)
            try:
                for key, value in items:
                    txn.put(key, value)
                txn.commit()
                break
            except lmdb.MapFullError:
                txn.abort()
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)
            except lmdb.Error as exc:
                # LMDB reports a short write as EIO; tell a full disk apart by its free space
                st = os.statvfs(self.base)
                needed = sum(len(k) + len(v) for k, v in items) + (1 << 20)
                if st.f_bavail * st.f_frsize < needed:
                    raise OSError(errno.ENOSPC, f"No space left on device ({exc})") from exc
                raise
        self._pending = []
        self._pending_bytes = 0

    def close(self) -> int:
        """Commit num-samples, sync and close the shard; return its data file's size."""
        self._commit([(NUM_SAMPLES_KEY, str(self.count).encode())])
        self.env.sync(True)
        self.env.close()
        for name in (DATA_FILE, LOCK_FILE):
            if (self.base / name).exists():
                fsync_path(self.base / name)
        fsync_path(self.base)
        self._offsets = value_offsets(str(self.base), self.count)
        return os.path.getsize(self.base / DATA_FILE)

    def record_offsets(self) -> np.ndarray | None:
        """Return each record's byte offset in data.mdb, known after close()."""
        return self._offsets

    def abort(self) -> None:
        """Close the environment without finishing the shard."""
        self.env.close()

    def files(self) -> list[Path]:
        """Return the shard's data.mdb and lock.mdb."""
        return [self.base / DATA_FILE, self.base / LOCK_FILE]
