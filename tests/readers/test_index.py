"""load_index: compact columns from index.parquet or index.jsonl, staleness, bad files."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers.errors import DatasetFormatError
from readers.formats import REGISTRY
from readers.index import load_index


@pytest.fixture
def packed(tree, tmp_path, fmt):
    """The tree packed in each registered format (`fmt`, tests/conftest.py)."""
    src, _ = tree
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, format=fmt))
    return out


def lines(out):
    return [json.loads(x) for x in (out / "index.jsonl").read_text().splitlines()]


def test_parquet_and_jsonl_load_the_same_columns(packed):
    a = load_index(packed, extra=("width", "height", "path"))
    b = load_index(packed, extra=("width", "height", "path"), prefer_columnar=False)
    rows = lines(packed)
    for index in (a, b):
        assert len(index) == len(rows)
        assert index.crc32.dtype == np.uint32
        assert index.nbytes.dtype == np.uint32
        assert index.crc32.tolist() == [r["crc32"] for r in rows]
        assert index.nbytes.tolist() == [r["nbytes"] for r in rows]
        assert index.labels.kind == "int"
        assert [index.labels[i] for i in range(len(rows))] == [r["label"] for r in rows]
        assert index.extra["width"].tolist() == [r["width"] for r in rows]
        assert index.extra["path"].to_pylist() == [r["path"] for r in rows]
    fmt = REGISTRY[a.format]
    if fmt.offsets_locate_records:  # where each record starts: from either file, always
        assert a.offset.tolist() == b.offset.tolist() == [r["offset"] for r in rows]
    else:  # a page-cache hint, only from index.parquet; each points at the stored bytes
        assert b.offset is None
        assert a.offset is not None
        shard = fmt.shard_path(packed, a.shard_names[0])
        data = Path(fmt.data_file(shard)).read_bytes()
        for i, row in enumerate(rows):
            start = int(a.offset[i])
            assert zlib.crc32(data[start : start + row["nbytes"]]) == row["crc32"]
    assert a.path_of(3) == rows[3]["path"]


def test_edited_jsonl_makes_the_parquet_stale(packed):
    rows = lines(packed)
    rows[0]["label"] = 99
    (packed / "index.jsonl").write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    )
    with pytest.warns(UserWarning, match="stale"):
        index = load_index(packed)
    assert index.labels[0] == 99


def test_string_and_structured_labels_stay_exact(tree, tmp_path):
    src, files = tree
    listing = tmp_path / "l.txt"
    names = sorted(files)
    listing.write_text(f"{names[0]}\tsome text\n{names[1]}\t12\n")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(listing)))
    for columnar in (True, False):
        index = load_index(out, prefer_columnar=columnar)
        assert index.labels.kind == "json"
        assert [index.labels[0], index.labels[1]] == ["some text", 12]


def test_torn_last_line_and_count_mismatch(packed):
    text = (packed / "index.jsonl").read_text()
    (packed / "index.jsonl").write_text(text[:-10])
    with pytest.raises(DatasetFormatError, match=r"index\.jsonl:11: the last line is cut short"):
        load_index(packed, prefer_columnar=False)
    meta = json.loads((packed / "meta.json").read_text())
    meta["num_samples"] = 12
    (packed / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetFormatError, match="the shards hold 11 samples but num_samples"):
        load_index(packed)


def test_missing_meta(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"meta\.json: not found"):
        load_index(tmp_path)
