"""1,000 shards under ``RLIMIT_NOFILE`` 256: every sample reads back right and ``verify`` finds
nothing, because a process keeps a bounded number of shard files open (readers.io.handles)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import build_packed, write_tree

REPO = Path(__file__).resolve().parents[2]
SHARDS = 1_000


# Building 1,000 shards takes ~30 s on 2 busy cores: LMDB (a descriptor per open environment)
# runs by default, RecordIO (a descriptor per mapping) with the slow tests.
@pytest.fixture(scope="module", params=["lmdb", pytest.param("recordio", marks=pytest.mark.slow)])
def many(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of 1,000 tiny images, one per shard."""
    root = tmp_path_factory.mktemp(f"many-{request.param}")
    write_tree(root / "src", {"a": SHARDS // 2, "b": SHARDS // 2})
    return build_packed(root / "src", root / "out", str(request.param), shard_size=1)


CHILD = """
import resource, sys, zlib
import numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from packer.verify import verify
from readers import ChunkShuffleSampler, open_dataset

out = sys.argv[1]
ds = open_dataset(out, decode="bytes", on_error="skip")
assert len(ds.shard_bounds) - 1 == {shards}, len(ds.shard_bounds)
order = np.random.default_rng(0).permutation(len(ds)).tolist()
for i in order + list(ChunkShuffleSampler(ds, rank=0, world_size=1)):  # random, then hinted
    data, _ = ds[i]
    assert zlib.crc32(data) == int(ds.index.crc32[i]), i
assert ds.skipped == 0, ds.skipped
problems = verify(out, deep=True)
assert problems == [], problems[:5]
print("ok", len(ds))
"""


def test_every_sample_of_1000_shards_reads_under_256_descriptors(many: Path) -> None:
    code = textwrap.dedent(CHILD).format(shards=SHARDS)
    run = subprocess.run(
        [sys.executable, "-c", code, str(many)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == f"ok {SHARDS}"
