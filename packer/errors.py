"""PackerError and its subclasses: problems a user can fix, printed without a traceback.

Every `PackerError` is reachable here (``packer.errors.<Name>``, listed in ``__all__``): those
defined beside the code that raises them are imported from their module when first asked for,
so that this module, which every other imports, stays free of import cycles.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packer.convert import ConvertInputError
    from packer.dupes import NotPackedError
    from packer.engines import EngineError
    from packer.labels.classmap import ClassGrowthError
    from packer.mirror import RemoteSourceError
    from packer.parquet_source import ParquetInputError
    from packer.plan import OutputDiffersError
    from packer.publish import StoreUnreachableError, UploadError
    from packer.report_html import HtmlTargetError
    from packer.swap import ExchangeUnsupportedError
    from packer.writers.recordio import RecordTooLargeForShardError

# the errors defined beside the code that raises them: name -> module
_ELSEWHERE = {
    "ClassGrowthError": "packer.labels.classmap",
    "ConvertInputError": "packer.convert",
    "EngineError": "packer.engines",
    "ExchangeUnsupportedError": "packer.swap",
    "HtmlTargetError": "packer.report_html",
    "NotPackedError": "packer.dupes",
    "OutputDiffersError": "packer.plan",
    "ParquetInputError": "packer.parquet_source",
    "RecordTooLargeForShardError": "packer.writers.recordio",
    "RemoteSourceError": "packer.mirror",
    "StoreUnreachableError": "packer.publish",
    "UploadError": "packer.publish",
}

__all__ = [
    "BuildLockedError",
    "ClassGrowthError",
    "ConfigError",
    "ConvertInputError",
    "DatasetMissingError",
    "DiskFullError",
    "EngineError",
    "ExchangeUnsupportedError",
    "HtmlTargetError",
    "InputError",
    "LabelSourceError",
    "NotADatasetError",
    "NotPackedError",
    "OutputDiffersError",
    "OutputExistsError",
    "OutputParentError",
    "PackerError",
    "ParquetInputError",
    "RecordTooLargeForShardError",
    "RemoteSourceError",
    "SampleTypeError",
    "StoreUnreachableError",
    "UnsafeOutputError",
    "UploadError",
    "WriterStateError",
]


def __getattr__(name: str) -> Any:
    """An error defined in another module (`_ELSEWHERE`), imported when first asked for."""
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class PackerError(Exception):
    """An error the user can fix; the CLI prints it without a traceback."""


class ConfigError(PackerError):
    """A command-line option or build setting is invalid."""


class OutputExistsError(PackerError):
    """OUT already exists and ``--overwrite`` was not given."""

    def __init__(self, out: str) -> None:
        if os.path.isfile(out):  # --overwrite would not replace it either
            super().__init__(
                f"{out} already exists and is a file, not a dataset directory; choose another "
                "OUT (or remove the file)"
            )
            return
        super().__init__(
            f"{out} already exists; pass --overwrite to replace it, or choose another OUT"
        )


class InputError(PackerError):
    """One input was bad and ``--on-error fail`` asked to stop."""

    def __init__(self, path: str, reason: str, message: str) -> None:
        super().__init__(
            f"{path}: {message} [{reason}]; nothing was written. Use --on-error skip to pack "
            "the rest and list it in errors.jsonl"
        )
        self.path = path
        self.reason = reason


class LabelSourceError(PackerError):
    """A label file or label option cannot be used at all."""


class DiskFullError(PackerError):
    """The disk filled up during a build; the finished shards are kept for ``--resume``."""

    def __init__(self, build_dir: str, detail: str) -> None:
        super().__init__(
            f"the disk is full ({detail}); nothing was published. The finished shards are "
            f"kept in {build_dir}: free some space and run the same command with --resume "
            "(or delete that directory)"
        )


class BuildLockedError(PackerError):
    """Another build of the same OUT holds its lock."""

    def __init__(self, out: str, holder: str) -> None:
        super().__init__(
            f"{out} is being built by {holder} right now; wait for it to finish (two builds of "
            "one OUT would write into the same build directory)"
        )


class UnsafeOutputError(PackerError):
    """OUT overlaps an input: SRC, a label file, or the build directory next to OUT."""


class NotADatasetError(PackerError):
    """``--overwrite`` was asked to replace something that is not a dataset packer built."""

    def __init__(self, out: str, found: str, fix: str | None = None) -> None:
        fix = fix or f"remove {out} yourself if it should go, or choose another OUT"
        super().__init__(
            f"{out} {found}; --overwrite replaces only a dataset written by packer (a directory "
            f"with packer's meta.json) or an empty directory: {fix}"
        )
        self.out = out


class DatasetMissingError(PackerError):
    """A dataset (or source directory) that a command reads does not exist."""

    def __init__(self, role: str, path: str, hint: str = "") -> None:
        super().__init__(f"{role} {path} does not exist" + (f"; {hint}" if hint else ""))
        self.path = path


class OutputParentError(PackerError):
    """OUT's parent directory is unusable.

    It is missing and cannot be made, is not a directory, or is not writable.
    """

    def __init__(self, out: str, problem: str) -> None:
        super().__init__(
            f"cannot write OUT {out}: {problem}; choose an OUT in a writable directory, or fix "
            "that directory"
        )
        self.out = out


class SampleTypeError(PackerError, TypeError):
    """``Writer.add`` was given an image or a label of a kind it cannot store."""


class WriterStateError(PackerError):
    """A `packer.Writer` was used after it was closed or aborted."""
