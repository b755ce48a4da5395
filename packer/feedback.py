"""What a command says while it works and when Ctrl-C stops it.

- `Interrupted`: a Ctrl-C that knows what the command keeps; `packer.clitools.guarded` prints
  it as one ``packer: interrupted: ...`` line and exits 130.
- `ProgressCounter`: the per-image count that pool processes add to, batched, for the bar in
  the process that started them.
- `test_delay`: a test hook that slows each image, so the tests can watch a bar move and
  interrupt a command half-way.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

DELAY_ENV = "PACKER_TEST_DELAY_PER_IMAGE"
"""Test hook: seconds to sleep per image written (build, convert, ...) or verified."""

_REPORT_EVERY = 64  # images between two additions to the shared count (or _REPORT_SECONDS)
_REPORT_SECONDS = 0.1


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C, with what the interrupted command kept and how to go on.

    Attributes:
        kept: the sentence after ``packer: interrupted:`` (what is kept, the command to run).
    """

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


def shards_kept(tmp: Path, numbers: Iterable[int]) -> Interrupted:
    """The `Interrupted` of a build-like run whose planned shards `numbers` are in `tmp`."""
    from packer.plan import MERGING_NAME
    from packer.writers.part import read_done

    if (tmp / MERGING_NAME).exists():  # --resume starts such a build over (packer.build)
        return Interrupted(
            f"it was merging the shards' index in {tmp}, which cannot be resumed; run the "
            "same command again"
        )
    planned = list(numbers)
    finished = sum(read_done(tmp, n) is not None for n in planned)
    return Interrupted(
        f"{finished} of {len(planned)} shards finished are kept in {tmp}; run the same "
        "command with --resume to finish"
    )


@contextlib.contextmanager
def on_interrupt(kept: str) -> Iterator[None]:
    """Turn a Ctrl-C inside the block into `Interrupted` with `kept` (what the block keeps)."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(kept) from None


def test_delay() -> float:
    """The seconds per image that `DELAY_ENV` asks for (0.0: none, the normal case)."""
    try:
        return max(0.0, float(os.environ.get(DELAY_ENV, "") or 0.0))
    except ValueError:
        return 0.0


class ProgressCounter:
    """Images handled in a pool process, added to a shared count in batches.

    Adding to the shared `multiprocessing.Value` takes its lock, so it is done every
    `_REPORT_EVERY` images or `_REPORT_SECONDS`, whichever comes first, and by `flush`.
    """

    def __init__(self, shared: Any) -> None:
        self.shared = shared
        self.unsent = 0
        self.sent_at = time.monotonic()
        self.delay = test_delay()

    def __call__(self, stored: int) -> None:
        """Count one image (`stored`: its stored bytes, unused)."""
        if self.delay:
            time.sleep(self.delay)
        self.unsent += 1
        if self.unsent >= _REPORT_EVERY or time.monotonic() - self.sent_at >= _REPORT_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Add the images not yet counted to the shared count."""
        if self.unsent:
            with self.shared.get_lock():
                self.shared.value += self.unsent
            self.unsent = 0
        self.sent_at = time.monotonic()
