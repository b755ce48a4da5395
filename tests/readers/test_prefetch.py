"""Dataset.prefetch: the byte range it asks the OS for holds exactly the chunk's records."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

import numpy as np
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import ChunkShuffleSampler, open_dataset
from readers.formats import FORMATS
from readers.io import handles
from tests.conftest import encode, write_tree


def resident_pages(path: str, begin: int, end: int) -> int:
    """How many pages of ``path[begin:end]`` are in the page cache (mmap + mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    start = begin // mmap.PAGESIZE * mmap.PAGESIZE
    length = end - start
    pages = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, length)
    finally:
        os.close(fd)


@pytest.fixture(params=FORMATS)
def packed(request, tmp_path):
    src = tmp_path / "src"
    files = write_tree(src, {"a": 40, "b": 30})
    rng = np.random.default_rng(3)
    for i in range(12):  # records larger than a page live outside LMDB's B-tree pages
        name = f"c/big_{i:02d}.png"
        (src / "c").mkdir(exist_ok=True)
        files[name] = encode(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8), ".png")
        (src / name).write_bytes(files[name])
    out = tmp_path / f"out.{request.param}"
    build(BuildConfig(src=src, out=out, format=request.param, shard_size=60_000))
    return open_dataset(out, decode="bytes"), files


def test_byte_range_covers_exactly_the_chunk(packed):
    ds, _ = packed
    for shard in range(len(ds.shard_bounds) - 1):
        lo, hi = int(ds.shard_bounds[shard]), int(ds.shard_bounds[shard + 1])
        for a, b in ((lo, hi), (lo, lo + 1), (lo + 1, min(hi, lo + 4))):
            if a >= b:
                continue
            path, begin, end = ds._byte_range(shard, a, b)
            with open(path, "rb") as f:
                f.seek(begin)
                region = f.read(end - begin)
            for i in range(a, b):
                assert ds.read_bytes(i) in region
            # the range is not much larger than the records it must hold
            assert end - begin <= sum(len(ds.read_bytes(i)) for i in range(a, b)) + 8192 * (b - a)


def test_prefetch_brings_the_chunk_into_the_page_cache(packed):
    ds, _ = packed
    shard = len(ds.shard_bounds) - 2  # the last shard holds the large records
    lo, hi = int(ds.shard_bounds[shard]), int(ds.shard_bounds[shard + 1])
    path, begin, end = ds._byte_range(shard, lo, hi)
    handles.close_all()  # pages mapped by this process could not be evicted
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    total = (end - begin + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    assert resident_pages(path, begin, end) < total
    ds.prefetch(lo, hi)
    deadline = time.monotonic() + 5  # WILLNEED starts the reads; they finish shortly after
    while resident_pages(path, begin, end) < total and time.monotonic() < deadline:
        time.sleep(0.01)
    assert resident_pages(path, begin, end) >= total - 1
    ds.prefetch(-5, 0)  # empty and out-of-range requests are ignored
    ds.prefetch(len(ds) - 1, len(ds) + 10)


def test_sampler_prefetches_chunks_it_enters(packed):
    ds, _ = packed
    calls = []
    original = ds.prefetch

    def spy(start, stop):
        calls.append((start, stop))
        original(start, stop)

    ds.prefetch = spy
    sampler = ChunkShuffleSampler(ds, chunk_size=8, window=2, seed=1, rank=0, world_size=1)
    order = list(sampler)
    assert sorted(order) == list(range(len(ds)))
    assert calls
    covered = np.zeros(len(ds), bool)
    for start, stop in calls:
        covered[start:stop] = True
    assert covered.all()


def test_hints_run_ahead_at_most_prefetch_bytes():
    from types import SimpleNamespace

    from readers.samplers import PREFETCH_BYTES

    class Big:
        shard_bounds = np.array([0, 100_000])
        labels = None
        index = SimpleNamespace(nbytes=np.full(100_000, 1 << 20, np.uint32))  # 1 MiB each

        def __len__(self):
            return 100_000

        def prefetch(self, start, stop):
            pass

    ds = Big()
    # a block is 256 samples = 256 MiB here: running a whole block ahead would hint that much
    capped = ChunkShuffleSampler(ds, chunk_size=4, window=64, seed=0, rank=0, world_size=1)
    assert capped._lookahead == PREFETCH_BYTES // (1 << 20)
    small = ChunkShuffleSampler(ds, chunk_size=4, window=2, seed=0, rank=0, world_size=1)
    assert small._lookahead == 8  # under the cap: one block
