"""Build engines: what writes the planned shards of a build (this process, or a Ray cluster).

An engine gets the build directory, the label plan's entries, the shard plan and the shards
already finished there (``--resume``), and must leave every other planned shard finished:
its files plus the side files and completion marker of a `ShardPart`, written by
`packer.build.write_shard`.  Numbering, merging, meta.json and publishing are the same code
for every engine, so every engine gives the same dataset.

- ``local`` (`packer.build._run_local`): shards in order in this process, images read and
  checked in a process pool; each shard is written with its final first sample id.
- ``ray`` (`packer.engines.ray`): one Ray task per shard, anywhere in the cluster; a shard
  is written with a provisional first id (its first entry's index), and the merge renumbers
  RecordIO shards whose earlier shards skipped inputs.  Imported only for ``--engine ray``.
"""

from __future__ import annotations

from packer.errors import PackerError

ENGINES = ("local", "ray")


class EngineError(PackerError):
    """A shard could not be written for a reason outside its inputs (its task died on every
    retry, a node or the cluster was lost); the finished shards are kept for ``--resume``."""
