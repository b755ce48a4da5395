"""Damaged LMDB pages never kill a process: readers raise `RecordError` (or
`DatasetFormatError` for a shard that cannot be opened) and ``packer verify`` (also ``--deep``)
reports problem lines naming the shard, exits 1 and prints no traceback.

Every read and verify runs in a subprocess, so that a SIGBUS shows as a failing test instead of
a dead pytest. The damage is placed with a parser of LMDB 0.9's page layout written here from
its specification (lmdb.h / mdb.c: ``MDB_page``, ``MDB_meta``, ``MDB_node``), independent of
``readers.formats.lmdb``.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from readers.formats.lmdb.tree import check_tree
from tests.conftest import build_packed, encode, make_image

ROOT = Path(__file__).resolve().parents[2]
PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper (overflow: pages)
NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
P_BRANCH, P_LEAF, F_BIGDATA = 0x01, 0x02, 0x01
COUNT = 12
DAMAGED = 3
"""The sample whose record is damaged: one of those `LmdbDataset` compares at their offsets."""
KEY = b"image-%09d" % (DAMAGED + 1)


def _meta(data: bytes) -> tuple[int, int, int]:
    """``(page size, main root page, last page)`` of the newer meta page."""
    psize = struct.unpack_from("<I", data, 40)[0]
    metas = [(struct.unpack_from("<Q", data, o + 144)[0], o) for o in (0, psize)]
    _, at = max(metas)
    return (
        psize,
        struct.unpack_from("<Q", data, at + 128)[0],
        struct.unpack_from("<Q", data, at + 136)[0],
    )


def _leaf_nodes(data: bytes) -> dict[bytes, tuple[int, int]]:
    """Each key of the main database: ``(page number of its leaf, file offset of its node)``."""
    psize, root, _ = _meta(data)
    found: dict[bytes, tuple[int, int]] = {}
    pages = [root]
    while pages:
        page = pages.pop()
        base = page * psize
        _, _, flags, lower, _ = PAGE_HEADER.unpack_from(data, base)
        for k in range((lower - PAGE_HEADER.size) // 2):
            node = base + struct.unpack_from("<H", data, base + PAGE_HEADER.size + 2 * k)[0]
            lo, hi, nflags, ksize = NODE.unpack_from(data, node)
            if flags & P_BRANCH:
                pages.append(lo | hi << 16 | nflags << 32)
            else:
                key = data[node + NODE.size : node + NODE.size + ksize]
                found[key] = (page, node)
    return found


def _damage(out: Path, how: str) -> None:
    path = out / "shard-00000" / "data.mdb"
    data = bytearray(path.read_bytes())
    psize, _, last = _meta(bytes(data))
    page, node = _leaf_nodes(bytes(data))[KEY]
    _, _, flags, ksize = NODE.unpack_from(data, node)
    assert flags & F_BIGDATA, "the damaged image must live on overflow pages"
    if how == "value_length":  # the leaf node's 32-bit value size
        NODE.pack_into(data, node, 0xFFFF, 0x0FFF, flags, ksize)
    elif how == "overflow_page":  # the page number the node points at: its own leaf page
        struct.pack_into("<Q", data, node + NODE.size + ksize, page)
    elif how == "overflow_page_beyond":  # ... or the page after the file's last
        struct.pack_into("<Q", data, node + NODE.size + ksize, last + 1)
    elif how == "overflow_pages":  # the overflow page's count of pages it spans
        ov = struct.unpack_from("<Q", data, node + NODE.size + ksize)[0]
        struct.pack_into("<I", data, ov * psize + 12, 1 << 30)
        NODE.pack_into(data, node, 0xFFFF, 0x00FF, flags, ksize)  # and a length to match
    elif how == "garbage_leaf":
        rng = np.random.default_rng(5)
        data[page * psize : (page + 1) * psize] = rng.integers(0, 256, psize, np.uint8).tobytes()
    elif how == "truncated":
        del data[len(data) // 2 :]
    else:
        raise AssertionError(how)
    path.write_bytes(bytes(data))


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A one-shard LMDB dataset of `COUNT` images large enough for overflow pages."""
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    for i in range(COUNT):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        ext = ".png" if i % 3 else ".jpg"
        (src / f"c{i % 2}" / f"{i:02d}{ext}").write_bytes(encode(make_image(rng, 40, 30), ext))
    return build_packed(src, tmp_path / "out.lmdb", "lmdb")


