"""Import paddle with an error that says how to install it, naming both builds.

packer does not depend on a paddle build: ``paddlepaddle`` (CPU) and ``paddlepaddle-gpu`` both
install the ``paddle`` package, so a hard dependency on one would overwrite the other on a
user's machine. The build is chosen with an extra (``pip install '.[cpu]'`` or ``'.[gpu]'`` from
a clone or a wheel) or installed by the user beforehand, as PaddleOCR and PaddleClas do.

`open_for_bytes` is how packer's commands that read stored bytes (``packer dupes``, ``packer
info --html``) open a dataset, with or without paddle.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

INSTALL_HINT = (
    "PaddlePaddle is not installed, and the readers (and `packer bench`) need it. "
    "Install one build: `pip install paddlepaddle` (CPU) or, on a GPU machine, "
    "`pip install paddlepaddle-gpu` (or the build for your CUDA version from "
    "paddlepaddle.org.cn); from a clone of packer, `pip install '.[cpu]'` does the first. "
    "Every other packer command works without it."
)

_T = TypeVar("_T")


class PaddleMissingError(ModuleNotFoundError):
    """paddle cannot be imported; the message says how to install it."""

    def __init__(self) -> None:
        super().__init__(INSTALL_HINT, name="paddle")


def is_paddle_missing(exc: BaseException) -> bool:
    """Whether `exc` is the failure to import paddle itself (not a module paddle imports)."""
    return isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "paddle"


def import_paddle() -> Any:
    """``import paddle``, raising PaddleMissingError when no paddle build is installed."""
    try:
        import paddle
    except ModuleNotFoundError as exc:
        if is_paddle_missing(exc):
            raise PaddleMissingError from None
        raise
    return paddle


class _StandInDataset(Generic[_T]):
    """In place of ``paddle.io.Dataset`` (a base class with nothing to inherit) without paddle."""


@contextlib.contextmanager
def _paddle_stand_in() -> Iterator[None]:
    """``paddle.io.Dataset`` as a plain base class while the block runs, without paddle.

    The datasets subclass ``paddle.io.Dataset`` for DataLoader's sake only; opening one and
    reading and decoding its samples in this process does not touch paddle. The stand-in is in
    ``sys.modules`` only during the block, and the dataset modules imported in it are dropped
    from it afterwards, so a later ``import paddle`` or ``readers.LmdbDataset`` still fails
    with `INSTALL_HINT`.
    """
    stand_in = types.ModuleType("paddle")
    stand_in_io = types.ModuleType("paddle.io")
    stand_in_io.Dataset = _StandInDataset  # type: ignore[attr-defined]
    stand_in.io = stand_in_io  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name, _ABSENT) for name in ("paddle", "paddle.io")}
    before = set(sys.modules)
    sys.modules.update({"paddle": stand_in, "paddle.io": stand_in_io})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is _ABSENT:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name in set(sys.modules) - before:
            if name == "readers.datasets" or name.startswith("readers.datasets."):
                del sys.modules[name]
        if "readers.datasets" not in sys.modules:
            vars(sys.modules["readers"]).pop("datasets", None)


_ABSENT: Any = object()


def open_for_bytes(path: str | os.PathLike[str], **options: Any) -> Any:
    """``open_dataset(path, decode="bytes", **options)``, whether paddle is installed or not.

    For reading stored bytes and decoding them in this process (``read_bytes``,
    ``decode_stored``); without paddle the dataset is no ``paddle.io.Dataset`` and no
    DataLoader can take it.
    """
    try:
        from readers.datasets import open_dataset
    except ModuleNotFoundError as exc:
        if not is_paddle_missing(exc):
            raise
    else:
        return open_dataset(path, decode="bytes", **options)
    with _paddle_stand_in():
        module = importlib.import_module("readers.datasets")
        return module.open_dataset(path, decode="bytes", **options)
