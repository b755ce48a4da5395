"""``packer stage OUT DIR``: copy a packed dataset into a node-local cache ahead of training."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from packer.clitools import refuse_urls
from packer.feedback import on_interrupt
from readers.errors import ReaderError
from readers.remote import StorageExtraMissingError
from readers.staging import Stager, StageResult, parse_size


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def summary(out: str | Path, result: StageResult, limit: str | None) -> list[str]:
    """The lines `packer stage` prints about what it did."""
    done = len(result.copied) + len(result.reused)
    total = done + len(result.origin)
    lines = [
        f"{out}: {done} of {total} shard{'s' if total != 1 else ''} staged in {result.root} "
        f"(copied {len(result.copied)}, {_mb(result.bytes_copied)}; "
        f"already there {len(result.reused)})"
    ]
    if result.repaired:
        lines.append(
            f"re-copied {len(result.repaired)} staged shard(s) that failed their check: "
            + ", ".join(result.repaired)
        )
    if result.superseded:
        lines.append(
            f"removed {len(result.superseded)} staged copy(ies) of older builds of {out}: "
            + ", ".join(result.superseded)
        )
    if result.evicted:
        lines.append(
            f"evicted {len(result.evicted)} least recently used shard(s) of other datasets"
        )
    if result.origin:
        lines.append(
            f"{len(result.origin)} shard(s) did not fit under --limit {limit} and will be read "
            f"from {out}: " + ", ".join(result.origin)
        )
    return lines


def stage_command(
    out: Annotated[
        str,
        typer.Argument(
            metavar="OUT",
            help="A packed dataset (on slow or shared storage), or its URL (s3://bucket/x).",
        ),
    ],
    cache_dir: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="Local cache directory (/dev/shm/packer, a local SSD), shared by every "
            "process on this machine; pass the same one as cache_dir= to the datasets.",
        ),
    ],
    limit: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Most bytes DIR may hold (20GiB, 500MB); least recently used shards of other "
            "datasets are evicted, shards that still do not fit are read from OUT.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(help="Re-read shards already staged and compare their CRC-32s."),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", show_default="on a terminal", help="Progress bar."
        ),
    ] = None,
) -> None:
    """Copy OUT into DIR once per machine (checked, atomic); print the staged directory."""
    from tqdm import tqdm

    refuse_urls("stage", outputs=(cache_dir,))
    try:
        cache_limit = parse_size(limit)
        stager = Stager(out, cache_dir, cache_limit=cache_limit, check=check, hold=False)
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(
            total=stager.total_bytes,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=f"staging {out.rstrip('/').rsplit('/', 1)[-1]}",
            disable=not show,
            file=sys.stderr,
        ) as bar:
            stager.progress = bar.update
            with on_interrupt(
                f"{cache_dir} holds only whole, checked shards; run the same command again to "
                "stage the rest"
            ):
                result = stager.run()
    except (ReaderError, OSError, StorageExtraMissingError) as exc:
        typer.echo(f"packer: error: {exc}", err=True)
        raise typer.Exit(2) from None
    for line in summary(out, result, limit):
        typer.echo(line, err=True)
    typer.echo(str(result.root))
