"""The shard task: write one planned shard of a build, from its entries to its finished part.

Every engine runs this same code for a shard (the local engine in this process or in a pool
process, the Ray engine in a Ray task), so every engine gives the same shard files, index
rows and problems; `packer.build` then merges the parts into the dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packer.errors import InputError, PackerError
from packer.formats import FORMATS
from packer.job import ShardSettings
from packer.plan import ShardPlan
from packer.prepare import Prepared, prepare_entries
from packer.problems import NO_LABEL, NO_LABEL_MESSAGE, Problem
from packer.records import Entry, Record
from packer.writers.base import ShardWriter
from packer.writers.part import start_part


def check_input(
    entry: Entry, item: Record | Problem, shard_cls: type[ShardWriter]
) -> Record | Problem:
    """The per-input checks that need the entry, what reading it gave, and the format."""
    if not isinstance(item, Record):
        return item
    if not entry.labelled:
        return Problem(item.rel, NO_LABEL, entry.note or NO_LABEL_MESSAGE)
    return shard_cls.check(item) or item


def write_shard(
    tmp: Path,
    shard: ShardPlan,
    entries: list[Entry],
    items: Iterator[Prepared],
    settings: ShardSettings,
    *,
    first_id: int,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write planned `shard` of the build in `tmp` from its entries' prepared `items`.

    Whatever an earlier attempt at this shard left (a retried task, an interrupted build) is
    removed first: LMDB would append to an existing environment.  Sample ids start at
    `first_id` (a guess is fine: the merge renumbers).  `advance` is called once per entry
    with the bytes stored for it (0 when it was skipped).

    Returns:
        The shard's completion marker (see `ShardPart.finish`).

    Raises:
        InputError: an input is bad and ``settings.on_error`` is ``fail``.
    """
    shard_cls = FORMATS[settings.format].writer
    part = start_part(tmp, shard.number, shard_cls, first_id=first_id)
    try:
        problems: list[Problem] = []
        for entry in entries:
            got, row = next(items)
            item = check_input(entry, got, shard_cls)
            if isinstance(item, Problem):
                if settings.on_error == "fail":
                    raise InputError(item.path, item.reason, item.message)
                problems.append(item)
                stored = 0
            else:
                if row is None:
                    part.add(item)
                else:
                    part.add(item, row)
                stored = len(item.data)
            if advance is not None:
                advance(stored)
        return part.finish(problems)
    except BaseException:
        part.abort()
        raise


def run_shard(
    settings: ShardSettings,
    tmp: Path,
    shard: ShardPlan,
    entries: list[Entry],
    *,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run the whole task for one shard in one process: read, check and write its `entries`.

    The entries are ``entries[shard.start:shard.stop]`` of the label plan, written with the
    provisional first id ``shard.start``; `advance` is as for `write_shard`. Returns the
    shard's completion marker.
    """
    items = prepare_entries(entries, settings)
    return write_shard(tmp, shard, entries, items, settings, first_id=shard.start, advance=advance)


# Our errors take other arguments than they store in .args, so pickle cannot rebuild them:
# a task in another process returns its error in this form instead of raising it.
PortableError = tuple[type[PackerError], tuple[Any, ...], dict[str, Any]]


def make_portable(exc: PackerError) -> PortableError:
    """`exc` in a form that pickles (see `rebuild`)."""
    return type(exc), exc.args, dict(vars(exc))


def rebuild(error: PortableError) -> PackerError:
    """The error that `make_portable` packed."""
    cls, args, attrs = error
    exc = cls.__new__(cls)
    BaseException.__init__(exc, *args)
    exc.__dict__.update(attrs)
    return exc
