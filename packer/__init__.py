"""packer: turn a directory tree of images and labels into LMDB or RecordIO shards.

The Python API: ``packer.build(src, out, **options)`` (the command line's build),
``packer.Writer(out, ...)`` (a dataset written sample by sample), `BuildSummary`, and
``packer.errors`` (every `PackerError`). They are imported when first used, so that
``import packer`` (and the ``packer`` command) starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["BuildSummary", "PackerError", "Writer", "build", "errors"]

if TYPE_CHECKING:
    from packer import errors
    from packer.api import build
    from packer.build import BuildSummary
    from packer.errors import PackerError
    from packer.writer import Writer

# public name -> (module, attribute; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "BuildSummary": ("packer.build", "BuildSummary"),
    "PackerError": ("packer.errors", "PackerError"),
    "Writer": ("packer.writer", "Writer"),
    # the module packer.build, which is callable: packer.build(src, out, **options) runs
    # packer.api.build (a submodule import would replace a function of that name here)
    "build": ("packer.build", None),
    "errors": ("packer.errors", None),
}


def __getattr__(name: str) -> Any:
    """A public name of `__all__`, imported on first use."""
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(found[0])
    return module if found[1] is None else getattr(module, found[1])


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
