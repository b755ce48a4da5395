"""The bytes that a build's pool processes checked come back through shared memory (packer.ring)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

import packer.prepare
import packer.ring
from packer.build import build
from packer.config import BuildConfig
from packer.ring import ByteRing
from tests.conftest import write_tree


def _fill(ring: ByteRing, slot: int, blobs: list[bytes], out: multiprocessing.Queue) -> None:
    out.put(ring.put(slot, blobs))


def test_a_forked_process_writes_what_the_parent_takes() -> None:
    ring = ByteRing(3)
    small = [b"a" * 10, b"", b"bc" * 7]
    big = [b"x" * (ring.slot_bytes - 5), b"y" * 10, b"z" * 5]  # the second one does not fit
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    for slot, blobs in ((1, small), (2, big)):
        child = context.Process(target=_fill, args=(ring, slot, blobs, out))
        child.start()
        child.join()
        assert child.exitcode == 0
        lengths = out.get()
        expected = [len(b) if b and b != b"y" * 10 else 0 for b in blobs]
        assert lengths == expected
        taken = ring.take(slot, lengths)
        assert taken == [b if n else b"" for b, n in zip(blobs, lengths, strict=True)]
    ring.close()


def _outputs(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("meta.json", "lock.mdb")
    }


@pytest.mark.parametrize("slot_bytes", [None, 2000])
def test_pooled_build_takes_the_checked_bytes_from_the_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot_bytes: int | None
) -> None:
    """No source is opened again by the writer unless its bytes did not fit in their slot."""
    src = tmp_path / "src"
    files = write_tree(src, {"a": 70, "b": 60})
    build(BuildConfig(src=src, out=tmp_path / "one", workers=1, progress=False))
    reopened: list[str] = []
    open_source = packer.prepare.open_source

    def counting(path: str, rel: str, *, root: str | None = None) -> int | object:
        reopened.append(rel)
        return open_source(path, rel, root=root)

    monkeypatch.setattr(packer.prepare, "open_source", counting)
    if slot_bytes is not None:
        monkeypatch.setattr(packer.ring, "SLOT_BYTES", slot_bytes)
    build(BuildConfig(src=src, out=tmp_path / "two", workers=2, progress=False))
    assert _outputs(tmp_path / "one") == _outputs(tmp_path / "two")
    if slot_bytes is None:
        assert reopened == []
    else:  # each batch's slot holds its first few images; the rest are read again
        assert 0 < len(reopened) < len(files)
