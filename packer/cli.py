"""The ``packer`` command: parse options -> config -> library call -> exit code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from packer.clitools import FORMAT_HELP as _FORMAT_HELP
from packer.clitools import PackerCommand, PackerGroup, refuse_urls
from packer.clitools import check_format as _format
from packer.clitools import fail as _fail
from packer.clitools import guarded as _guarded
from packer.config import usable_cores
from packer.errors import PackerError
from packer.lifecycle_cli import append, convert, dupes, merge, split
from packer.stage import stage_command
from packer.transform import DEFAULT_MAX_PIXELS
from readers import _paddle
from readers.errors import ReaderError
from readers.formats import FORMATS, REGISTRY
from readers.remote import StorageExtraMissingError, is_url

_TITLES = "/".join(fmt.title for fmt in REGISTRY.values())
_BARE_HELP = ", ".join(fmt.bare_hint for fmt in REGISTRY.values())

app = typer.Typer(
    cls=PackerGroup,
    add_completion=False,
    no_args_is_help=True,
    help=f"Pack image folders into {_TITLES} shards for fast PaddlePaddle training.",
)
_CORES = f"all usable cores, {usable_cores()} here"


def version() -> str:
    """``packer <version>``: the installed paddle-packer's, else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return f"packer {installed('paddle-packer')}"
    except PackageNotFoundError:
        from packer import __version__

        return f"packer {__version__}"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version())
        raise typer.Exit(0)


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print packer's version and exit.",
        ),
    ] = False,
) -> None:
    del show_version


@app.command(cls=PackerCommand)
def build(
    src: Annotated[
        str,
        typer.Argument(
            metavar="SRC",
            help="Directory tree of images (and label files), or a URL (s3://bucket/images/).",
        ),
    ],
    out: Annotated[
        str,
        typer.Argument(
            metavar="OUT",
            help=f"Output dataset directory (e.g. out.{FORMATS[0]}), or a URL "
            f"(s3://bucket/out.{FORMATS[0]}): published with meta.json last.",
        ),
    ],
    format: Annotated[
        str,
        typer.Option(
            "--format", "-f", metavar="|".join(FORMATS), callback=_format, help=_FORMAT_HELP
        ),
    ] = FORMATS[0],
    labels: Annotated[
        list[str] | None,
        typer.Option(
            "--labels",
            metavar="SOURCE",
            show_default="auto",
            help="auto (class folders when SRC has subfolders, else none), dirname, sidecar "
            "(a.jpg + a.txt/a.json), none, or a label file: 'path<TAB>label' / 'path label' "
            "list (PaddleOCR, PaddleClas), MXNet .lst, .jsonl or .csv manifest with path and "
            "label columns (paths relative to SRC). Repeat for several label files, merged.",
        ),
    ] = None,
    label_depth: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="With class folders: how many folder levels name the class (2: animals/cat).",
        ),
    ] = 1,
    class_map: Annotated[
        str | None,
        typer.Option(
            metavar="auto|FILE",
            help="Map text labels to class ids: auto (sorted names -> 0..k-1) or a FILE of "
            "class names (one per line, line n = id n-1; or a JSON list or name->id object).",
        ),
    ] = None,
    shard_size: Annotated[
        str,
        typer.Option(
            metavar="SIZE", help="Start a new shard past this many image bytes (1GiB, 500MB)."
        ),
    ] = "1GiB",
    workers: Annotated[
        int,
        typer.Option(
            metavar="N",
            show_default=_CORES,
            help="Processes that read and check images (at most the usable cores).",
        ),
    ] = 0,
    decode_check: Annotated[
        bool,
        typer.Option(
            "--decode-check/--no-decode-check",
            help="Decode every image once to prove it whole; without, probe headers only.",
        ),
    ] = True,
    on_error: Annotated[
        str,
        typer.Option(
            metavar="skip|fail", help="skip: list bad inputs in errors.jsonl and go on; fail: stop."
        ),
    ] = "skip",
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace OUT if it exists and is a dataset packer built (or an empty directory)."
        ),
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Keep the finished shards of an interrupted build of the same inputs and "
            "options, and build only the rest (the result is identical)."
        ),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", show_default="on a terminal", help="Progress bar."
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            metavar="local|ray",
            help="local (this machine) or ray (one Ray task per shard; needs the ray extra). "
            "The dataset is the same either way.",
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            show_default="RAY_ADDRESS, else a local Ray instance with --workers CPUs",
            help="--engine ray: the cluster to use (host:6379 or ray://host:10001). SRC and "
            "OUT's parent must be on a filesystem every node mounts at the same path.",
        ),
    ] = None,
    resize: Annotated[
        str | None,
        typer.Option(
            metavar="S|WxH",
            help="S: scale so the shorter side is S pixels; WxH: fit within. Never upscales.",
        ),
    ] = None,
    encode: Annotated[
        str,
        typer.Option(
            metavar="keep|jpeg|png|raw",
            help="keep (original bytes; same format when resized), jpeg, png, or raw "
            "(decoded pixels: no decode at training time, larger on disk).",
        ),
    ] = "keep",
    compress: Annotated[
        str,
        typer.Option(
            metavar="none|lz4|zstd",
            help="With --encode raw: store the pixels compressed, read back without an image "
            "decode (lz4: fastest to read; zstd: smaller).",
        ),
    ] = "none",
    quality: Annotated[
        int, typer.Option(metavar="1..100", help="JPEG quality for --encode jpeg.")
    ] = 95,
    max_pixels: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Refuse images whose header gives more pixels than this (width x height), "
            "before decoding them (too_many_pixels in errors.jsonl); 0: no limit but OpenCV's.",
        ),
    ] = DEFAULT_MAX_PIXELS,
    dedup: Annotated[
        bool,
        typer.Option(
            help="Skip files whose bytes equal an earlier file's (first in path order kept; "
            "duplicate_content in errors.jsonl)."
        ),
    ] = False,
) -> None:
    """Pack SRC into the dataset directory OUT (written atomically)."""
    from packer.api import BuildOptions, run_build

    if workers > usable_cores():  # BuildConfig caps it; say what is used
        typer.echo(
            f"--workers {workers}: using {usable_cores()}, the cores this process may run on "
            "(more processes would only compete for them)",
            err=True,
        )
    options = BuildOptions(
        format=format,
        labels=labels or None,
        label_depth=label_depth,
        class_map=class_map,
        shard_size=shard_size,
        workers=workers,
        decode_check=decode_check,
        on_error=on_error,
        overwrite=overwrite,
        resume=resume,
        progress=progress,
        engine=engine,
        ray_address=ray_address,
        resize=resize,
        encode=encode,
        compress=compress,
        quality=quality,
        max_pixels=max_pixels,
        dedup=dedup,
    )
    try:
        summary, upload = run_build(src, out, options, log=lambda m: typer.echo(m, err=True))
        if upload is not None:
            typer.echo(summary.line().replace(str(summary.out), "a local build"), err=True)
            typer.echo(upload.line())
            for hint in summary.hints:
                typer.echo(hint, err=True)
            return
    except (PackerError, ReaderError, StorageExtraMissingError) as exc:
        raise _fail(exc) from None
    typer.echo(summary.line())
    for hint in summary.hints:
        typer.echo(hint, err=True)


