"""RecordIO byte layout: golden bytes written from the dmlc/MXNet specification, round trips,
and the errors that name what was found and where."""

from __future__ import annotations

import io
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from readers.formats import recordio as rio
from readers.formats.recordio import (
    IRHeader,
    RecordFileWriter,
    RecordIOFormatError,
    RecordTooLargeError,
    check_payload_size,
    encode_record,
    format_idx_line,
    iter_records,
    pack_image_record,
    read_idx,
    read_record_at,
    scan_offsets,
    unpack_image_record,
)

# The specification, spelled out as literal bytes (little-endian throughout).
M = b"\x0a\x23\xd7\xce"  # magic 0xced7230a


def head(cflag: int, length: int) -> bytes:
    """Part header by hand: magic, then uint32 LE (cflag << 29 | length)."""
    return M + struct.pack("<I", cflag * 2**29 + length)


def spec_encode(payload: bytes) -> bytes:
    """dmlc RecordIOWriter::WriteRecord restated as a plain loop over every aligned word; the
    reference the encoder is compared with."""
    parts: list[bytes] = []
    start = 0
    for i in range(0, len(payload) // 4 * 4, 4):
        if payload[i : i + 4] == M:
            parts.append(head(1 if start == 0 else 2, i - start) + payload[start:i])
            start = i + 4
    parts.append(head(3 if start else 0, len(payload) - start) + payload[start:])
    return b"".join(parts) + b"\0" * ((4 - len(payload) % 4) % 4)


# ------------------------------------------------------------------------------------------
# Golden records

ONE_LABEL_PAYLOAD = (
    b"\x00\x00\x00\x00"  # flag 0
    b"\x00\x00\x40\x40"  # label 3.0f
    b"\x07\x00\x00\x00\x00\x00\x00\x00"  # id 7
    b"\x00\x00\x00\x00\x00\x00\x00\x00"  # id2 0
    b"\xff\xd8JPEG\xff\xd9"  # image, 8 bytes
)
ONE_LABEL_RECORD = M + b"\x20\x00\x00\x00" + ONE_LABEL_PAYLOAD  # 32-byte payload, no padding

THREE_LABEL_PAYLOAD = (
    b"\x03\x00\x00\x00"  # flag 3
    b"\x00\x00\x00\x00"  # label 0.0
    b"\x01\x00\x00\x00\x00\x00\x00\x00"  # id 1
    b"\x02\x00\x00\x00\x00\x00\x00\x00"  # id2 2
    b"\x00\x00\x80\x3f"  # 1.0f
    b"\x00\x00\x00\x40"  # 2.0f
    b"\x00\x00\x00\x3f"  # 0.5f
    b"PNG"  # image, 3 bytes -> 39 bytes in all
)
THREE_LABEL_RECORD = M + b"\x27\x00\x00\x00" + THREE_LABEL_PAYLOAD + b"\x00"

GOLDEN = {
    "empty": (b"", M + b"\x00\x00\x00\x00"),
    "len1": (b"a", M + b"\x01\x00\x00\x00" + b"a\x00\x00\x00"),
    "len2": (b"ab", M + b"\x02\x00\x00\x00" + b"ab\x00\x00"),
    "len3": (b"abc", M + b"\x03\x00\x00\x00" + b"abc\x00"),
    "len4": (b"abcd", M + b"\x04\x00\x00\x00" + b"abcd"),
    "len5": (b"abcde", M + b"\x05\x00\x00\x00" + b"abcde\x00\x00\x00"),
    "one_label_image": (ONE_LABEL_PAYLOAD, ONE_LABEL_RECORD),
    "three_label_image": (THREE_LABEL_PAYLOAD, THREE_LABEL_RECORD),
    # magic at aligned offset 4: parts "ABCD" (cflag 1) and "EFGHIJ" (cflag 3), pad 2
    "aligned_magic": (
        b"ABCD" + M + b"EFGHIJ",
        M + b"\x04\x00\x00\x20" + b"ABCD" + M + b"\x06\x00\x00\x60" + b"EFGHIJ\x00\x00",
    ),
    # magics at 4 and 16: cflags 1, 2, 3
    "two_magics": (
        b"WXYZ" + M + b"12345678" + M + b"Q",
        M
        + b"\x04\x00\x00\x20"
        + b"WXYZ"
        + M
        + b"\x08\x00\x00\x40"
        + b"12345678"
        + M
        + b"\x01\x00\x00\x60"
        + b"Q\x00\x00\x00",
    ),
    # magic at offset 2 (unaligned) stays in a single part
    "unaligned_magic": (b"AB" + M + b"CD", M + b"\x08\x00\x00\x00" + b"AB" + M + b"CD"),
    "unaligned_magic_at_end": (b"A" + M, M + b"\x05\x00\x00\x00" + b"A" + M + b"\x00\x00\x00"),
    # dmlc edge cases: magic first -> empty first part; last aligned word -> empty last part
    "magic_at_start": (M + b"tail", M + b"\x00\x00\x00\x20" + M + b"\x04\x00\x00\x60" + b"tail"),
    "magic_at_end": (b"head" + M, M + b"\x04\x00\x00\x20" + b"head" + M + b"\x00\x00\x00\x60"),
    "magic_only": (M, M + b"\x00\x00\x00\x20" + M + b"\x00\x00\x00\x60"),
    # adjacent magics -> an empty middle part
    "adjacent_magics": (
        b"ab\x00\x00" + M + M + b"z",
        M
        + b"\x04\x00\x00\x20"
        + b"ab\x00\x00"
        + M
        + b"\x00\x00\x00\x40"
        + M
        + b"\x01\x00\x00\x60"
        + b"z\x00\x00\x00",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encode_record_matches_golden_bytes(name: str) -> None:
    payload, record = GOLDEN[name]
    assert encode_record(payload) == record
    assert spec_encode(payload) == record  # the test's own model agrees with the literals


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_read_record_at_parses_golden_bytes(name: str) -> None:
    payload, record = GOLDEN[name]
    assert read_record_at(record, 0) == (payload, len(record))
    assert read_record_at(record, 0, strict=True) == (payload, len(record))
    # at a nonzero offset, inside a bigger buffer, through a memoryview
    buf = memoryview(ONE_LABEL_RECORD + record + ONE_LABEL_RECORD)
    end = len(ONE_LABEL_RECORD) + len(record)
    assert read_record_at(buf, len(ONE_LABEL_RECORD)) == (payload, end)


def test_record_lengths_are_padded_to_four() -> None:
    for n in range(9):
        assert len(encode_record(b"x" * n)) == 8 + (n + 3) // 4 * 4


def test_pack_image_record_one_label_golden() -> None:
    payload = pack_image_record(b"\xff\xd8JPEG\xff\xd9", label=3, id=7)
    assert payload == ONE_LABEL_PAYLOAD
    header, label, image = unpack_image_record(payload)
    assert header == IRHeader(flag=0, label=3.0, id=7, id2=0)
    assert isinstance(label, float)
    assert label == 3.0
    assert bytes(image) == b"\xff\xd8JPEG\xff\xd9"


def test_pack_image_record_three_labels_golden() -> None:
    payload = pack_image_record(b"PNG", label=[1.0, 2.0, 0.5], id=1, id2=2)
    assert payload == THREE_LABEL_PAYLOAD
    assert pack_image_record(b"PNG", label=np.array([1, 2, 0.5]), id=1, id2=2) == payload
    header, label, image = unpack_image_record(THREE_LABEL_PAYLOAD)
    assert header == IRHeader(flag=3, label=0.0, id=1, id2=2)
    assert isinstance(label, np.ndarray)
    assert label.dtype == np.float32
    np.testing.assert_array_equal(label, np.array([1.0, 2.0, 0.5], dtype=np.float32))
    assert bytes(image) == b"PNG"


def test_pack_image_record_label_forms() -> None:
    no_label = pack_image_record(b"img", label=None, id=5)
    assert no_label == struct.pack("<IfQQ", 0, 0.0, 5, 0) + b"img"
    # mxnet.recordio.pack: any non-number label becomes flag = its size, header label 0
    single_list = pack_image_record(b"img", label=[4.0], id=5)
    assert single_list == b"\x01\x00\x00\x00" + b"\x00" * 4 + struct.pack("<QQ", 5, 0) + (
        b"\x00\x00\x80\x40" + b"img"
    )
    assert pack_image_record(b"img", label=[], id=5) == no_label
    assert pack_image_record(b"img", label=np.int64(2), id=5)[4:8] == b"\x00\x00\x00\x40"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"label": "cat", "id": 0}, "must be numeric"),
        ({"label": [[1.0, 2.0]], "id": 0}, "must be 1-D"),
        ({"label": ["a", "b"], "id": 0}, "sequence of numbers"),
        ({"label": 1e40, "id": 0}, "does not fit in a float32"),
        ({"label": 0, "id": -1}, "id must fit in uint64"),
        ({"label": 0, "id": 0, "id2": 2**64}, "id2 must fit in uint64"),
    ],
)
def test_pack_image_record_refuses_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pack_image_record(b"img", **kwargs)  # type: ignore[arg-type]


