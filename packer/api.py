"""``packer.build(src, out, **options)``: the command line's build as a function.

`BuildOptions` holds the options of ``packer build`` by their command-line names (``format``,
``labels``, ``shard_size``, ...) with the command line's defaults; `BuildOptions.config` turns
them into a validated `BuildConfig`, with the same checks and messages as the command line,
which calls the same code (`run_build`). A user's mistake raises a `packer.errors.PackerError`.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.config import BuildConfig, parse_size, usable_cores
from packer.errors import ConfigError
from packer.transform import DEFAULT_MAX_PIXELS, Transform, parse_resize
from readers.formats import FORMATS

if TYPE_CHECKING:
    from packer.build import BuildSummary
    from packer.publish import UploadResult

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class BuildOptions:
    """The options of ``packer build``, named and defaulted as on the command line.

    ``shard_size`` is a size text (``"1GiB"``) or a byte count; ``workers=0`` means every
    usable core; ``labels`` is one source or several label files; ``resize`` is ``"S"``,
    ``"WxH"``, an int S or a ``(W, H)`` pair; ``max_pixels`` 0 or None means no limit but
    OpenCV's; ``progress`` None shows a bar when stderr is a terminal.
    """

    format: str = FORMATS[0]
    labels: PathLike | Sequence[PathLike] | None = None
    label_depth: int = 1
    class_map: PathLike | None = None
    shard_size: str | int = "1GiB"
    workers: int = 0
    decode_check: bool = True
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
    progress: bool | None = None
    engine: str = "local"
    ray_address: str | None = None
    resize: str | int | tuple[int, int] | None = None
    encode: str = "keep"
    compress: str = "none"
    quality: int = 95
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    dedup: bool = False

    @classmethod
    def from_keywords(cls, options: dict[str, Any]) -> BuildOptions:
        """The options given as keywords, each checked for its name and type.

        Raises:
            ConfigError: an unknown option (the closest name is suggested), or a value of the
                wrong type.
        """
        names = [f.name for f in fields(cls)]
        for name, value in options.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]}=?" if close else ""
                raise ConfigError(
                    f"{name}={value!r}: not an option of packer build (options: "
                    f"{', '.join(names)}){hint}"
                )
            expected = _TYPES[name]
            if not _has_type(value, expected):
                kinds = " or ".join("None" if t is type(None) else t.__name__ for t in expected)
                raise ConfigError(f"{name}={value!r}: expected {kinds}")
        return cls(**options)

    def shard_bytes(self) -> int:
        """``shard_size`` in bytes.

        Raises:
            ConfigError: the text is not a size.
        """
        size = self.shard_size
        return parse_size(size) if isinstance(size, str) else size

    def worker_count(self) -> int:
        """The processes asked for: ``workers``, or every usable core for 0."""
        return self.workers or usable_cores()

    def transform(self) -> Transform:
        """The pack-time transform these options ask for.

        Raises:
            ConfigError: a bad ``resize``, ``encode``, ``compress``, ``quality`` or
                ``max_pixels``.
        """
        resize = self.resize
        if isinstance(resize, tuple):
            resize = "x".join(str(int(side)) for side in resize)
        try:
            short, fit = parse_resize(None if resize is None else str(resize))
            return Transform(
                short=short,
                fit=fit,
                encode=self.encode,
                quality=self.quality,
                max_pixels=self.max_pixels or None,
                compress=self.compress,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def config(self, src: PathLike, out: PathLike) -> BuildConfig:
        """The validated `BuildConfig` of a build of local `src` into local `out`.

        Raises:
            ConfigError: an option is invalid (the command line's message), or SRC is missing.
            LabelSourceError: ``labels`` names no source.
        """
        labels = self.labels
        specs: str | tuple[str, ...]
        if labels is None:
            specs = "auto"
        elif isinstance(labels, (str, os.PathLike)):
            specs = os.fspath(labels)
        else:
            specs = tuple(os.fspath(s) for s in labels) or "auto"
        return BuildConfig(
            src=Path(src),
            out=Path(out),
            format=self.format,
            labels=specs,
            label_depth=self.label_depth,
            class_map=None if self.class_map is None else os.fspath(self.class_map),
            shard_size=self.shard_bytes(),
            workers=self.worker_count(),
            decode_check=self.decode_check,
            on_error=self.on_error,
            overwrite=self.overwrite,
            resume=self.resume,
            progress=self.progress,
            engine=self.engine,
            ray_address=self.ray_address,
            transform=self.transform(),
            dedup=self.dedup,
        )


_NONE = type(None)
_TYPES: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "labels": (str, os.PathLike, list, tuple, _NONE),
    "label_depth": (int,),
    "class_map": (str, os.PathLike, _NONE),
    "shard_size": (str, int),
    "workers": (int,),
    "decode_check": (bool,),
    "on_error": (str,),
    "overwrite": (bool,),
    "resume": (bool,),
    "progress": (bool, _NONE),
    "engine": (str,),
    "ray_address": (str, _NONE),
    "resize": (str, int, tuple, _NONE),
    "encode": (str,),
    "compress": (str,),
    "quality": (int,),
    "max_pixels": (int, _NONE),
    "dedup": (bool,),
}


def _has_type(value: Any, expected: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in expected:
        return False  # True is an int to Python, not a count to a user
    return isinstance(value, expected)


def run_build(
    src: PathLike,
    out: PathLike,
    options: BuildOptions,
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[BuildSummary, UploadResult | None]:
    """Build `src` into `out` as ``packer build`` does, URLs included; what the CLI runs.

    Returns:
        The build's summary and, when OUT is a URL, what the upload did.

    Raises:
        PackerError: a user's mistake or a bad input (see `packer.build.build`).
    """
    from packer.build import build as run
    from readers.remote import is_url

    say = log or (lambda msg: print(msg, file=sys.stderr))
    src_text, out_text = os.fspath(src), os.fspath(out)
    if is_url(src_text) or is_url(out_text):
        from packer.remote import build_remote

        return build_remote(
            src_text,
            out_text,
            lambda s, o: run(options.config(s, o), log=say),
            src_is_url=is_url(src_text),
            out_is_url=is_url(out_text),
            overwrite=options.overwrite,
            resume=options.resume,
            log=say,
        )
    return run(options.config(src, out), log=say), None


def build(
    src: PathLike, out: PathLike, *, log: Callable[[str], None] | None = None, **options: Any
) -> BuildSummary:
    """Pack the image tree `src` into the dataset `out`, as ``packer build SRC OUT`` does.

    Args:
        src: the directory of images (and label files), or a URL (``s3://...``).
        out: the dataset directory to write (or a URL): it appears only when complete.
        log: where progress lines go (default: stderr).
        **options: the command line's options by name: ``format``, ``labels``,
            ``label_depth``, ``class_map``, ``shard_size`` (``"1GiB"`` or bytes), ``workers``,
            ``decode_check``, ``on_error``, ``overwrite``, ``resume``, ``progress``,
            ``engine``, ``ray_address``, ``resize``, ``encode``, ``compress``, ``quality``,
            ``max_pixels``, ``dedup`` (see `BuildOptions`).

    Returns:
        What the build did (`BuildSummary`); with an OUT URL, the upload line goes to `log`.

    Raises:
        ConfigError: an unknown option or a bad value (the command line's message).
        PackerError: any other user's mistake or bad input, as the command line reports it.
    """
    summary, upload = run_build(src, out, BuildOptions.from_keywords(options), log=log)
    if upload is not None:
        (log or (lambda msg: print(msg, file=sys.stderr)))(upload.line())
    return summary
