"""What every ``packer`` command module shares: the error exit and the --format check."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from readers.formats import FORMATS, REGISTRY

FORMAT_HELP = "; ".join(f"{fmt.name}: {fmt.summary}" for fmt in REGISTRY.values()) + "."


def fail(exc: Exception | str) -> typer.Exit:
    """Print `exc` as a ``packer: error:`` line and return the exit (code 2) to raise."""
    typer.echo(f"packer: error: {exc}", err=True)
    return typer.Exit(2)


def check_format(value: str) -> str:
    """Refuse a --format that is not registered, before anything runs."""
    if value not in REGISTRY:
        raise typer.BadParameter(f"--format {value!r}: expected one of {', '.join(FORMATS)}")
    return value


def guarded(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command`, with an object store that cannot serve its URL told in one line (exit 2).

    A Ctrl-C ends it with one ``packer: interrupted: ...`` line (exit 130): see `interrupted`.

    A failure anywhere in a command whose chain says the store is unreachable, not S3, or lacks
    the bucket (`readers.remote.errors.storage_failure`) prints ``packer: error: ...`` naming
    the URL (no credentials) instead of a traceback; any other exception keeps its traceback.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            raise interrupted(exc) from None
        except Exception as exc:
            from readers.remote import is_url
            from readers.remote.errors import StorageUnreachableError, storage_failure

            urls = [v for v in [*args, *kwargs.values()] if isinstance(v, str) and is_url(v)]
            error = exc if isinstance(exc, StorageUnreachableError) else None
            error = error or storage_failure(exc, urls[0] if urls else "object storage")
            if error is None:
                raise
            raise fail(error) from None

    return run


_UNCHANGED = "nothing was written or changed"
"""What a Ctrl-C leaves when the command does not say more (`packer.feedback.Interrupted`)."""


def interrupted(exc: KeyboardInterrupt) -> typer.Exit:
    """Print what a Ctrl-C left as one line; return the exit (130) to raise.

    `exc` is a `packer.feedback.Interrupted` where the command knows what it kept (finished
    shards for ``--resume``); otherwise nothing was kept.
    """
    from packer.feedback import Interrupted

    kept = exc.kept if isinstance(exc, Interrupted) else _UNCHANGED
    # on a terminal, over a progress bar that the interruption left half drawn
    start = "\r\x1b[K" if sys.stderr.isatty() else ""
    typer.echo(f"{start}packer: interrupted: {kept}", err=True)
    return typer.Exit(130)


def refuse_urls(command: str, *inputs: object, outputs: tuple[object, ...] = ()) -> None:
    """Exit 2 when a path of `command` is a URL: it takes local datasets only (nothing made).

    Typer hands such an argument over as a `pathlib.Path`, which folds ``s3://b/x`` into
    ``s3:/b/x``; that is recognised and shown as the URL.
    """
    for path in [*inputs, *outputs]:
        scheme, sep, rest = str(path).partition(":/")
        if not sep or len(scheme) < 2 or not scheme.replace("+", "").replace("-", "").isalnum():
            continue
        url = f"{scheme}://{rest.lstrip('/')}"
        if path in outputs:
            raise fail(
                f"{command} does not write to URLs yet ({url}); give a local path (only "
                "packer build publishes to object storage)"
            )
        raise fail(
            f"{command} does not take URLs yet ({url}); stage it first: packer stage {url} "
            f"DIR, then run packer {command} on DIR"
        )
