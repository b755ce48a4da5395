"""The ``--compare`` baseline: the packed dataset's source files, read and decoded one by one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.errors import ConfigError
from readers.decode import decode_sample


class LooseFilesDataset:
    """The baseline for ``--compare``: the packed dataset's source files read one by one.

    Sample ``i`` is the file the packed dataset's index names for sample ``i``, with its label,
    decoded the same way (``readers.decode.decode_sample``) and given the same transform.
    """

    def __init__(
        self,
        src: Path,
        paths: Any,
        labels: Any,
        *,
        decode: str = "rgb",
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.src = src
        self.paths = paths  # an Arrow string array: compact, shared by forked workers
        self.labels = labels
        self.decode = decode
        self.transform = transform

    @classmethod
    def for_packed(
        cls,
        packed: Path,
        src: Path,
        *,
        decode: str = "rgb",
        transform: Callable[[Any], Any] | None = None,
    ) -> LooseFilesDataset:
        """The files under `src` that the packed dataset at `packed` was built from."""
        from readers.errors import ReaderError
        from readers.index import load_index

        try:
            index = load_index(packed, extra=("path",))
        except ReaderError as exc:
            raise ConfigError(
                f"--compare needs a dataset written by packer build, whose index names the "
                f"source files ({exc})"
            ) from None
        paths = index.extra.get("path")
        if paths is None or not len(paths):
            raise ConfigError(f"--compare: {packed} has no source paths in its index")
        first = src / str(paths[0].as_py())
        if not first.is_file():
            raise ConfigError(
                f"--compare {src}: {first} does not exist; SRC must be the directory the "
                f"dataset was built from (meta.json says {index.meta.get('source')!r})"
            )
        return cls(src, paths, index.labels, decode=decode, transform=transform)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        path = os.path.join(self.src, str(self.paths[i].as_py()))
        with open(path, "rb") as f:
            data = f.read()
        # the source files are encoded images: no stored format (raw pixels exist only packed)
        image: Any = decode_sample(data, self.decode)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]
