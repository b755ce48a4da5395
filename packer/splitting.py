"""The parts of one ``packer split``, checked first, written aside and put in place together.

Every part's destination ``DIR/<name>`` is checked before a record is written (apart from the
source, free or, with ``--overwrite``, a packer dataset), and each part is written as a
finished dataset into the hidden ``DIR/.split.partial/<name>``. Only when all of them are
finished are they put in place, one rename (or ``renameat2`` exchange, `packer.swap`, for a
part that replaces an old one) after the other, with no record written in between. So a
failure or a ``kill -9`` while the parts are written leaves every old part as it was (the
leftover ``.split.partial`` is removed by the next split into DIR); a failure while they are
put in place puts the moved ones back. Only a ``kill -9`` amid those few renames can leave
parts of two splits side by side, and each part's meta.json records its split (source index,
fractions with every part's name, seed, stratify), so that a mismatch can be seen there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from packer.errors import OutputExistsError
from packer.output import build_lock, check_output_apart, check_replaceable, prepare_parent
from packer.swap import ExchangeUnsupportedError, exchange_dirs
from readers.durable import fsync_path

STAGING_NAME = ".split.partial"
"""The hidden directory of DIR where a split writes its parts before they are put in place."""

KILL_AT_ENV = "PACKER_SPLIT_KILL_AT"
"""Test hook: ``kill -9`` the splitting process itself at the named step (`STEPS`)."""

STEPS = ("part", "published")
"""Where a split can be killed for the tests: a part other than the last one written (aside);
the first part put in place, before the others."""


def checkpoint(step: str) -> None:
    """The test hook: die here, as by ``kill -9``, when `KILL_AT_ENV` names this step."""
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


class PartsPublication:
    """The destinations of a split's parts: checked at once, written aside, put in place last.

    Use as a context manager: on entry it locks every destination (and the staging
    directory) and clears a staging directory left by an interrupted split; the parts are
    then written at `staged` paths; `publish` puts them in place; on exit the staging
    directory (holding the old parts that were replaced) is removed.
    """

    def __init__(
        self,
        root: Path,
        into: Path,
        names: list[str],
        *,
        overwrite: bool,
        say: Callable[[str], None],
    ) -> None:
        """Check every destination before anything is written.

        Raises:
            OutputExistsError: a destination exists and `overwrite` is not set.
            UnsafeOutputError, NotADatasetError, OutputParentError: see `packer.output`.
        """
        self.into = into
        self.staging = into / STAGING_NAME
        self.finals = {name: into / name for name in names}
        self.overwrite = overwrite
        self.say = say
        self._stack = contextlib.ExitStack()
        for name, final in self.finals.items():
            check_output_apart(final, [root], build_dir=self.staged(name), overwrite=overwrite)
            if _exists(final) and not overwrite:
                raise OutputExistsError(str(final))
        check_output_apart(self.staging, [root], build_dir=self.staging, overwrite=False)
        prepare_parent(self.staging)

    def staged(self, name: str) -> Path:
        """Where part `name` is written before it is put in place."""
        return self.staging / name

    def __enter__(self) -> PartsPublication:
        """Lock the destinations; clear an interrupted split's staging directory."""
        with contextlib.ExitStack() as stack:
            for final in self.finals.values():
                stack.enter_context(build_lock(final))
            stack.enter_context(build_lock(self.staging))
            if _exists(self.staging):
                self.say(f"removing {self.staging}, left by an interrupted split")
                _remove(self.staging)
            self.staging.mkdir()
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Remove the staging directory (unfinished parts, or the old ones replaced); unlock."""
        try:
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self._stack.close()

    def publish(self) -> None:
        """Put every finished part in place, with nothing but renames in between.

        A part whose destination holds a dataset takes its place in one exchange, the old one
        going to the staging directory. Should a rename fail, the parts moved already are put
        back, so DIR holds the old parts only.

        Raises:
            OutputExistsError, NotADatasetError: a destination changed while the parts were
                written (checked again first).
        """
        for final in self.finals.values():
            if _exists(final):
                if not self.overwrite:
                    raise OutputExistsError(str(final))
                check_replaceable(final)
        for name in self.finals:
            fsync_path(self.staged(name))
        done: list[tuple[str, bool]] = []
        try:
            for name, final in self.finals.items():
                replaced = _exists(final)
                if replaced:
                    _swap(final, self.staged(name))
                else:
                    os.rename(self.staged(name), final)
                done.append((name, replaced))
                if len(done) == 1:
                    checkpoint("published")
            fsync_path(self.into)
        except BaseException:
            for name, replaced in reversed(done):
                if replaced:
                    _swap(self.finals[name], self.staged(name))
                else:
                    os.rename(self.finals[name], self.staged(name))
            raise


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _swap(final: Path, staged: Path) -> None:
    """Exchange the directories `final` and `staged` (two renames where that cannot be done)."""
    try:
        exchange_dirs(final, staged)
    except ExchangeUnsupportedError:
        aside = staged.parent / f"{staged.name}.old"
        os.rename(final, aside)
        os.rename(staged, final)
        os.rename(aside, staged)