@app.command(cls=PackerCommand)
def verify(
    out: Annotated[
        str,
        typer.Argument(
            metavar="OUT",
            help=f"A packed dataset (a directory or a URL), or a bare copy of a format: "
            f"{_BARE_HELP}.",
        ),
    ],
    deep: Annotated[bool, typer.Option(help="Also decode every image and check its size.")] = False,
) -> None:
    """Check a dataset: exit 0 when intact, else print each problem and exit 1."""
    from packer.verify import verify as run_verify

    notes: list[str] = []
    if is_url(out):
        from packer.remote import verify_url

        try:
            problems = verify_url(out, deep=deep, notes=notes)
        except StorageExtraMissingError as exc:
            raise _fail(exc) from None
    else:
        problems = run_verify(Path(out), deep=deep, notes=notes)
    for line in problems:
        typer.echo(line)
    for line in notes:
        typer.echo(f"note: {line}", err=True)
    if problems:
        typer.echo(f"{out}: {len(problems)} problem{'s' if len(problems) != 1 else ''}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{out}: OK" + (" (deep)" if deep else ""))


@app.command(cls=PackerCommand)
def info(
    out: Annotated[
        str, typer.Argument(metavar="OUT", help="A packed dataset (a directory or a URL).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write one self-contained HTML page here: counts, histograms, thumbnails "
            "per class, errors and warnings, shards (no network needed to view it).",
        ),
    ] = None,
) -> None:
    """Counts, classes, label histogram, image sizes, formats and shards."""
    if html is not None:
        refuse_urls("info --html", outputs=(html,))
    from packer.info import describe, format_summary

    try:
        if is_url(out):
            from packer.remote import describe_url

            summary = describe_url(out)
        else:
            summary = describe(Path(out))
        if html is not None:
            from packer.report_html import write_html

            if is_url(out):
                raise PackerError(f"--html needs a local dataset; stage {out} first")
            write_html(Path(out), html)
    except (PackerError, ReaderError, StorageExtraMissingError) as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise _fail(PackerError(f"--html {html}: cannot write ({exc})")) from None
    typer.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))
    if html is not None:
        typer.echo(f"wrote {html}", err=True)


