"""RecordIODataset specifics: packed datasets read by offset, and bare MXNet .rec/.idx pairs
written by hand from the specification (struct.pack, not our writer), including InsightFace's
meta record. What every format's Dataset does alike is in test_datasets.py."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import RecordIODataset, open_dataset
from readers.errors import DatasetFormatError, RecordError
from readers.formats.recordio import find_recordio_pair
from readers.io import handles
from tests.conftest import encode

# --------------------------------------------------------------------------------------------
# The MXNet RecordIO specification, restated with struct alone

MAGIC = 0xCED7230A
MAGIC_BYTES = b"\x0a\x23\xd7\xce"


def part(cflag: int, data: bytes) -> bytes:
    """One part: magic, uint32 LE ``cflag << 29 | length``, data, zero padding to 4 bytes."""
    return struct.pack("<II", MAGIC, (cflag << 29) | len(data)) + data + b"\0" * (-len(data) % 4)


def record(payload: bytes) -> bytes:
    """A record of one part (the payload must not hold the magic at an aligned offset)."""
    assert not any(payload[i : i + 4] == MAGIC_BYTES for i in range(0, len(payload), 4))
    return part(0, payload)


def image_payload(image: bytes, label: float | list[float], key: int) -> bytes:
    """MXNet image record: IRHeader <IfQQ (flag, label, id, id2), float32 labels, image."""
    if isinstance(label, list):
        return (
            struct.pack("<IfQQ", len(label), 0.0, key, 0)
            + struct.pack(f"<{len(label)}f", *label)
            + image
        )
    return struct.pack("<IfQQ", 0, label, key, 0) + image


def write_pair(prefix: Path, records: list[tuple[int, bytes]], *, idx: bool = True) -> list[int]:
    """Write ``prefix.rec`` (records in the given order) and ``prefix.idx`` (key TAB offset)."""
    blob = b""
    offsets = []
    for _, rec in records:
        offsets.append(len(blob))
        blob += rec
    Path(f"{prefix}.rec").write_bytes(blob)
    if idx:
        lines = "".join(f"{key}\t{off}\n" for (key, _), off in zip(records, offsets, strict=True))
        Path(f"{prefix}.idx").write_text(lines)
    return offsets


def png_images(n: int, *, seed: int = 3) -> list[tuple[np.ndarray, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        image = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
        out.append((image, encode(image, ".png")))
    return out


def rgb(image_bgr: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image_bgr, cv2.COLOR_BGR2RGB)


@pytest.fixture
def golden(tmp_path: Path):
    """im2rec-style pair: key 0 is an image; one-label, multi-label and multi-part records;
    payload lengths 0..3 mod 4 (zero bytes after PNG's IEND, which decoders ignore)."""
    images = png_images(5)
    blobs = []
    for n, (_, png) in enumerate(images):
        extra = (-(24 + len(png)) + n) % 4  # payload length = n mod 4
        blobs.append(png + b"\0" * extra)
    labels: list[float | list[float]] = [3.0, [1.0, 2.0, 3.5], 7.0, 0.0, [5.0]]
    payloads = [
        image_payload(b, lab, key) for key, (b, lab) in enumerate(zip(blobs, labels, strict=True))
    ]
    assert sorted(len(p) % 4 for p in payloads[:4]) == [0, 1, 2, 3]
    recs = [record(p) for p in payloads[:2]]
    # record 2: the magic at aligned payload offset 24 (the first word of the image bytes)
    # is split out: a first part with the header, a last part with the rest
    split = payloads[2][:24] + MAGIC_BYTES + payloads[2][24:]
    recs.append(part(1, split[:24]) + part(3, split[28:]))
    recs += [record(p) for p in payloads[3:]]
    prefix = tmp_path / "golden"
    write_pair(prefix, list(enumerate(recs)))
    expected_bytes = [*blobs[:2], MAGIC_BYTES + blobs[2], *blobs[3:]]
    return prefix, images, expected_bytes, labels


def assert_label(got, want):
    if isinstance(want, list):
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, np.asarray(want, np.float32))
    else:
        assert isinstance(got, float)
        assert got == want


def test_golden_pair_opens_by_rec_idx_prefix_and_folder(golden):
    prefix, images, expected_bytes, labels = golden
    for path in (f"{prefix}.rec", f"{prefix}.idx", prefix, prefix.parent):
        ds = open_dataset(path, decode="bytes")
        assert isinstance(ds, RecordIODataset)
        assert len(ds) == 5
        assert list(ds.shard_bounds) == [0, 5]
        assert [ds[i][0] for i in range(5)] == expected_bytes
        for i, want in enumerate(labels):
            assert_label(ds[i][1], want)
        assert ds.meta_label is None
    assert list(ds.keys) == [0, 1, 2, 3, 4]
    assert ds.labels is None  # multi-label records: no int label array
    decoded = RecordIODataset(Path(f"{prefix}.rec"))
    for i in (0, 1, 3, 4):
        np.testing.assert_array_equal(decoded[i][0], rgb(images[i][0]))


