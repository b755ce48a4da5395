"""What every ``packer`` command module shares: the error exit, the --format check and help.

`PackerCommand` and `PackerGroup` write the ``--help`` pages: arguments by their metavar
(``SRC``, ``OUT``), options as ``--name METAVAR`` with their default, without the type tags
(``<str>``, ``<bool>``) and braces (``{src}``) that typer's own help shows.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

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


# An option declared without a metavar is shown by the type of its default.
_METAVAR_BY_TYPE = {int: "N", float: "NUM"}


def _argument_name(param: Any) -> str:
    name = str(param.metavar or (param.name or "").upper())
    return name + "..." if param.nargs == -1 else name


def _option_default(param: Any) -> str | None:
    """The ``[default: ...]`` text of an option, or None to show none."""
    shown = getattr(param, "show_default", None)
    if isinstance(shown, str):
        return shown
    if shown is False or param.default is None or getattr(param, "is_flag", False):
        # a flag is off unless given; a flag pair that is on says so in its help
        return param.opts[0] if getattr(param, "is_flag", False) and param.default else None
    if isinstance(param.default, (list, tuple)):
        return ", ".join(map(str, param.default)) or None
    return str(param.default)


def _option_row(param: Any) -> tuple[str, str]:
    names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))  # -f, --format
    first = ", ".join(names)
    if getattr(param, "is_flag", False):
        if param.secondary_opts:
            first += " / " + ", ".join(param.secondary_opts)
    else:
        meta = param.metavar or _METAVAR_BY_TYPE.get(type(param.default), "TEXT")
        first += f" {meta}"
    text = param.help or ""
    default = _option_default(param)
    if default is not None:
        text = f"{text}  [default: {default}]" if text else f"[default: {default}]"
    if param.required:
        text = f"{text}  [required]" if text else "[required]"
    return first, text


def _visible(command: Any, ctx: Any, kind: str) -> Iterator[Any]:
    for param in command.get_params(ctx):
        if param.param_type_name == kind and not getattr(param, "hidden", False):
            yield param


def _write_options(command: Any, ctx: Any, formatter: Any) -> None:
    rows = [_option_row(p) for p in _visible(command, ctx, "option")]
    if rows:
        with formatter.section("Options"):
            formatter.write_dl(rows, col_max=34)


class PackerCommand(TyperCommand):
    """A typer command whose usage line and ``--help`` show metavars and defaults only."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``[OPTIONS] SRC OUT [OTHERS...]``: arguments by name, optional ones in brackets."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in _visible(self, ctx, "argument"):
            name = _argument_name(param)
            pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, the command's text, its arguments and its options, as plain text."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        rows = [(_argument_name(p), p.help or "") for p in _visible(self, ctx, "argument")]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows, col_max=34)
        _write_options(self, ctx, formatter)
        self.format_epilog(ctx, formatter)


class PackerGroup(TyperGroup):
    """The ``packer`` group: its ``--help`` lists its options and commands as plain text."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Print the help and exit 2 when no command is given.

        typer prints that help only when its own rich formatter writes it.
        """
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())
            ctx.exit(2)
        return list(super().parse_args(ctx, args))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, the tool's text, its options and one line per command."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        _write_options(self, ctx, formatter)
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=formatter.width - 14)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
