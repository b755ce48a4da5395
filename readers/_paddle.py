"""Import paddle with an error that says how to install it, naming both builds.

packer does not depend on a paddle build: ``paddlepaddle`` (CPU) and ``paddlepaddle-gpu`` both
install the ``paddle`` package, so a hard dependency on one would overwrite the other on a
user's machine. The build is chosen with an extra (``paddle-packer[cpu]`` or ``[gpu]``) or
installed by the user beforehand, as PaddleOCR and PaddleClas do.
"""

from __future__ import annotations

from typing import Any

INSTALL_HINT = (
    "PaddlePaddle is not installed, and the readers (and `packer bench`) need it. "
    "Install one build: `pip install 'paddle-packer[cpu]'` (the CPU package paddlepaddle) or, "
    "on a GPU machine, `pip install 'paddle-packer[gpu]'` (paddlepaddle-gpu; or the build for "
    "your CUDA version from paddlepaddle.org.cn). Packing (`packer build`, `verify`, `info`, "
    "`stage`) works without it."
)


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