def test_bare_int_labels_array_and_dataloader(tmp_path):
    images = png_images(6)
    recs = [(k, record(image_payload(png, float(k % 3), k))) for k, (_, png) in enumerate(images)]
    write_pair(tmp_path / "train", recs)
    ds = RecordIODataset(tmp_path / "train.rec")
    np.testing.assert_array_equal(ds.labels, [0, 1, 2, 0, 1, 2])
    ds[0]
    loader = paddle.io.DataLoader(ds, batch_size=3, num_workers=2, use_shared_memory=True)
    got = [
        (im, lab) for ims, labs in loader for im, lab in zip(ims.numpy(), labs.numpy(), strict=True)
    ]
    assert len(got) == 6
    for (image, label), (expected, _), k in zip(got, images, range(6), strict=True):
        np.testing.assert_array_equal(image, rgb(expected))
        assert label == k % 3


def insightface_records(images: list[tuple[np.ndarray, bytes]], *, meta_first: bool):
    """As InsightFace's face2rec2 writes train.rec: images keys 1..n (class labels), the meta
    record key 0 (flag 2, label [n + 1, n + 1 + identities], no image), then one header-only
    record per identity (flag 2, label [first key, end key])."""
    classes = [0.0, 0.0, 1.0]
    n = len(images)
    imgs = [
        (k + 1, record(image_payload(png, classes[k], k + 1))) for k, (_, png) in enumerate(images)
    ]
    meta = (0, record(image_payload(b"", [float(n + 1), float(n + 3)], 0)))
    identities = [
        (n + 1, record(image_payload(b"", [1.0, 3.0], n + 1))),
        (n + 2, record(image_payload(b"", [3.0, 4.0], n + 2))),
    ]
    return [meta, *imgs, *identities] if meta_first else [*imgs, meta, *identities]


@pytest.mark.parametrize("meta_first", [False, True])
def test_insightface_meta_record_is_skipped(tmp_path, meta_first):
    images = png_images(3, seed=9)
    write_pair(tmp_path / "train", insightface_records(images, meta_first=meta_first))
    ds = open_dataset(tmp_path)  # the dataset folder, as InsightFace ships it
    assert isinstance(ds, RecordIODataset)
    assert len(ds) == 3
    assert list(ds.keys) == [1, 2, 3]
    np.testing.assert_array_equal(ds.meta_label, [4.0, 6.0])
    assert [ds[i][1] for i in range(3)] == [0.0, 0.0, 1.0]
    np.testing.assert_array_equal(ds.labels, [0, 0, 1])
    for i in range(3):
        np.testing.assert_array_equal(ds[i][0], rgb(images[i][0]))


def test_rec_without_idx_is_scanned_with_a_warning(tmp_path):
    images = png_images(3, seed=9)
    write_pair(tmp_path / "train", insightface_records(images, meta_first=False), idx=False)
    with pytest.warns(UserWarning, match=r"no \.idx beside it; scanning"):
        ds = open_dataset(tmp_path / "train.rec", decode="bytes")
    assert len(ds) == 3  # the meta and identity records hold no image and are skipped
    assert list(ds.keys) == [1, 2, 3]
    assert [ds[i][0] for i in range(3)] == [png for _, png in images]
    np.testing.assert_array_equal(ds.labels, [0, 0, 1])


def test_bare_pair_errors_say_what_they_found(tmp_path):
    images = png_images(2)
    write_pair(
        tmp_path / "a", [(k, record(image_payload(p, 1.0, k))) for k, (_, p) in enumerate(images)]
    )
    (tmp_path / "b.rec").write_bytes((tmp_path / "a.rec").read_bytes())
    with pytest.raises(DatasetFormatError, match=r"found 2 \.rec files \['a\.rec', 'b\.rec'\]"):
        open_dataset(tmp_path)
    (tmp_path / "lonely.idx").write_text("0\t0\n")
    with pytest.raises(DatasetFormatError, match=r"a \.idx without its \.rec"):
        open_dataset(tmp_path / "lonely.idx")
    with pytest.raises(DatasetFormatError, match="missing: does not exist"):
        open_dataset(tmp_path / "missing")
    (tmp_path / "a.idx").write_text("0\t0\n1\t999999\n")
    with pytest.raises(DatasetFormatError, match=r"key 1 has offset 999999, past the end"):
        RecordIODataset(tmp_path / "a.rec")
    (tmp_path / "c.rec").write_bytes(b"\x00" * 16)
    with (
        pytest.warns(UserWarning, match="scanning"),
        pytest.raises(DatasetFormatError, match="bad RecordIO magic"),
    ):
        RecordIODataset(tmp_path / "c.rec")
    assert find_recordio_pair(tmp_path / "nothing") is None


