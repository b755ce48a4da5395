"""LMDB records as stored, for conversion: a bare PaddleOCR-layout LMDB, or a packed shard."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from readers.errors import DatasetFormatError
from readers.formats.base import StoredRecords
from readers.formats.lmdb.env import shared_lmdb
from readers.formats.lmdb.keys import DATA_FILE, NUM_SAMPLES_KEY, image_key, label_key


def bare_records(root: Path) -> StoredRecords:
    """The ``image-%09d`` values of the bare LMDB at `root` with their ``label-%09d`` texts.

    Labels are kept as the text stored (a scene-text LMDB's transcriptions); the sizes come
    from the values' lengths, without reading the values.

    Raises:
        DatasetFormatError: not an LMDB with a ``num-samples`` key.
    """
    env = shared_lmdb(str(root))  # the process's one handle of it (py-lmdb allows one)
    with env.begin(buffers=True) as txn:
        raw = txn.get(NUM_SAMPLES_KEY)
        text = None if raw is None else bytes(raw).decode("ascii", "replace").strip()
        if text is None or not text.isdigit():
            raise DatasetFormatError(
                f"{root}: an LMDB whose 'num-samples' is {text!r}; expected the PaddleOCR "
                "layout (num-samples as a decimal count, image-%09d, label-%09d)"
            )
        count = int(text)
        sizes = []
        for local in range(1, count + 1):
            value = txn.get(image_key(local))
            sizes.append(0 if value is None else len(value))

    def read(start: int, stop: int) -> Iterator[tuple[bytes, str | None] | str]:
        with env.begin(buffers=True) as txn:
            for local in range(start + 1, stop + 1):
                value = txn.get(image_key(local))
                if value is None:
                    yield f"the key {image_key(local).decode()} is missing"
                    continue
                label = txn.get(label_key(local))
                text = None if label is None else bytes(label).decode("utf-8", "replace")
                yield bytes(value), text

    names = [image_key(local).decode() for local in range(1, count + 1)]
    return StoredRecords([root / DATA_FILE], names, sizes, read, label_source="label-%09d")


def read_stored(shard_path: str, locals_: Sequence[int]) -> Iterator[bytes]:
    """The ``image-%09d`` values of positions `locals_` (from 1) of the shard at `shard_path`.

    Raises:
        DatasetFormatError: a key is missing (before any value is returned).
    """
    with shared_lmdb(shard_path).begin() as txn:
        get = txn.get
        values = [get(b"image-%09d" % n) for n in locals_]  # image_key, inlined
    if None in values:
        missing = image_key(locals_[values.index(None)]).decode()
        raise DatasetFormatError(f"{shard_path}: the key {missing} is missing")
    return iter(values)
