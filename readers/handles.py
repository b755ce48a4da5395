"""The old import path of :mod:`readers.io.handles`.

It is kept for format code and users' scripts (``handles.close_all()``); new code imports
``readers.io.handles``.
"""

from __future__ import annotations

from readers.io.handles import (
    close_all,
    open_mmap_readonly,
    shared_fd,
    shared_handle,
    shared_mmap,
)

__all__ = ["close_all", "open_mmap_readonly", "shared_fd", "shared_handle", "shared_mmap"]