def test_damaged_bare_record_is_a_record_error(tmp_path):
    images = png_images(2)
    offsets = write_pair(
        tmp_path / "a", [(k, record(image_payload(p, 1.0, k))) for k, (_, p) in enumerate(images)]
    )
    blob = bytearray((tmp_path / "a.rec").read_bytes())
    blob[offsets[1]] ^= 0xFF  # the magic of record 1
    (tmp_path / "a.rec").write_bytes(bytes(blob))
    ds = RecordIODataset(tmp_path / "a")
    assert ds[0][1] == 1.0
    with pytest.raises(RecordError, match=r"a\.rec key 1 sample 1 \(offset \d+\): bad RecordIO"):
        ds[1]


# --------------------------------------------------------------------------------------------
# Packed RecordIO datasets


@pytest.fixture
def rec_packed(tree, tmp_path):
    src, files = tree
    out = tmp_path / "out.rec"
    build(BuildConfig(src=src, out=out, format="recordio"))
    return out, files


def test_packed_dataset_reads_by_offset(rec_packed):
    out, files = rec_packed
    ds = RecordIODataset(out, decode="bytes")
    assert ds.keys is None
    assert ds.index is not None
    assert [ds[i][0] for i in range(len(ds))] == [files[p] for p in sorted(files)]
    assert ds[-1][0] == files[sorted(files)[-1]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    np.testing.assert_array_equal(ds.labels, [0] * 4 + [1] * 5 + [2] * 2)
    assert RecordIODataset(out, transform=lambda im: im.shape)[0][0][2] == 3


def flip(path: Path, at: int) -> None:
    handles.close_all()
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_header_id_that_does_not_match_is_refused(rec_packed):
    out, _ = rec_packed
    rec = out / "shard-00000.rec"
    offset = int((out / "shard-00000.idx").read_text().splitlines()[2].split("\t")[1])
    flip(rec, offset + 8 + 8)  # the low byte of IRHeader.id of sample 2
    with pytest.raises(RecordError, match=r"key 2 sample 2 .*header id is 253"):
        RecordIODataset(out)[2]


def test_bare_shard_of_a_packed_dataset_opens_with_header_labels(rec_packed):
    out, files = rec_packed
    ds = open_dataset(out / "shard-00000.rec", decode="bytes")
    assert ds.index is None
    assert len(ds) == len(files)
    assert list(ds.keys) == list(range(len(files)))
    assert [ds[i][0] for i in range(len(ds))] == [files[p] for p in sorted(files)]
    np.testing.assert_array_equal(ds.labels, [0] * 4 + [1] * 5 + [2] * 2)


def test_crc_of_multi_part_payload_matches(tmp_path):
    """A payload split at an aligned magic reads back whole, through the packed path."""
    image = np.random.default_rng(2).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    png = png_with_magic(encode(image, ".png"), base=24)
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "m.png").write_bytes(png)
    out = tmp_path / "out"
    build(BuildConfig(src=tmp_path / "src", out=out, format="recordio"))
    rec = (out / "shard-00000.rec").read_bytes()
    (lrec,) = struct.unpack_from("<I", rec, 4)
    assert lrec >> 29 == 1  # a first part: the writer split the payload
    ds = RecordIODataset(out, decode="bytes", verify_crc=True)
    assert ds[0][0] == png
    np.testing.assert_array_equal(RecordIODataset(out)[0][0], rgb(image))


def png_with_magic(png: bytes, *, base: int) -> bytes:
    """`png` with a private ancillary chunk that holds the RecordIO magic at a position that
    is a multiple of 4 once the image follows `base` header bytes in a payload."""
    for pad in range(4):
        body = b"x" * pad + MAGIC_BYTES + b"tail"
        chunk = struct.pack(">I", len(body)) + b"prVt" + body
        chunk += struct.pack(">I", zlib.crc32(b"prVt" + body))
        data = png[:33] + chunk + png[33:]
        pos = data.find(MAGIC_BYTES)
        if (base + pos) % 4 == 0 and data.count(MAGIC_BYTES) == 1:
            return data
    raise AssertionError("no padding aligns the magic")