def _worker_list(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        from packer.errors import ConfigError

        raise ConfigError(
            f"--workers {text!r}: expected comma-separated counts such as 0,1,2,4"
        ) from None


@app.command(cls=PackerCommand)
def bench(
    out: Annotated[
        Path, typer.Argument(metavar="OUT", help=f"A packed dataset (or {_BARE_HELP}).")
    ],
    batch_size: Annotated[int, typer.Option(metavar="N", help="Samples per batch.")] = 64,
    workers: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,...",
            show_default=f"0 to the usable cores ({usable_cores()} here)",
            help="num_workers values to time, e.g. 0,2,4.",
        ),
    ] = None,
    batches: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="Batches per timed round (with --seconds: what ends first)."
        ),
    ] = None,
    seconds: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            show_default="1 when --batches is not given",  # packer.bench.DEFAULT_SECONDS
            help="Seconds per timed round.",
        ),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Timed rounds per setting at least; up to 3x as many while they disagree by "
            "more than 10%.",  # packer.bench.MIN_ROUNDS, STABLE_SPREAD
        ),
    ] = 3,
    warmup: Annotated[
        int | None,
        typer.Option(metavar="N", show_default="enough to start up", help="Batches skipped first."),
    ] = None,
    decode: Annotated[
        str,
        typer.Option(metavar="MODE", help="rgb, bgr, gray, unchanged or bytes (no decode)."),
    ] = "rgb",
    transform: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="none, resize224 (HWC uint8 224x224) or imagenet (resize 256, crop 224, "
            "CHW float32 normalised).",
        ),
    ] = "none",
    compare: Annotated[
        Path | None,
        typer.Option(
            metavar="SRC", help="The source tree OUT was built from: time its loose files too."
        ),
    ] = None,
    shared_memory: Annotated[
        bool,
        typer.Option("--shared-memory/--no-shared-memory", help="DataLoader use_shared_memory."),
    ] = True,
    prefetch_factor: Annotated[
        int, typer.Option(metavar="N", help="DataLoader prefetch_factor.")
    ] = 2,
    decode_samples: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Samples to time decoding on, and what --encode raw --compress lz4 or "
            "draft= would save (0 skips).",
        ),
    ] = 256,
    draft: Annotated[
        int, typer.Option(metavar="S", help="The shorter side draft= is costed at for JPEGs.")
    ] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Time a real paddle.io.DataLoader by num_workers and say which setting to use.

    Each setting is timed in rounds until they agree; the setting is the smallest within the
    noise of the best (5%, or the best's spread), unless the rounds never agreed: then it says
    the machine was too busy to tell.
    """
    refuse_urls("bench", out, compare)
    from packer.bench import BenchConfig, run_bench

    try:
        cfg = BenchConfig(
            path=out,
            batch_size=batch_size,
            workers=_worker_list(workers),
            batches=batches,
            seconds=seconds,
            warmup=warmup,
            decode=decode,
            transform=transform,
            compare=compare,
            shared_memory=shared_memory,
            prefetch_factor=prefetch_factor,
            decode_samples=decode_samples,
            draft=draft,
            rounds=rounds,
        )
        report = run_bench(cfg, log=None if as_json else lambda m: typer.echo(m, err=True))
    except (PackerError, ReaderError) as exc:
        raise _fail(exc) from None
    except ModuleNotFoundError as exc:
        if not _paddle.is_paddle_missing(exc):
            raise
        raise _fail(_paddle.PaddleMissingError()) from None
    typer.echo(report.json() if as_json else report.text())


app.command(name="stage", cls=PackerCommand)(stage_command)
for _command in (convert, append, merge, split, dupes):
    app.command(cls=PackerCommand)(_command)
for _info in app.registered_commands:  # an unreachable object store: one line, not a traceback
    _info.callback = _guarded(_info.callback) if _info.callback else None


def main() -> None:
    """Console-script entry point."""
    app(prog_name="packer")


if __name__ == "__main__":  # pragma: no cover
    main()