def test_unpack_image_record_errors() -> None:
    with pytest.raises(RecordIOFormatError, match="23 bytes is shorter than the 24-byte"):
        unpack_image_record(b"\x00" * 23)
    short = struct.pack("<IfQQ", 3, 0.0, 1, 0) + b"\x00" * 11
    with pytest.raises(RecordIOFormatError, match=r"flag=3, .* \(12 bytes\), but only 11"):
        unpack_image_record(short)


# ------------------------------------------------------------------------------------------
# Properties

# Payloads with the magic planted anywhere: aligned or not, repeated, adjacent, first, last.
payloads = st.lists(st.one_of(st.binary(max_size=11), st.just(M), st.just(M + M)), max_size=8).map(
    b"".join
)


@settings(max_examples=300, deadline=None)
@given(payloads)
def test_encode_matches_spec_and_round_trips(payload: bytes) -> None:
    record = encode_record(payload)
    assert record == spec_encode(payload)
    assert len(record) % 4 == 0
    assert read_record_at(record, 0, strict=True) == (payload, len(record))
    # The point of the splitting: no aligned magic word of the file is inside part data.
    headers = {off for off, _ in _part_headers(record)}
    aligned_magics = {i for i in range(0, len(record), 4) if record[i : i + 4] == M}
    assert aligned_magics == headers


