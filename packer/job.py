"""One build job as a value, and `ShardSettings`, the part of its config one shard's task needs.

The job holds the config, the plan (entries and shards), the build directory and the shards
already finished there. `ShardSettings` is what an engine sends to a pool process or a Ray task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packer.config import BuildConfig
from packer.plan import ShardPlan
from packer.records import Entry
from packer.transform import Transform


@dataclass(frozen=True)
class ShardSettings:
    """The build options a shard task uses: how to prepare each input and where it goes."""

    format: str  # the registered format of the shard writer (`packer.formats`)
    on_error: str  # skip | fail
    decode_check: bool
    transform: Transform
    src: str  # SRC as an absolute path: no source is read from outside it


@dataclass(frozen=True)
class BuildJob:
    """A planned build: what an engine needs to write its shards.

    Attributes:
        cfg: the build's config.
        tmp: the hidden build directory the shards are written into.
        entries: the label plan's entries, in id order.
        shards: the shard plan over `entries`.
        finished: the planned shards finished already (kept by ``--resume``).
    """

    cfg: BuildConfig
    tmp: Path
    entries: list[Entry]
    shards: list[ShardPlan]
    finished: frozenset[int]

    @property
    def settings(self) -> ShardSettings:
        """What each shard task needs of the config."""
        cfg = self.cfg
        src = os.path.abspath(cfg.src)
        return ShardSettings(cfg.format, cfg.on_error, cfg.decode_check, cfg.transform, src)

    @property
    def todo(self) -> list[ShardPlan]:
        """The planned shards still to write, in plan order."""
        return [s for s in self.shards if s.number not in self.finished]

    def entries_of(self, shard: ShardPlan) -> list[Entry]:
        """The entries of planned shard `shard`."""
        return self.entries[shard.start : shard.stop]
