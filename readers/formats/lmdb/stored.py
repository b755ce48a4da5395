"""LMDB records as stored, for conversion: a bare PaddleOCR-layout LMDB, or a packed shard."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from readers.errors import DatasetFormatError
from readers.formats.base import StatedSize, StoredItem, StoredProblem, StoredRecords
from readers.formats.lmdb.env import shared_lmdb
from readers.formats.lmdb.keys import (
    DATA_FILE,
    NUM_SAMPLES_KEY,
    image_key,
    label_key,
    parse_wh,
    wh_key,
)


def bare_count(root: Path, txn: Any, entries: int) -> int:
    """The ``num-samples`` of a bare LMDB, checked against the environment's entry count.

    Raises:
        DatasetFormatError: no decimal count, or one that the LMDB cannot hold.
    """
    raw = txn.get(NUM_SAMPLES_KEY)
    text = None if raw is None else bytes(raw).decode("ascii", "replace").strip()
    if text is None or not text.isdigit():
        raise DatasetFormatError(
            f"{root}: an LMDB whose 'num-samples' is {text!r}; expected the PaddleOCR "
            "layout (num-samples as a decimal count, image-%09d, label-%09d)"
        )
    count = int(text)
    if count > entries - 1:  # every sample is one image key besides num-samples
        raise DatasetFormatError(
            f"{root}: 'num-samples' says {count} samples, but the LMDB holds only {entries} "
            f"keys in all (num-samples included), too few for {count} image-%09d keys; "
            "is num-samples wrong?"
        )
    return count


def bad_label_text(key: bytes, raw: bytes) -> StoredProblem | None:
    """Return why the stored label `raw` (of `key`) is not a text label, or None when it is.

    Labels are never decoded with replacement characters: two different GBK or Latin-1
    labels would become the same ``"����"``. The bytes are shown escaped instead.
    """
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = repr(raw[:48]) + ("..." if len(raw) > 48 else "")
        return StoredProblem(
            "bad_label",
            f"{key.decode()} is not UTF-8 text ({exc.reason} at byte {exc.start}): {shown}; "
            "re-encode the labels as UTF-8 (GBK or Latin-1 labels are not guessed)",
        )
    return None


def bare_records(root: Path) -> StoredRecords:
    """The ``image-%09d`` values of the bare LMDB at `root` with their ``label-%09d`` texts.

    Labels are kept as the text stored (a scene-text LMDB's transcriptions). A label that is
    not UTF-8 is a ``bad_label`` problem (its bytes shown escaped, never replaced); an image
    without a label key is a ``no_label`` problem, unless no image has one (then every label
    is null and the label source ``none``). An image key past ``num-samples`` is listed as
    not converted. The sizes come from the values' lengths, without reading the values; the
    ``wh-%09d`` values, where the LMDB has them, are its `StoredRecords.stated_sizes`.

    Raises:
        DatasetFormatError: not an LMDB with a ``num-samples`` key, or one whose count exceeds
            what the environment holds.
    """
    env = shared_lmdb(str(root))  # the process's one handle of it (py-lmdb allows one)
    with env.begin(buffers=True) as txn:
        count = bare_count(root, txn, int(env.stat()["entries"]))
        sizes = []
        has_labels = False  # whether any image has a label key: looked up until one has
        for local in range(1, count + 1):
            value = txn.get(image_key(local))
            sizes.append(0 if value is None else len(value))
            has_labels = has_labels or txn.get(label_key(local)) is not None
        problems = _beyond_count(txn, count)

    def read(start: int, stop: int) -> Iterator[StoredItem]:
        with env.begin(buffers=True) as txn:
            for local in range(start + 1, stop + 1):
                value = txn.get(image_key(local))
                if value is None:
                    yield f"the key {image_key(local).decode()} is missing"
                    continue
                raw = txn.get(label_key(local))
                if raw is None:
                    if has_labels:
                        yield StoredProblem(
                            "no_label",
                            f"no {label_key(local).decode()} key beside the image (the other "
                            "images have labels)",
                        )
                    else:
                        yield bytes(value), None
                    continue
                raw = bytes(raw)
                bad = bad_label_text(label_key(local), raw)
                yield bad if bad is not None else (bytes(value), raw.decode("utf-8"))

    def stated_sizes(start: int, stop: int) -> Iterator[StatedSize | None]:
        with env.begin() as txn:
            for local in range(start + 1, stop + 1):
                raw = txn.get(wh_key(local))
                if raw is None:
                    yield None
                    continue
                shown = f"{wh_key(local).decode()} is {raw[:40].decode('ascii', 'replace')!r}"
                yield StatedSize(shown, parse_wh(raw))

    names = [image_key(local).decode() for local in range(1, count + 1)]
    return StoredRecords(
        [root / DATA_FILE],
        names,
        sizes,
        read,
        label_source="label-%09d" if has_labels else "none",
        problems=problems,
        stated_sizes=stated_sizes,
    )


def _beyond_count(txn: Any, count: int) -> list[StoredProblem]:
    """The image keys past ``num-samples`` (PaddleOCR never reads them): not converted."""
    found = []
    with txn.cursor() as cursor:
        if cursor.set_range(image_key(count + 1)):
            for key in cursor.iternext(keys=True, values=False):
                key = bytes(key)
                if not key.startswith(b"image-"):
                    break
                found.append(
                    StoredProblem(
                        "extra_member",
                        f"the LMDB's num-samples is {count}: {key.decode()} is past it "
                        "(readers of the PaddleOCR layout never see it); not converted",
                        key.decode(),
                    )
                )
    return found


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