def _part_headers(record: bytes) -> list[tuple[int, int]]:
    """(offset, cflag) of each part header, walking the lengths by hand."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < len(record):
        (lrec,) = struct.unpack_from("<I", record, pos + 4)
        out.append((pos, lrec >> 29))
        pos += 8 + ((lrec & (2**29 - 1)) + 3) // 4 * 4
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(payloads, max_size=6))
def test_iter_records_over_concatenation(records: list[bytes]) -> None:
    sink = io.BytesIO()
    writer = RecordFileWriter(sink)
    offsets = [writer.write(payload) for payload in records]
    data = sink.getvalue()
    assert data == b"".join(encode_record(p) for p in records)
    assert writer.offset == len(data)
    expected_offsets = np.cumsum([0] + [len(encode_record(p)) for p in records])[:-1]
    assert offsets == expected_offsets.tolist()
    assert list(iter_records(data)) == list(zip(offsets, records, strict=True))
    found = scan_offsets(data, strict=True)
    assert found.dtype == np.int64
    assert found.tolist() == offsets
    for offset, payload in zip(offsets, records, strict=True):
        assert read_record_at(data, offset)[0] == payload


labels = st.one_of(
    st.none(),
    st.floats(width=32),
    st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=5),
)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64), labels, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_image_record_round_trip(
    image: bytes, label: float | list[float] | None, id_: int, id2: int
) -> None:
    payload = pack_image_record(image, label=label, id=id_, id2=id2)
    # id or id2 may hold the magic (hypothesis finds id2 = 0xced7230a), making it multi-part
    stored, _ = read_record_at(encode_record(payload), 0)
    assert stored == payload
    header, got, got_image = unpack_image_record(stored)
    assert bytes(got_image) == image
    assert (header.id, header.id2) == (id_, id2)
    if isinstance(label, list):
        assert header.flag == len(label)
        assert header.label == 0.0
        np.testing.assert_array_equal(got, np.array(label, dtype=np.float32))
    else:
        assert header.flag == 0
        expected = 0.0 if label is None else label
        assert got == expected or (np.isnan(expected) and np.isnan(got))


def test_parsing_an_mmap_leaves_it_closable(tmp_path: Path) -> None:
    path = tmp_path / "a.rec"
    payloads_ = [GOLDEN[name][0] for name in sorted(GOLDEN)]
    with path.open("wb") as fh, RecordFileWriter(fh) as writer:
        offsets = [writer.write(p) for p in payloads_]
    with path.open("rb") as src, mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert [p for _, p in iter_records(mm)] == payloads_
        assert scan_offsets(mm).tolist() == offsets
        assert read_record_at(mm, offsets[3])[0] == payloads_[3]
    # leaving the `with` closed the mmap: no view of it was left exported


def test_record_file_writer_appends_with_absolute_offsets(tmp_path: Path) -> None:
    path = tmp_path / "a.rec"
    path.write_bytes(ONE_LABEL_RECORD)
    with path.open("ab") as fh:
        writer = RecordFileWriter(fh)
        assert writer.write(b"abc") == len(ONE_LABEL_RECORD)
        writer.close()
    assert fh.closed
    assert scan_offsets(path.read_bytes()).tolist() == [0, len(ONE_LABEL_RECORD)]


# ------------------------------------------------------------------------------------------
# Errors


def test_truncated_header() -> None:
    with pytest.raises(
        RecordIOFormatError, match=r"truncated RecordIO record: needs an 8-byte header at offset 0"
    ):
        read_record_at(ONE_LABEL_RECORD[:6], 0)
    with pytest.raises(RecordIOFormatError, match=r"header at offset 40, but the data is 40"):
        read_record_at(ONE_LABEL_RECORD, 40)


def test_truncated_payload_and_padding() -> None:
    with pytest.raises(
        RecordIOFormatError,
        match=r"record at offset 0: the part at 0 declares 32 bytes \(\+0 padding\) but only 29",
    ):
        read_record_at(ONE_LABEL_RECORD[:-3], 0)
    # dmlc reads the padding too, so a record cut inside its padding is truncated
    with pytest.raises(RecordIOFormatError, match=r"declares 39 bytes \(\+1 padding\)"):
        read_record_at(THREE_LABEL_RECORD[:-1], 0)


def test_truncated_multi_part_record() -> None:
    _, record = GOLDEN["two_magics"]
    with pytest.raises(
        RecordIOFormatError, match=r"truncated RecordIO part 1 of the record at 0: .* offset 12"
    ):
        read_record_at(record[:12], 0)


def test_wrong_magic() -> None:
    with pytest.raises(
        RecordIOFormatError,
        match=r"bad RecordIO magic at offset 0: found 0x00000000, expected 0xced7230a",
    ):
        read_record_at(b"\x00" * 16, 0)
    bad_second = M + b"\x04\x00\x00\x20" + b"ABCD" + b"\x0b\x23\xd7\xce" + b"\x00\x00\x00\x60"
    with pytest.raises(
        RecordIOFormatError, match=r"offset 12: found 0xced7230b, .* \(record starts at 0\)"
    ):
        read_record_at(bad_second, 0)


def test_offset_inside_a_record_is_refused() -> None:
    with pytest.raises(RecordIOFormatError, match=r"bad RecordIO magic at offset 4: found 0x"):
        read_record_at(ONE_LABEL_RECORD, 4)
    with pytest.raises(RecordIOFormatError, match="must be >= 0"):
        read_record_at(ONE_LABEL_RECORD, -8)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (head(2, 0), r"record at offset 0 starts with cflag 2 \(middle part\), expected 0"),
        (head(3, 0), r"starts with cflag 3 \(last part\)"),
        (head(5, 0), r"starts with cflag 5 \(invalid\)"),
        (head(1, 0) + head(0, 0), r"part at offset 8 of the record at 0 has cflag 0 \(whole"),
        (head(1, 0) + head(1, 0), r"has cflag 1 \(first part\), expected 2 .* or 3"),
        (head(1, 0) + head(2, 0) + head(7, 0), r"part at offset 16 .* cflag 7 \(invalid\)"),
    ],
)
def test_bad_cflag_sequence(data: bytes, match: str) -> None:
    with pytest.raises(RecordIOFormatError, match=match):
        read_record_at(data, 0)


def test_length_field_beyond_the_data() -> None:
    # the largest length the 29-bit field holds, without allocating it
    huge = M + b"\xff\xff\xff\x1f" + b"\x00" * 8
    with pytest.raises(RecordIOFormatError, match=r"declares 536870911 bytes .* only 8 bytes"):
        read_record_at(huge, 0)


def test_writer_refuses_payloads_over_the_dmlc_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rio.MAX_PAYLOAD == rio.MAX_PART == 2**29 - 1
    check_payload_size(2**29 - 1)
    with pytest.raises(RecordTooLargeError, match=r"536870912 bytes is too large"):
        check_payload_size(2**29)
    with pytest.raises(RecordTooLargeError, match="too large"):
        rio.encode_lrec(0, 2**29)
    assert issubclass(RecordTooLargeError, ValueError)
    monkeypatch.setattr(rio.records, "MAX_PAYLOAD", 8)  # where the check reads it
    assert encode_record(b"x" * 8) == M + b"\x08\x00\x00\x00" + b"x" * 8
    with pytest.raises(RecordTooLargeError, match=r"payload of 9 bytes .* at most 8 bytes"):
        encode_record(b"x" * 9)
    with pytest.raises(RecordTooLargeError):
        RecordFileWriter(io.BytesIO()).write(b"x" * 9)


def test_iter_records_reports_trailing_garbage() -> None:
    data = ONE_LABEL_RECORD + b"\x00\x00\x00"
    records = iter_records(data)
    assert next(records) == (0, ONE_LABEL_PAYLOAD)
    with pytest.raises(RecordIOFormatError, match=r"header at offset 40, but the data is 43"):
        next(records)
    with pytest.raises(RecordIOFormatError, match="offset 40"):
        scan_offsets(data)


def test_strict_reports_what_readers_tolerate() -> None:
    nonzero_pad = M + b"\x01\x00\x00\x00" + b"a\x00\x07\x00"
    assert read_record_at(nonzero_pad, 0) == (b"a", 12)
    with pytest.raises(RecordIOFormatError, match=r"nonzero padding .* \(bytes 9..12 = 000700\)"):
        read_record_at(nonzero_pad, 0, strict=True)

    unsplit = M + b"\x08\x00\x00\x00" + b"ABCD" + M  # a writer must have split this payload
    assert read_record_at(unsplit, 0) == (b"ABCD" + M, 16)
    with pytest.raises(RecordIOFormatError, match="contains the magic at aligned offset 12"):
        read_record_at(unsplit, 0, strict=True)
    with pytest.raises(RecordIOFormatError, match="contains the magic"):
        scan_offsets(unsplit, strict=True)

    unaligned = b"\x00\x00" + M + b"\x00\x00\x00\x00"
    assert read_record_at(unaligned, 2) == (b"", 10)
    with pytest.raises(RecordIOFormatError, match="offset 2 is not a multiple of 4"):
        read_record_at(unaligned, 2, strict=True)


# ------------------------------------------------------------------------------------------
# .idx


def test_format_idx_line() -> None:
    assert format_idx_line(3, 128) == "3\t128\n"
    assert format_idx_line(np.int64(0), np.int64(0)) == "0\t0\n"


@pytest.mark.parametrize(
    "text",
    [
        "0\t0\n1\t32\n2\t72\n",
        "0\t0\n1\t32\n2\t72\n\n\n",  # trailing blank lines
        "0\t0\r\n1\t32\r\n2\t72",  # CRLF, no final newline
        "0\t0\n\n1\t32\n2\t72\n",  # a blank line inside is skipped as well
    ],
)
def test_read_idx(tmp_path: Path, text: str) -> None:
    path = tmp_path / "a.idx"
    path.write_bytes(text.encode())
    keys, offsets = read_idx(path)
    assert keys.dtype == offsets.dtype == np.int64
    assert keys.tolist() == [0, 1, 2]
    assert offsets.tolist() == [0, 32, 72]


def test_read_idx_round_trips_written_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.idx"
    pairs = [(5, 0), (-1, 2**40), (2**63 - 1, 12)]
    path.write_text("".join(format_idx_line(k, o) for k, o in pairs))
    keys, offsets = read_idx(str(path))
    assert list(zip(keys.tolist(), offsets.tolist(), strict=True)) == pairs


def test_read_idx_empty(tmp_path: Path) -> None:
    path = tmp_path / "a.idx"
    path.write_bytes(b"\n")
    keys, offsets = read_idx(path)
    assert keys.shape == offsets.shape == (0,)
    assert keys.dtype == np.int64


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("0\t0\n1\tabc\n", 2, "must be integers"),
        ("0\t0\n1 32\n", 2, "found 1 tab-separated fields"),
        ("0\t0\t9\n", 1, "found 3 tab-separated fields"),
        ("0\t0\n1\n2\t5\n", 2, "found 1 tab-separated fields"),
        ("0\t0\n1\t2.5\n", 2, "must be integers"),
        ("0\t0\n1\t-8\n", 2, "offset must be a non-negative int64"),
        ("0\t0\n\n99999999999999999999\t8\n", 3, "key does not fit in int64"),
        ("0\t1_0\n", 1, "must be integers"),
    ],
)
def test_read_idx_names_the_bad_line(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = tmp_path / "bad.idx"
    path.write_text(text)
    with pytest.raises(RecordIOFormatError, match=rf"bad\.idx:{line}: malformed .*{problem}"):
        read_idx(path)


def test_image_record_whose_id2_is_the_magic_is_split() -> None:
    payload = pack_image_record(b"img", label=None, id=0, id2=0xCED7230A)
    record = encode_record(payload)
    # id2 is bytes 16..24 of the payload; its low word sits at aligned offset 16
    assert record[:8] == head(1, 16)
    assert read_record_at(record, 0)[0] == payload
