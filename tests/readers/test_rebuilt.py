"""A reader opened before ``packer build --overwrite`` of its OUT never returns the new build's
bytes under the old index: shards opened later raise DatasetRebuiltError, in the main process
and in DataLoader workers (persistent too), whatever ``on_error`` says."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paddle
import pytest

from packer.verify import verify
from readers import open_dataset
from readers.errors import DatasetRebuiltError
from tests.conftest import build_packed, write_tree

REBUILT = "was rebuilt after this dataset was opened"


def build_twice(tmp_path: Path, fmt: str) -> tuple[Path, Path]:
    """OUT built from one tree, and the source of a rebuild (same counts, other pixels)."""
    write_tree(tmp_path / "old", {"a": 6, "b": 6}, seed=0)
    write_tree(tmp_path / "new", {"a": 6, "b": 6}, seed=1)
    out = build_packed(tmp_path / "old", tmp_path / "out", fmt, shard_size=1)  # 12 shards
    return out, tmp_path / "new"


def rebuild(out: Path, src: Path, fmt: str) -> None:
    build_packed(src, out, fmt, shard_size=1, overwrite=True)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_shards_opened_after_a_rebuild_raise(fmt: str, tmp_path: Path, on_error: str) -> None:
    out, new = build_twice(tmp_path, fmt)
    ds = open_dataset(out, decode="bytes", on_error=on_error)
    first, _ = ds[0]  # shard 0 is open: it stays the old build's file
    rebuild(out, new, fmt)
    assert ds[0][0] == first
    assert zlib.crc32(ds[0][0]) == int(ds.index.crc32[0])
    with pytest.raises(DatasetRebuiltError, match=f"{REBUILT}.*reopen it"):
        ds[len(ds) - 1]
    assert ds.skipped == 0
    fresh = open_dataset(out, decode="bytes")
    assert all(zlib.crc32(fresh[i][0]) == int(fresh.index.crc32[i]) for i in range(len(fresh)))


class Batches:
    """A batch sampler whose batches the test sets before each epoch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def crc_of(image: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(image).tobytes())


def drain(loader: paddle.io.DataLoader, old: set[int]) -> None:
    """Iterate `loader` to its end; every image that comes is one of the old build's."""
    for batch in loader:
        assert all(crc_of(image) in old for image, _ in batch)


def test_persistent_dataloader_workers_raise_after_a_rebuild(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # paddle re-raises a worker's error in its reader thread, and the loop then fails with
    # "Blocking queue is killed because the data reader raises an exception"
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    out, new = build_twice(tmp_path, fmt)
    ds = open_dataset(out, decode="rgb", on_error="skip")
    truth = {i: crc_of(ds[i][0]) for i in range(len(ds))}
    sampler = Batches()
    loader = paddle.io.DataLoader(
        ds, batch_sampler=sampler, num_workers=2, persistent_workers=True, collate_fn=list
    )
    sampler.batches = [[0], [1], [2], [3]]  # epoch 1: the first shards, opened in the workers
    seen = [item for batch in loader for item in batch]
    assert [crc_of(image) for image, _ in seen] == [truth[i] for i in range(4)]
    rebuild(out, new, fmt)
    sampler.batches = [[i] for i in range(len(ds))]  # epoch 2: every shard
    with pytest.raises(Exception):  # noqa: B017, PT011 - paddle's own error, see above
        drain(loader, set(truth.values()))
    assert any(isinstance(e, DatasetRebuiltError) and REBUILT in str(e) for e in raised), raised


def test_verify_of_a_dataset_rebuilt_midway_says_so(fmt: str, tmp_path: Path) -> None:
    out, new = build_twice(tmp_path, fmt)
    from readers.io.identity import identify_dataset

    identity = identify_dataset(out)
    rebuild(out, new, fmt)
    with pytest.raises(DatasetRebuiltError, match=REBUILT):
        identity.check_shard(str(out / "shard-00000"))
    assert verify(out) == []  # the new build, verified from its start, is intact
