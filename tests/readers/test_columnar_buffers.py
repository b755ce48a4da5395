"""readers.columnar reads index.parquet's columns from the Arrow buffers with numpy (not with
pyarrow.compute, whose import costs more than a small dataset's index): the same values as
pyarrow.compute gives, with nulls, sliced and chunked arrays, and large strings."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from readers.columnar import COMPRESSIONS, _ints, _string_codes


def _chunked(values: list, type_: pa.DataType, cut: int) -> pa.ChunkedArray:
    """`values` as two chunks, the second a slice of a longer array (a non-zero offset)."""
    first = pa.array(values[:cut], type_)
    longer = pa.array([values[0], *values[cut:]], type_)
    return pa.chunked_array([first, longer.slice(1)], type_)


@pytest.mark.parametrize("type_", [pa.int32(), pa.int64(), pa.uint32()])
@pytest.mark.parametrize("with_nulls", [False, True])
def test_ints_equal_fill_null(type_: pa.DataType, with_nulls: bool) -> None:
    rng = np.random.default_rng(0)
    values = [int(v) for v in rng.integers(0, 2**31 - 1, 300)]
    if with_nulls:
        for i in rng.choice(300, 40, replace=False):
            values[int(i)] = None
    column = _chunked(values, type_, 123)
    expected = pc.fill_null(column, -1 if type_ != pa.uint32() else 0).to_numpy()
    got = _ints(column, None, -1 if type_ != pa.uint32() else 0)
    assert got.dtype == expected.dtype
    assert np.array_equal(got, expected)
    assert np.array_equal(_ints(column, np.int64, 7), pc.fill_null(column, 7).to_numpy())
    sliced = pa.array(values, type_).slice(5, 200)  # an array with an offset, not chunked
    assert np.array_equal(_ints(sliced, np.int64, 7), pc.fill_null(sliced, 7).to_numpy())


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()])
def test_string_codes_equal_compute(type_: pa.DataType) -> None:
    rng = np.random.default_rng(1)
    pool = ["raw", "jpeg", "png", "lz4", "zstd", "none", "", "ra", "raww", "zst", "lz4 ", None]
    values = [pool[int(i)] for i in rng.integers(0, len(pool), 500)]
    column = _chunked(values, type_, 217)
    codes = _string_codes(column, COMPRESSIONS)
    for code, name in enumerate(COMPRESSIONS):
        expected = pc.fill_null(pc.equal(column, name), False).to_numpy(zero_copy_only=False)
        assert np.array_equal(codes == code, expected), name
    assert np.array_equal(codes == -2, pc.is_null(column).to_numpy(zero_copy_only=False))
    assert (_string_codes(column, ("raw",)) == 0).sum() == values.count("raw")
    sliced = pa.array(values, type_).slice(3, 400)  # an array with an offset, not chunked
    expected = pc.fill_null(pc.equal(sliced, "raw"), False).to_numpy(zero_copy_only=False)
    assert np.array_equal(_string_codes(sliced, ("raw",)) == 0, expected)
    nulls = pc.is_null(sliced).to_numpy(zero_copy_only=False)
    assert np.array_equal(_string_codes(sliced, ("raw",)) == -2, nulls)
    assert len(_string_codes(pa.chunked_array([], type_), ("raw",))) == 0


def test_loading_an_index_imports_no_compute(tmp_path: object) -> None:
    """open_dataset -> load_index imports neither pyarrow.compute nor pyarrow.dataset."""
    from tests.conftest import build_packed, write_tree

    src = tmp_path / "src"  # type: ignore[operator]
    write_tree(src, {"a": 3, "b": 2})
    out = build_packed(src, tmp_path / "out", "lmdb")  # type: ignore[operator]
    code = (
        "import sys; from readers.index import load_index; "
        f"i = load_index({str(out)!r}, extra=('width', 'format', 'path')); "
        "assert len(i) == 5 and i.extra['width'].dtype.kind == 'i'; "
        "print(sorted(m for m in sys.modules if m in ('pyarrow.compute', 'pyarrow.dataset')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
