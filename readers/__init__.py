"""The training side of packer: paddle Datasets, Samplers and streams over packed shards.

Names are imported lazily so that ``import readers.formats`` (what ``packer`` uses) does not
import paddle.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from readers import _paddle

# paddle warns on import, on every machine without ccache, about compiling C++ extensions,
# which reading data never does; hide that one message (and only it)
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)

_EXPORTS = {
    "LmdbDataset": "readers.datasets.lmdb",
    "open_dataset": "readers.datasets",
    "RecordIODataset": "readers.datasets.recordio",
    "BucketBatchSampler": "readers.buckets",
    "ChunkShuffleSampler": "readers.samplers",
    "ConcatDataset": "readers.concat",
    "ChunkShuffleBatchSampler": "readers.samplers",
    "ShardStream": "readers.stream",
    "load_index": "readers.index",
    "decode_image": "readers.decode",
    "decode_sample": "readers.decode",
    "stage": "readers.staging",
    "LoaderStats": "readers.stats",
    "ResizeTo": "readers.transforms",
    "PadCollate": "readers.collate",
    "pad_collate": "readers.collate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'readers' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if _paddle.is_paddle_missing(exc):
            raise _paddle.PaddleMissingError from None
        raise


def __dir__() -> list[str]:
    """The lazily imported names too, so that completion in IPython and editors shows them."""
    return sorted(set(globals()) | set(_EXPORTS))
