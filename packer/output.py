"""Where a build may write.

OUT apart from SRC and the label files, ``--overwrite`` only onto a packer dataset, a usable
parent directory, and one build of an OUT at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from packer.config import LABEL_KEYWORDS, BuildConfig
from packer.errors import (
    BuildLockedError,
    NotADatasetError,
    OutputParentError,
    UnsafeOutputError,
)
from packer.labels.common import find_label_file
from readers.formats import FORMATS
from readers.formats.layout import META_NAME


def lock_path_for(out: Path) -> Path:
    """The hidden sibling of `out` that the build holding it has locked (and removes)."""
    return out.parent / f".{out.name}.lock"


def _within(path: str, root: str) -> bool:
    """Real path `path` is `root` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_name(out: Path) -> None:
    if out.name in ("", ".", ".."):
        raise UnsafeOutputError(
            f"OUT {out} does not name a directory of its own (a build replaces OUT by renaming "
            "it); give OUT as a path that ends in the dataset's name, such as ../data.lmdb"
        )


def _check_apart(src: Path, out: Path, build_dir: Path) -> None:
    """Refuse an OUT (or build directory) that is SRC, lies inside it or holds it."""
    src_real = os.path.realpath(src)
    fix = f"choose an OUT outside SRC, such as {src_real}-packed"
    out_real = os.path.realpath(out)
    if out_real == src_real:
        raise UnsafeOutputError(
            f"OUT {out} is SRC {src} (both are {src_real}): the build would replace the images "
            f"it packs; {fix}"
        )
    if _within(src_real, out_real):
        raise UnsafeOutputError(
            f"SRC {src} lies inside OUT {out} ({out_real}): a build replaces OUT whole, images "
            "included; choose an OUT that does not hold SRC"
        )
    if _within(out_real, src_real):
        raise UnsafeOutputError(
            f"OUT {out} lies inside SRC {src} ({out_real}): a later build of SRC would scan "
            f"the dataset (and take its folder for a class); {fix}"
        )
    build_real = os.path.realpath(build_dir)
    if _within(src_real, build_real):
        raise UnsafeOutputError(
            f"SRC {src} is or lies inside {build_dir}, the build directory that a build of "
            f"{out} clears; move SRC, or choose another OUT"
        )


def _input_files(cfg: BuildConfig) -> list[tuple[str, str]]:
    """(option, spec) of every label or class-map file the build reads."""
    files = [("--labels", s) for s in cfg.label_specs if s not in LABEL_KEYWORDS]
    if cfg.class_map not in (None, "auto"):
        files.append(("--class-map", str(cfg.class_map)))
    return files


def _check_inputs_outside(cfg: BuildConfig, build_dir: Path) -> None:
    """Refuse a label or class-map file inside OUT or the build directory.

    Both are replaced whole, so the file would be gone after the build.
    """
    places = [(cfg.out, os.path.realpath(cfg.out)), (build_dir, os.path.realpath(build_dir))]
    for option, spec in _input_files(cfg):
        path = find_label_file(spec, cfg.src)
        if not path.exists():
            continue  # the label planning reports it
        real = os.path.realpath(path)
        for place, place_real in places:
            if _within(real, place_real):
                raise UnsafeOutputError(
                    f"{option} {spec}: {path} lies inside {place}, which a build of {cfg.out} "
                    f"replaces whole; move it out of {place} first"
                )


def meta_problem(out: Path) -> str | None:
    """Why the directory `out` is not a dataset packer wrote, or None when it is one."""
    path = out / META_NAME
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return f"holds no {META_NAME}, so it is not a packer dataset"
    except (OSError, ValueError, RecursionError) as exc:
        return f"has a {META_NAME} that cannot be read ({exc})"
    if not isinstance(meta, dict):
        return f"has a {META_NAME} that is not packer's (not a JSON object)"
    fmt, version = meta.get("format"), meta.get("version")
    if fmt not in FORMATS:
        return (
            f"has a {META_NAME} that is not packer's (format {fmt!r}, expected one of "
            f"{', '.join(FORMATS)})"
        )
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"has a {META_NAME} that is not packer's (version {version!r}, expected an integer)"
    return None


