"""meta.json has one schema: the fields a build writes are `META_FIELDS`, in that order."""

from __future__ import annotations

import json

import pytest

from readers.errors import DatasetFormatError
from readers.meta import META_FIELDS, REQUIRED_FIELDS, load_meta, make_meta
from tests.conftest import Packed


def test_a_build_writes_the_fields_of_the_schema_in_order(packed: Packed) -> None:
    meta = json.loads((packed.path / "meta.json").read_text())
    assert list(meta) == list(META_FIELDS)
    assert load_meta(packed.path) == meta


def test_make_meta_fills_version_shard_count_and_time() -> None:
    fields = {k: None for k in META_FIELDS if k not in ("version", "num_shards", "created")}
    meta = make_meta(**{**fields, "shards": [{"name": "shard-00000", "first": 0, "count": 0}]})
    assert list(meta) == list(META_FIELDS)
    assert meta["version"] == 1
    assert meta["num_shards"] == 1
    assert meta["created"]


@pytest.mark.parametrize("missing", REQUIRED_FIELDS)
def test_load_meta_names_a_missing_required_field(packed: Packed, missing: str) -> None:
    path = packed.path / "meta.json"
    meta = json.loads(path.read_text())
    del meta[missing]
    path.write_text(json.dumps(meta))
    with pytest.raises(DatasetFormatError, match=f"field {missing!r} is missing"):
        load_meta(packed.path)
