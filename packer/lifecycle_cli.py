"""The dataset-lifecycle commands of ``packer``: convert, append, merge, split and dupes.

Thin typer commands over `packer.convert`, `packer.append`, `packer.regroup` and
`packer.dupes`; `packer.cli` registers them on its app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from packer.clitools import FORMAT_HELP as _FORMAT_HELP
from packer.clitools import check_format as _format
from packer.clitools import fail as _fail
from packer.clitools import refuse_urls
from packer.config import parse_size, usable_cores
from packer.errors import ConfigError, DatasetMissingError, PackerError
from readers.errors import ReaderError
from readers.formats import FORMATS

_OUTS = "OUT's own"  # append: an option not given is the one OUT was built with


def _size(text: str) -> int:
    """A ``--shard-size`` value in bytes, which must be a size above 0.

    Raises:
        ConfigError: not a size, or not above 0; the message names the option.
    """
    try:
        size = parse_size(text)
    except ConfigError as exc:
        raise ConfigError(f"--shard-size {text!r}: {exc}") from None
    if size < 1:
        raise ConfigError(f"--shard-size {text!r}: expected a size > 0, e.g. 1GiB")
    return size


def convert(
    src: Annotated[
        list[Path],
        typer.Argument(
            metavar="IN",
            help="A packer dataset, a bare PaddleOCR-layout LMDB, a bare .rec/.idx pair "
            "(InsightFace's header record is skipped), a directory of WebDataset .tar shards, "
            "or Parquet files or a directory of them (the Hugging Face datasets layout).",
        ),
    ],
    out: Annotated[
        Path, typer.Argument(metavar="OUT", help="The dataset (or export) directory to write.")
    ],
    format: Annotated[
        str,
        typer.Option(
            metavar="|".join(FORMATS),
            callback=_format,
            help=f"Shard format (--to packer). {_FORMAT_HELP}",
        ),
    ] = FORMATS[0],
    to: Annotated[
        str,
        typer.Option(
            metavar="packer|webdataset|folder",
            help="packer (a dataset), webdataset (%06d.tar shards) or folder (class folders, "
            "or images/ + labels.txt when labels are not class ids).",
        ),
    ] = "packer",
    shard_size: Annotated[
        str, typer.Option(metavar="SIZE", help="Target shard size, e.g. 1GiB.")
    ] = "1GiB",
    decode_check: Annotated[
        bool,
        typer.Option(
            "--decode-check/--no-decode-check",
            help="Decode each record of a bare IN once to prove it (else: headers only).",
        ),
    ] = True,
    on_error: Annotated[str, typer.Option(metavar="skip|fail", help="skip or fail.")] = "skip",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing OUT.")] = False,
    resume: Annotated[
        bool, typer.Option(help="Keep the finished shards of an interrupted convert.")
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", show_default="on a terminal", help="Progress bar."
        ),
    ] = None,
    image_column: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            show_default="the one binary or bytes-and-path column",
            help="Parquet IN: the column of encoded images (binary, or a struct with bytes and "
            "path fields as the datasets Image feature stores it).",
        ),
    ] = None,
    label_column: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            show_default="the one other column, if any",
            help="Parquet IN: the label column; repeat it for a JSON object label of several.",
        ),
    ] = None,
) -> None:
    """Convert IN to packer's format (or export it) keeping the stored bytes and labels.

    Several INs are Parquet files (or directories of them), converted as one dataset in order.
    """
    refuse_urls("convert", *src, outputs=(out,))
    from packer.convert import ConvertConfig
    from packer.convert import convert as run_convert

    try:
        cfg = ConvertConfig(
            src=tuple(src),
            out=out,
            format=format,
            to=to,
            shard_size=_size(shard_size),
            decode_check=decode_check,
            on_error=on_error,
            overwrite=overwrite,
            resume=resume,
            progress=progress,
            image_column=image_column,
            label_columns=tuple(label_column or ()),
        )
        summary = run_convert(cfg)
    except (PackerError, ReaderError) as exc:
        raise _fail(exc) from None
    typer.echo(summary.line())


def append(
    out: Annotated[
        Path,
        typer.Argument(metavar="OUT", help="The packed dataset to add to (changed in place)."),
    ],
    src: Annotated[Path, typer.Argument(metavar="SRC", help="Directory tree of the new images.")],
    labels: Annotated[
        list[str] | None,
        typer.Option(metavar="SOURCE", show_default=_OUTS, help="As for build."),
    ] = None,
    label_depth: Annotated[
        int | None, typer.Option(metavar="N", show_default=_OUTS, help="As for build.")
    ] = None,
    class_map: Annotated[
        str,
        typer.Option(
            metavar="keep|grow",
            help="keep: a class name OUT lacks is an error; grow: new names get the next ids "
            "after OUT's (old ids never change).",
        ),
    ] = "keep",
    shard_size: Annotated[
        str | None, typer.Option(metavar="SIZE", show_default=_OUTS, help="As for build.")
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            metavar="N",
            show_default=f"all usable cores, {usable_cores()} here",
            help="As for build.",
        ),
    ] = 0,
    decode_check: Annotated[
        bool | None,
        typer.Option("--decode-check/--no-decode-check", show_default=_OUTS, help="As for build."),
    ] = None,
    on_error: Annotated[
        str | None, typer.Option(metavar="skip|fail", show_default=_OUTS, help="skip or fail.")
    ] = None,
    resize: Annotated[
        str | None, typer.Option(metavar="S|WxH", show_default=_OUTS, help="As for build.")
    ] = None,
    encode: Annotated[
        str | None,
        typer.Option(metavar="keep|jpeg|png|raw", show_default=_OUTS, help="As for build."),
    ] = None,
    quality: Annotated[
        int | None, typer.Option(metavar="1..100", show_default=_OUTS, help="As for build.")
    ] = None,
    max_pixels: Annotated[
        int | None, typer.Option(metavar="N", show_default=_OUTS, help="As for build.")
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", show_default="on a terminal", help="Progress bar."
        ),
    ] = None,
) -> None:
    """Add SRC's images to OUT as new shards, atomically (existing ids and bytes stay).

    OUT is the old or the new dataset at every moment.
    """
    refuse_urls("append", src, outputs=(out,))
    from packer.append import append as run_append
    from packer.append import append_config, read_dataset

    try:
        cfg = append_config(
            out,
            src,
            read_dataset(out),
            labels=tuple(labels) if labels else None,
            label_depth=label_depth,
            shard_size=_size(shard_size) if shard_size is not None else None,
            workers=workers or usable_cores(),
            decode_check=decode_check,
            on_error=on_error,
            progress=progress,
            resize=resize,
            encode=encode,
            quality=quality,
            max_pixels=max_pixels,
        )
        summary = run_append(cfg, class_map=class_map)
    except PackerError as exc:
        raise _fail(exc) from None
    typer.echo(summary.line())


def merge(
    out: Annotated[Path, typer.Argument(metavar="OUT", help="The dataset to write.")],
    sources: Annotated[
        list[Path], typer.Argument(metavar="SRC", help="Two or more datasets of one format.")
    ],
    shard_size: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Plan new shards of this size (default: keep the sources' shards, hard-linking "
            "those whose bytes stay the same).",
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it is a packer dataset.")] = False,
    resume: Annotated[
        bool, typer.Option(help="Keep the finished shards of an interrupted run.")
    ] = False,
) -> None:
    """Write one dataset from several of the same format, records copied without decoding.

    Class names are united (ids remapped, each source's map in meta.json); a source shard
    whose bytes stay the same is hard-linked, not copied.
    """
    refuse_urls("merge", *sources, outputs=(out,))
    from packer.regroup import merge_datasets

    try:
        summary = merge_datasets(
            out,
            sources,
            shard_size=_size(shard_size) if shard_size is not None else None,
            overwrite=overwrite,
            resume=resume,
        )
    except (PackerError, ReaderError) as exc:
        raise _fail(exc) from None
    typer.echo(summary.line())


def _no_positional_parts(value: list[str] | None) -> None:
    """Refuse parts given as a third argument: ``--into`` is the one way to give them."""
    if value:
        raise _fail(
            f"split takes OUT and DIR only (got {' '.join(value)!r} too); give the parts with "
            "--into, e.g. packer split OUT DIR --into train=0.9,val=0.1"
        )


def split(
    out: Annotated[Path, typer.Argument(metavar="OUT", help="The dataset to split (read only).")],
    into: Annotated[
        Path, typer.Argument(metavar="DIR", help="Directory to write DIR/<part> into.")
    ],
    parts: Annotated[
        str,
        typer.Option("--into", metavar="NAME=FRACTION,...", help="The parts: train=0.9,val=0.1."),
    ],
    extra: Annotated[
        list[str] | None,
        typer.Argument(hidden=True, callback=_no_positional_parts, show_default=False),
    ] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="The same seed gives the same parts.")] = 0,
    stratify: Annotated[bool, typer.Option(help="Each label split by the fractions.")] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Replace parts that are packer datasets.")
    ] = False,
) -> None:
    """Write DIR/train, DIR/val, ... as disjoint datasets that together hold all of OUT.

    Records are copied without decoding.
    """
    del extra  # refused by its callback
    refuse_urls("split", out, outputs=(into,))
    from packer.regroup import parse_fractions, split_dataset

    try:
        summaries = split_dataset(
            out, into, parse_fractions(parts), seed=seed, stratify=stratify, overwrite=overwrite
        )
    except (PackerError, ReaderError) as exc:
        raise _fail(exc) from None
    for summary in summaries.values():
        typer.echo(summary.line())


def dupes(
    out: Annotated[Path, typer.Argument(metavar="OUT", help="A packed dataset.")],
    others: Annotated[
        list[Path] | None,
        typer.Argument(metavar="OTHER", help="More packed datasets (e.g. val, test)."),
    ] = None,
    near: Annotated[
        bool,
        typer.Option(
            help="Also group resized or re-encoded copies (a perceptual hash; decodes every "
            "image once, small)."
        ),
    ] = False,
    threshold: Annotated[
        int,
        typer.Option(
            metavar="0..8",
            help="--near: the most pHash bits a candidate pair may differ in (0..8); "
            "each candidate is then confirmed on pixels.",
        ),
    ] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """List groups of identical images within and across datasets, leakage first.

    Groups that cross datasets come first, then groups whose labels conflict.
    """
    refuse_urls("dupes", out, *(others or []))
    from packer.dupes import find_dupes
    from packer.nearhash import MAX_RADIUS

    if not 0 <= threshold <= MAX_RADIUS:
        raise _fail(ConfigError(f"--threshold {threshold}: expected 0..{MAX_RADIUS}"))
    try:
        for path in [out, *(others or [])]:
            if not path.exists() and not path.is_symlink():
                raise DatasetMissingError("dataset", str(path))
        report = find_dupes([out, *(others or [])], near=near, threshold=threshold)
    except (PackerError, ReaderError) as exc:
        raise _fail(exc) from None
    typer.echo(
        json.dumps(report.as_json(), indent=2, ensure_ascii=False) if as_json else report.text()
    )