def check_replaceable(out: Path) -> None:
    """Refuse to let ``--overwrite`` replace `out` unless it is a packer dataset.

    A packer dataset is a directory with packer's ``meta.json``; an empty directory is
    accepted too, and a missing `out` is fine.

    A symbolic link is refused, whatever it points to: replacing the link would leave the old
    dataset where it points, and replacing the target is better asked for by naming it.

    Raises:
        NotADatasetError: what `out` is instead, and how to go on.
    """
    if out.is_symlink():
        raise NotADatasetError(
            str(out),
            f"is a symbolic link (to {os.readlink(out)}), not a dataset directory",
            "pass the link's target as OUT to replace that dataset, or remove the link",
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise NotADatasetError(str(out), "is a file, not a dataset directory")
    with os.scandir(out) as entries:
        if next(entries, None) is None:
            return  # an empty directory holds nothing to lose
    problem = meta_problem(out)
    if problem is not None:
        raise NotADatasetError(str(out), problem)


def check_output(cfg: BuildConfig, *, build_dir: Path) -> None:
    """Refuse, before anything is written or removed, an OUT this build must not write.

    Args:
        cfg: the build; its OUT, SRC, label files and ``overwrite`` are checked.
        build_dir: the hidden sibling the build writes into (and clears) before publishing.

    Raises:
        UnsafeOutputError: OUT does not name a directory; OUT is SRC, lies inside it or holds
            it (real paths: symlinks and ``..`` resolved); SRC lies inside the build directory;
            or a label or class-map file lies inside OUT or the build directory.
        NotADatasetError: ``--overwrite`` onto something other than a packer dataset.
    """
    _check_apart(cfg.src, cfg.out, build_dir)
    _check_name(cfg.out)
    _check_inputs_outside(cfg, build_dir)
    if cfg.overwrite:
        check_replaceable(cfg.out)


def prepare_parent(out: Path) -> None:
    """Make OUT's parent directory (and the missing ones above it) and check it is writable.

    Raises:
        OutputParentError: a path on the way is not a directory, a directory cannot be made,
            or the parent is not writable.
    """
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next(
            (p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), parent
        )
        raise OutputParentError(str(out), f"{blocker} is not a directory") from None
    except OSError as exc:
        raise OutputParentError(
            str(out), f"cannot make its parent directory {parent} ({exc.strerror or exc})"
        ) from None
    if not os.access(parent, os.W_OK | os.X_OK):
        reason = "a read-only file system" if _read_only_fs(parent) else "no write permission"
        raise OutputParentError(
            str(out), f"its parent directory {parent} is not writable ({reason})"
        )


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _same_file(path: Path, fd: int) -> bool:
    """`path` names the file open as `fd` (not a newer file, and not nothing)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _acquire(out: Path, path: Path) -> int:
    """Lock `path` for this process; return its descriptor.

    The holder removes the file when it finishes, so a file opened just before that may be
    locked after it is gone, while a third build locks the new file of the same name. A lock
    counts only when `path` still names the locked file; otherwise the file is opened again.
    """
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise OutputParentError(
                str(out), f"cannot create the lock file {path} ({exc.strerror or exc})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise BuildLockedError(str(out), holder or "another process") from None
        if _same_file(path, fd):
            return fd
        os.close(fd)  # the build that held it has finished and removed it: lock the new one


@contextlib.contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """Hold the lock of `out` for the duration.

    A second build of the same OUT fails at once instead of mixing its shards into the first
    one's build directory.

    The lock file is the hidden sibling ``.OUT.lock`` (never inside the published OUT); it
    records the holder's pid and is removed, still locked, on exit.

    Raises:
        BuildLockedError: another build of the same OUT holds the lock.
        OutputParentError: the lock file cannot be created.
    """
    path = lock_path_for(out)
    fd = _acquire(out, path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        if _same_file(path, fd):  # removed while locked, so the next build locks a new file
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)


def check_output_apart(out: Path, inputs: list[Path], *, build_dir: Path, overwrite: bool) -> None:
    """`check_output` for a dataset written from other datasets (convert, merge, ...).

    Each of `inputs` must lie apart from OUT and its build directory, as SRC must for a build.

    Raises:
        UnsafeOutputError: OUT does not name a directory, or is, holds or lies in an input.
        NotADatasetError: `overwrite` onto something other than a packer dataset.
    """
    _check_name(out)
    for path in inputs:
        _check_apart(path, out, build_dir)
    if overwrite:
        check_replaceable(out)
