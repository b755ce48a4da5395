"""Staging copies only the dataset's own files, follows no symbolic link planted in the origin,
keeps the origin's permissions at most, and removes the staged copies of older builds of the same
origin once nobody uses them."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import handles
from readers.files import DATASET_FILES, NotRegularFileError
from readers.formats import FORMATS, REGISTRY
from readers.formats.layout import INDEX_NAME, META_NAME
from readers.staging import Stager, StagingError, release
from readers.staging.cache import compute_generation
from tests.readers.test_staging import packed, run_python, samples

SECRET = b"TOP SECRET: only its owner may read this\n"


@pytest.fixture(autouse=True)
def _release_holds(tmp_path: Path) -> Iterator[None]:
    yield
    for root in (tmp_path / "cache").glob("*"):
        release(root)


def _secret(tmp_path: Path, size: int = len(SECRET)) -> Path:
    """A file only its owner may read, of `size` bytes."""
    path = tmp_path / "secret"
    path.write_bytes((SECRET * (size // len(SECRET) + 1))[:size])
    path.chmod(0o600)
    return path


def _cache_holds(cache: Path, data: bytes) -> list[str]:
    """The regular files under `cache` (no link followed) whose bytes contain `data`."""
    found = []
    for dirpath, _, names in os.walk(cache):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink() and data in path.read_bytes():
                found.append(str(path.relative_to(cache)))
    return found


def _shard_file(out: Path) -> str:
    meta = json.loads((out / META_NAME).read_text())
    return REGISTRY[meta["format"]].shard_files(meta["shards"][0]["name"])[0]


def test_a_foreign_link_in_the_origin_is_neither_copied_nor_followed(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[0])
    secret = _secret(tmp_path)
    os.symlink(secret, out / "evil")
    os.symlink(secret, out / "notes.txt")
    (out / "extra.bin").write_bytes(b"not the dataset's")
    root = Stager(out, tmp_path / "cache").run().root
    assert _cache_holds(tmp_path / "cache", SECRET[:10]) == []
    assert not (root / "evil").exists()
    assert not (root / "notes.txt").exists()
    assert not (root / "extra.bin").exists()
    assert samples(root) == samples(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_file_linked_elsewhere_is_refused(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    rel = _shard_file(out)
    # the same size as the shard file, so that the size in meta.json does not give it away
    secret = _secret(tmp_path, (out / rel).stat().st_size)
    (out / rel).unlink()
    os.symlink(secret, out / rel)
    with pytest.raises(NotRegularFileError, match=f"{rel}: is a symbolic link"):
        Stager(out, tmp_path / "cache").run()
    assert _cache_holds(tmp_path / "cache", SECRET[:10]) == []


def test_a_shard_directory_linked_elsewhere_is_refused(tmp_path: Path) -> None:
    if "lmdb" not in FORMATS:
        pytest.skip("LMDB is not registered")
    out = packed(tmp_path, "lmdb")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    size = (out / "shard-00000" / "data.mdb").stat().st_size
    os.rename(_secret(tmp_path, size), elsewhere / "data.mdb")
    os.rename(out / "shard-00000", tmp_path / "moved")
    os.symlink(elsewhere, out / "shard-00000")
    with pytest.raises(NotRegularFileError, match="shard-00000: is a symbolic link"):
        Stager(out, tmp_path / "cache").run()
    assert _cache_holds(tmp_path / "cache", SECRET[:10]) == []


def test_a_linked_meta_or_index_is_refused(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[-1])
    for name in (INDEX_NAME, META_NAME):
        os.rename(out / name, tmp_path / name)
        os.symlink(tmp_path / name, out / name)
        with pytest.raises(NotRegularFileError, match=f"{name}: is a symbolic link"):
            Stager(out, tmp_path / "cache")
        os.replace(tmp_path / name, out / name)


def test_a_dataset_without_its_index_is_not_staged(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[0])
    (out / INDEX_NAME).unlink()
    with pytest.raises(StagingError, match=f"{INDEX_NAME}: missing"):
        Stager(out, tmp_path / "cache").run()


def _modes(root: Path) -> dict[str, int]:
    """The permission bits of every file and directory under `root`, no link followed."""
    modes = {".": stat.S_IMODE(root.lstat().st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath, name)
            if not path.is_symlink():
                modes[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return modes


@pytest.mark.parametrize("fmt", FORMATS)
def test_staged_copies_keep_the_origins_permissions_at_most(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o750 if path.is_dir() else 0o640)
    (out / META_NAME).chmod(0o600)
    old_umask = os.umask(0)  # the umask cannot hide a copy made wider than its origin
    try:
        root = Stager(out, tmp_path / "cache").run().root
    finally:
        os.umask(old_umask)
    modes = _modes(root)
    assert modes[META_NAME] == 0o600
    assert modes[INDEX_NAME] == 0o640
    rel = _shard_file(out)
    staged = root / ".staging" / "data" / rel
    assert stat.S_IMODE(staged.stat().st_mode) == 0o640
    # no copy of the origin's bytes, and no directory, is open to others; no copy is executable
    for name, mode in modes.items():
        if (root / name).is_dir():
            assert mode & 0o007 == 0, (name, oct(mode))
        elif name in DATASET_FILES or name.startswith(".staging/data/"):
            assert mode & 0o117 == 0, (name, oct(mode))
    assert samples(root) == samples(out)


def test_the_umask_still_narrows_the_copies(tmp_path: Path) -> None:
    out = packed(tmp_path, FORMATS[0])
    old_umask = os.umask(0o077)
    try:
        root = Stager(out, tmp_path / "cache").run().root
    finally:
        os.umask(old_umask)
    assert all(mode & 0o077 == 0 for mode in _modes(root).values())


# --- generations -----------------------------------------------------------------------------


def _rebuild(tmp_path: Path, out: Path, fmt: str, seed: int) -> None:
    """Build `out` again in place from other images: a new generation of the same origin."""
    from tests.conftest import write_tree

    src = tmp_path / f"src-rebuild-{seed}"
    write_tree(src, {"a": 5, "b": 5}, seed=seed)
    build(BuildConfig(src=src, out=out, format=fmt, shard_size=3000, overwrite=True))
    handles.close_all()


def _staged(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("fmt", FORMATS)
def test_staging_a_rebuilt_origin_removes_the_older_generation(tmp_path: Path, fmt: str) -> None:
    cache = tmp_path / "cache"
    out = packed(tmp_path, fmt)
    other = packed(tmp_path, fmt, name="other", seed=3)
    first = Stager(out, cache, hold=False).run()
    kept = Stager(other, cache, hold=False).run()
    _rebuild(tmp_path, out, fmt, seed=7)
    second = Stager(out, cache, hold=False).run()
    assert second.root != first.root
    assert second.superseded == [first.root.name]
    assert _staged(cache) == sorted([second.root.name, kept.root.name])  # no limit was given
    assert samples(second.root) == samples(out)
    assert samples(kept.root) == samples(other)
    origin = json.loads((second.root / ".staging" / "origin.json").read_text())
    assert origin["generation"] == compute_generation((out / META_NAME).read_bytes())


def test_an_older_generation_in_use_is_kept_until_released(tmp_path: Path) -> None:
    fmt = FORMATS[0]
    cache = tmp_path / "cache"
    out = packed(tmp_path, fmt)
    first = Stager(out, cache, hold=False).run()
    before = samples(first.root)
    handles.close_all()
    # another process reads the old generation and holds it
    reader = run_python(
        """
        import sys, time
        from readers.staging import stage
        stage(sys.argv[1], sys.argv[2])
        print("held", flush=True)
        time.sleep(600)
        """,
        str(out),
        str(cache),
    )
    assert reader.stdout is not None
    assert reader.stdout.readline().strip() == "held"
    try:
        _rebuild(tmp_path, out, fmt, seed=7)
        second = Stager(out, cache, hold=False).run()
        assert second.superseded == []
        assert first.root.is_dir()
        assert samples(first.root) == before  # still whole, still its own samples
        assert json.loads((first.root / META_NAME).read_text()) != json.loads(
            (out / META_NAME).read_text()
        )
    finally:
        reader.kill()
        reader.wait()
    third = Stager(out, cache, hold=False).run()
    assert third.superseded == [first.root.name]
    assert _staged(cache) == [second.root.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_staging_is_pinned_to_the_build_it_opened(tmp_path: Path, fmt: str) -> None:
    out = packed(tmp_path, fmt)
    stager = Stager(out, tmp_path / "cache")  # reads meta.json now
    src = tmp_path / "src-other"
    from tests.conftest import write_tree

    write_tree(src, {"a": 12, "b": 12}, seed=5)
    build(BuildConfig(src=src, out=out, format=fmt, overwrite=True))  # a rebuild meanwhile
    with pytest.raises(StagingError, match="rebuilt after staging began"):
        stager.run()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rebuild_between_shard_copies_is_refused(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import readers.staging.stager as stager_module
    from tests.conftest import write_tree

    out = packed(tmp_path, fmt)
    src = tmp_path / "src-other"
    write_tree(src, {"a": 12, "b": 12}, seed=5)
    real_copy = stager_module.copy_checked
    shard_names = {s["name"] for s in json.loads((out / META_NAME).read_text())["shards"]}
    rebuilt: list[bool] = []

    def copy_then_rebuild(origin: object, rel: str, *args: object) -> object:
        found = real_copy(origin, rel, *args)  # type: ignore[arg-type]
        if rel.split("/")[0].split(".")[0] in shard_names and not rebuilt:
            rebuilt.append(True)  # the first shard is copied: OUT is rebuilt under staging
            build(BuildConfig(src=src, out=out, format=fmt, overwrite=True))
        return found

    monkeypatch.setattr(stager_module, "copy_checked", copy_then_rebuild)
    with pytest.raises(StagingError, match=r"rebuilt after staging began .* shard shard-00000"):
        Stager(out, tmp_path / "cache").run()
    assert rebuilt
