"""Fixtures that write small real PNG/JPEG trees into tmp_path, and pack them in every
registered format."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from readers.formats import FORMATS
from readers.io import handles


def encode(image: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def make_image(rng: np.random.Generator, width: int, height: int, channels: int = 3) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def write_tree(root: Path, spec: dict[str, int], *, seed: int = 0) -> dict[str, bytes]:
    """Class folders with `spec[class]` images each, alternating PNG/JPEG and sizes.

    Returns the bytes of every file by relative POSIX path.
    """
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    for cls, count in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            w, h = 8 + 3 * i, 6 + 2 * (i % 4)
            channels = 1 if i % 5 == 4 else 3
            ext = ".png" if i % 2 == 0 else ".jpg"
            data = encode(make_image(rng, w, h, channels), ext)
            rel = f"{cls}/img_{i:03d}{ext}"
            (root / rel).write_bytes(data)
            files[rel] = data
    return files


@pytest.fixture(autouse=True)
def _close_handles() -> Iterator[None]:
    """Each test starts and ends without open LMDB handles in this process."""
    handles.close_all()
    yield
    handles.close_all()


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A small class-folder tree: 3 classes, 11 images."""
    src = tmp_path / "src"
    files = write_tree(src, {"cat": 4, "dog": 5, "eel": 2})
    return src, files


# --------------------------------------------------------------------------------------------
# A packed dataset of every registered format: tests that take `packed` (or `packed_raw`)
# run once per format in readers.formats.REGISTRY, so a new format is tested on registering it.


@dataclass(frozen=True)
class Packed:
    """A dataset built from the `tree` fixture: where, in which format, from which files."""

    path: Path
    format: str
    files: dict[str, bytes]


def build_packed(src: Path, out: Path, fmt: str, **options: Any) -> Path:
    """``packer build SRC OUT --format fmt`` with BuildConfig `options`; returns OUT."""
    from packer.build import build
    from packer.config import BuildConfig

    build(BuildConfig(src=src, out=out, format=fmt, **options))
    return out


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    """Each registered format's name in turn."""
    return str(request.param)


@pytest.fixture
def packed(tree: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str) -> Packed:
    """The `tree` fixture packed in each registered format (one shard, original bytes)."""
    src, files = tree
    return Packed(build_packed(src, tmp_path / f"out.{fmt}", fmt), fmt, files)


@pytest.fixture
def packed_raw(tree: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str) -> Packed:
    """The `tree` fixture packed with ``--encode raw`` (decoded pixels) in each format."""
    from packer.transform import Transform

    src, files = tree
    out = build_packed(src, tmp_path / f"raw.{fmt}", fmt, transform=Transform(encode="raw"))
    return Packed(out, fmt, files)
