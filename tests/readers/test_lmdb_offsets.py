"""LmdbDataset reads a packed shard's values at their index offsets (no B-tree walk), and
falls back to LMDB lookups wherever the offsets do not fit the file."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from readers import LmdbDataset
from readers.formats.lmdb import image_key, leaf_value, overflow_value
from tests.conftest import build_packed, encode, make_image


@pytest.fixture
def big_and_small(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    """30 PNGs: noise images of 40x40 (about 5 KB: overflow pages) with every fifth one 4x4
    (a few hundred bytes: stored inside its leaf page). Returns OUT and the images by id."""
    rng = np.random.default_rng(3)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    images = []
    for i in range(30):
        side = 4 if i % 5 == 2 else 40
        image = make_image(rng, side, side)
        (src / f"img_{i:03d}.png").write_bytes(encode(image, ".png"))
        images.append(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))
    return build_packed(tmp_path / "src", tmp_path / "out.lmdb", "lmdb"), images


class NoLookups:
    """An LMDB environment stand-in that fails every lookup."""

    def begin(self, **_: Any) -> Any:
        raise AssertionError("looked up through LMDB")


def assert_reads_right(ds: LmdbDataset, images: list[np.ndarray]) -> None:
    for i, expected in enumerate(images):
        np.testing.assert_array_equal(ds[i][0], expected)


def with_offsets_moved(out: Path, ids: Any, by: int) -> LmdbDataset:
    """The dataset at `out` with the index offsets of `ids` moved by `by` bytes."""
    ds = LmdbDataset(out)
    assert ds.index is not None
    assert ds.index.offset is not None
    offsets = ds.index.offset.copy()
    offsets[ids] += by
    ds.index.offset = offsets
    return ds


def test_values_are_read_at_their_offsets_without_lmdb_lookups(
    big_and_small: tuple[Path, list[np.ndarray]],
) -> None:
    out, images = big_and_small
    ds = LmdbDataset(out)
    np.testing.assert_array_equal(ds[0][0], images[0])  # the offsets are checked here
    assert ds._direct_maps[0] is not None
    ds._handles[0] = NoLookups()  # from now on, a lookup through LMDB fails the read
    for i, expected in enumerate(images):  # small values (i % 5 == 2) in their leaf pages too
        np.testing.assert_array_equal(ds[i][0], expected)
        assert ds.read_bytes(i) == (out.parent / "src" / "a" / f"img_{i:03d}.png").read_bytes()
    assert pickle.loads(pickle.dumps(ds))[1][1] == ds[1][1]


def test_small_values_and_all_reads_match_the_images(
    big_and_small: tuple[Path, list[np.ndarray]],
) -> None:
    out, images = big_and_small
    assert_reads_right(LmdbDataset(out, verify_crc=True), images)


def test_every_shard_is_checked_and_read_at_its_offsets(
    big_and_small: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    _, images = big_and_small
    out = build_packed(tmp_path / "src", tmp_path / "sharded.lmdb", "lmdb", shard_size=40_000)
    ds = LmdbDataset(out)
    assert len(ds.shard_bounds) > 3  # several shards
    assert_reads_right(ds, images)
    assert sorted(ds._direct_maps) == list(range(len(ds.shard_bounds) - 1))
    assert all(found is not None for found in ds._direct_maps.values())


def test_offsets_that_do_not_fit_the_file_are_not_used(
    big_and_small: tuple[Path, list[np.ndarray]],
) -> None:
    # As if data.mdb had been compacted or rewritten since the build: every offset is off
    # by one page. Reads go through LMDB and stay right.
    out, images = big_and_small
    ds = with_offsets_moved(out, slice(None), 4096)
    assert_reads_right(ds, images)
    assert ds._direct_maps[0] is None


def test_one_offset_that_is_no_value_start_is_looked_up(
    big_and_small: tuple[Path, list[np.ndarray]],
) -> None:
    out, images = big_and_small
    ds = with_offsets_moved(out, [1], 8)  # sample 1 is not among the checked (0, 4, ... 29)
    assert_reads_right(ds, images)
    assert ds._direct_maps[0] is not None


def test_overflow_value_reads_only_overflow_page_starts() -> None:
    page = bytearray(3 * 4096)
    page[4096 : 4096 + 16] = struct.pack("<QHHI", 1, 0, 0x04, 2)  # page 1: overflow, 2 pages
    page[4096 + 16 : 4096 + 20] = b"data"
    assert overflow_value(page, 4096 + 16, 4, 4096) == b"data"
    assert overflow_value(page, 4096 + 16, 2 * 4096, 4096) is None  # longer than its pages
    assert overflow_value(page, 4096 + 24, 4, 4096) is None  # not right after a header
    assert overflow_value(page, 2 * 4096 + 16, 4, 4096) is None  # page 2 has no header
    page[4096 + 10] = 0x02  # a leaf page, not an overflow page
    assert overflow_value(page, 4096 + 16, 4, 4096) is None


def _leaf_page(key: bytes, value: bytes) -> tuple[bytearray, int]:
    """A 3-page file whose page 1 is a leaf holding `key` -> `value`; and the value's offset."""
    data = bytearray(3 * 4096)
    node = 4096 - 8 - len(key) - len(value)  # nodes fill a page from its end
    data[4096:4112] = struct.pack("<QHHHH", 1, 0, 0x02, 16 + 2, node)  # one node pointer
    data[4096 + 16 : 4096 + 18] = struct.pack("<H", node)
    data[4096 + node : 4096 + node + 8] = struct.pack("<HHHH", len(value), 0, 0, len(key))
    start = 4096 + node + 8 + len(key)
    data[start - len(key) : start] = key
    data[start : start + len(value)] = value
    return data, start


def test_leaf_value_reads_only_the_value_its_leaf_node_names() -> None:
    key, value = image_key(7), b"small image bytes"
    page, at = _leaf_page(key, value)
    assert leaf_value(page, at, len(value), 4096, key) == value
    assert leaf_value(page, at, len(value) - 1, 4096, key) is None  # the node says another size
    assert leaf_value(page, at, len(value), 4096, image_key(8)) is None  # another key's node
    assert leaf_value(page, at + 1, len(value) - 1, 4096, key) is None  # not the value's start
    assert leaf_value(page, at + 4096, len(value), 4096, key) is None  # page 2: no leaf
    unnamed = bytearray(page)
    unnamed[4096 + 16 : 4096 + 18] = b"\0\0"  # no node pointer names the node: stale bytes
    assert leaf_value(unnamed, at, len(value), 4096, key) is None
    overflow = bytearray(page)
    overflow[4096 + 10] = 0x04  # an overflow page, not a leaf
    assert leaf_value(overflow, at, len(value), 4096, key) is None
    big = bytearray(page)
    big[at - len(key) - 4 : at - len(key) - 2] = struct.pack("<H", 1)  # F_BIGDATA: on pages
    assert leaf_value(big, at, len(value), 4096, key) is None
