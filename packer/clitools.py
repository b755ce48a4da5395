"""What every ``packer`` command module shares: the error exit and the --format check."""

from __future__ import annotations

import typer

from readers.formats import FORMATS, REGISTRY

FORMAT_HELP = "; ".join(f"{fmt.name}: {fmt.summary}" for fmt in REGISTRY.values()) + "."


def fail(exc: Exception) -> typer.Exit:
    """Print `exc` as a ``packer: error:`` line and return the exit (code 2) to raise."""
    typer.echo(f"packer: error: {exc}", err=True)
    return typer.Exit(2)


def check_format(value: str) -> str:
    """Refuse a --format that is not registered, before anything runs."""
    if value not in REGISTRY:
        raise typer.BadParameter(f"--format {value!r}: expected one of {', '.join(FORMATS)}")
    return value
