"""One size grammar: ``--shard-size`` and the staging cache limit parse the same texts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.config import parse_size as shard_size
from packer.errors import ConfigError
from readers.sizes import SizeError, parse_size
from readers.staging import StagingError
from readers.staging import parse_size as cache_limit


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("1.5k", 1500),
        ("500MB", 500_000_000),
        ("512MiB", 512 << 20),
        ("1GiB", 1 << 30),
        ("1Gi", 1 << 30),
        (" 2 tb ", 2 * 10**12),
        ("7b", 7),
    ],
)
def test_both_callers_accept_the_same_sizes(text: str, size: int) -> None:
    assert parse_size(text) == shard_size(text) == cache_limit(text) == size


@given(st.text(max_size=8))
def test_both_callers_refuse_the_same_texts(text: str) -> None:
    try:
        expected = parse_size(text)
    except SizeError:
        with pytest.raises(ConfigError, match="is not a size"):
            shard_size(text)
        with pytest.raises(StagingError, match="expected bytes or a size"):
            cache_limit(text)
    else:
        assert shard_size(text) == cache_limit(text) == expected
