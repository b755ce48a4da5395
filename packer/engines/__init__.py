"""Build engines: what writes the planned shards of a build (this process, or a Ray cluster).

An engine gets a `packer.job.BuildJob` (the build directory, the label plan's entries, the
shard plan and the shards already finished there by ``--resume``) and must leave every other
planned shard finished: its files plus the side files and completion marker of a `ShardPart`,
written by the shard task (`packer.task`), which gets the job's `ShardSettings`.  Numbering,
merging, meta.json and publishing are the same code for every engine, so every engine gives
the same dataset.

- ``local`` (`packer.engines.local`): the shard task (`packer.task`) in this process fed
  by a process pool, or, with several shards and workers, in each pool process for a shard.
- ``ray`` (`packer.engines.ray`): one Ray task per shard, anywhere in the cluster; a shard
  is written with a provisional first id (its first entry's index), and the merge renumbers
  shards whose earlier shards skipped inputs (where the format stores global ids).
  Imported only for ``--engine ray``.
"""

from __future__ import annotations

import sys
from typing import Any

from packer.errors import PackerError


class EngineError(PackerError):
    """A shard could not be written for a reason outside its inputs.

    For example its task died on every retry, or a node or the cluster was lost; the finished
    shards are kept for ``--resume``.
    """


class _NoBar:
    """The progress bar when none is shown: tqdm is then not even imported."""

    def update(self, n: int) -> None:
        """Do nothing."""

    def set_postfix_str(self, text: str) -> None:
        """Do nothing."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress_bar(total: int, enabled: bool | None, *, desc: str = "packing") -> Any:
    """A tqdm bar over `total` images (None: shown when stderr is a terminal), named `desc`.

    Without a bar, an object that takes the same calls and does nothing (no tqdm import).
    """
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="img",
        desc=desc,
        dynamic_ncols=True,
        smoothing=0.1,
    )
