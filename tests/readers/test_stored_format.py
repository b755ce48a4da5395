"""Readers decide by the index, not by build options: raw pixels are the records whose index
``format`` is ``raw`` (decompressed first when the index gives a ``compression``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from readers import open_dataset
from readers.errors import DatasetFormatError
from readers.formats.layout import INDEX_COLUMNAR_NAME, INDEX_NAME, META_NAME
from readers.index import load_index
from tests.conftest import Packed


def edit_meta(root: Path, **changes: object) -> None:
    meta = json.loads((root / META_NAME).read_text())
    meta.update(changes)
    (root / META_NAME).write_text(json.dumps(meta))


def edit_index(root: Path, line: int, **changes: object) -> None:
    """Change one index.jsonl line and drop index.parquet (it would no longer match)."""
    lines = (root / INDEX_NAME).read_text().splitlines()
    row = json.loads(lines[line])
    row.update(changes)
    lines[line] = json.dumps(row)
    (root / INDEX_NAME).write_text("\n".join(lines) + "\n")
    (root / INDEX_COLUMNAR_NAME).unlink(missing_ok=True)


def test_raw_records_are_known_by_the_index_not_the_build_options(packed_raw: Packed) -> None:
    before = open_dataset(packed_raw.path)
    expected = [before[i][0] for i in range(len(before))]
    options = json.loads((packed_raw.path / META_NAME).read_text())["options"]
    edit_meta(packed_raw.path, options={**options, "encode": "keep"})
    ds = open_dataset(packed_raw.path)
    assert ds.index is not None
    assert ds.index.raw is not None
    assert ds.index.raw.all()
    for i, image in enumerate(expected):
        np.testing.assert_array_equal(ds[i][0], image)


def test_encoded_records_stay_encoded_whatever_the_options_say(packed: Packed) -> None:
    before = open_dataset(packed.path)
    expected = [before[i][0] for i in range(len(before))]
    options = json.loads((packed.path / META_NAME).read_text())["options"]
    edit_meta(packed.path, options={**options, "encode": "raw"})
    ds = open_dataset(packed.path)
    assert ds.index is not None
    assert ds.index.raw is None
    for i, image in enumerate(expected):
        np.testing.assert_array_equal(ds[i][0], image)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_raw_records_decode_to_the_same_pixels(packed_raw: Packed, codec: str) -> None:
    plain = open_dataset(packed_raw.path)
    stored = plain.read_bytes(3)
    edit_index(packed_raw.path, 3, compression=codec)
    ds = open_dataset(packed_raw.path, decode="bytes")
    index = ds.index
    assert index is not None
    assert index.compression is not None
    assert index.compression.tolist().count(0) == len(ds) - 1
    squeezed = pa.Codec(codec).compress(stored, asbytes=True)
    np.testing.assert_array_equal(ds.decode_stored(squeezed, 3, "rgb"), plain[3][0])


def test_an_unknown_compression_is_refused(packed_raw: Packed) -> None:
    edit_index(packed_raw.path, 0, compression="brotli")
    with pytest.raises(
        DatasetFormatError,
        match=r"index.jsonl:1: compression is 'brotli', expected one of lz4, zstd",
    ):
        load_index(packed_raw.path)


def test_compression_of_an_encoded_record_is_refused(packed: Packed) -> None:
    edit_index(packed.path, 0, compression="lz4")
    with pytest.raises(DatasetFormatError, match="raw only"):
        load_index(packed.path)


def test_meta_json_is_read_once_per_open(packed: Packed, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file: object, *args: object, **kwargs: object) -> object:
        if str(file).endswith(META_NAME):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    real_os_open = os.open

    def counting_os_open(file: object, *args: object, **kwargs: object) -> int:
        if str(file).endswith(META_NAME):
            opened.append(str(file))
        return real_os_open(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(os, "open", counting_os_open)  # readers.files.open_regular
    open_dataset(packed.path)
    assert len(opened) == 1, opened