READ = """
import sys
from readers import LmdbDataset
from readers.errors import DatasetFormatError, RecordError
try:
    ds = LmdbDataset(sys.argv[1], decode=sys.argv[2])
    for i in range(len(ds)):
        try:
            ds[i]
        except RecordError as exc:
            print("RecordError", exc)
except DatasetFormatError as exc:
    print("DatasetFormatError", exc)
print("done")
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def _read_all(out: Path, decode: str = "bytes") -> list[str]:
    done = _run("-c", READ, str(out), decode)
    assert done.returncode == 0, f"reader died ({done.returncode}): {done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "done"
    return lines[:-1]


def _verify(out: Path, *options: str) -> list[str]:
    done = _run("-m", "packer.cli", "verify", str(out), *options)
    assert done.returncode == 1, f"verify exited {done.returncode}: {done.stdout}{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done.stdout.splitlines() + done.stderr.splitlines()


DAMAGE = [
    "value_length",
    "overflow_page",
    "overflow_page_beyond",
    "overflow_pages",
    "garbage_leaf",
    "truncated",
]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("deep", [False, True], ids=["verify", "deep"])
def test_verify_reports_damaged_pages_naming_the_shard(built: Path, how: str, deep: bool) -> None:
    _damage(built, how)
    problems = _verify(built, *(["--deep"] if deep else []))
    assert problems
    assert any(p.startswith("shard-00000") for p in problems), problems


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("offsets", [True, False], ids=["offsets", "lookups"])
def test_readers_raise_for_damaged_pages(built: Path, how: str, offsets: bool) -> None:
    _damage(built, how)
    if not offsets:  # index.jsonl has no offsets: every value is looked up through LMDB
        (built / "index.parquet").unlink()
    errors = _read_all(built)
    assert errors, "the damage went unnoticed"
    if how == "truncated":
        assert errors == [errors[0]]
        assert errors[0].startswith("DatasetFormatError")
        assert "cut short" in errors[0]
        return
    assert all(e.startswith(f"RecordError {built / 'shard-00000'} key ") for e in errors), errors
    if how != "garbage_leaf":
        assert [e.split(" sample ")[0].split()[-1] for e in errors] == [KEY.decode()], errors


def test_an_intact_shard_passes_the_page_walk(built: Path) -> None:
    assert check_tree(str(built / "shard-00000" / "data.mdb")) == []
    assert _read_all(built, "rgb") == []


LOADER = """
import sys
import paddle
from readers import LmdbDataset
ds = LmdbDataset(sys.argv[1], decode="rgb", on_error="skip", transform=lambda a: a[:8, :8])
loader = paddle.io.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
print(sum(len(images) for images, _ in loader))
"""


def test_a_dataloader_skips_a_damaged_value(built: Path) -> None:
    _damage(built, "value_length")
    (built / "index.parquet").unlink()
    done = _run("-c", LOADER, str(built))
    assert done.returncode == 0, f"loader died ({done.returncode}): {done.stdout}{done.stderr}"
    assert done.stdout.split()[-1] == str(COUNT)
    assert f"key {KEY.decode()} sample {DAMAGED}" in done.stderr  # the on_error="skip" warning


def test_verify_of_a_bare_lmdb_reports_damaged_pages(built: Path) -> None:
    _damage(built, "value_length")
    problems = _verify(built / "shard-00000", "--deep")
    assert problems[0].startswith(f"{built / 'shard-00000'}: data.mdb: page ")
