"""The RecordIO shard format, byte-compatible with MXNet/dmlc.

It covers ``.rec`` records holding MXNet image records, ``.idx`` offsets, how a shard is opened
and how a bare ``.rec`` is recognised.

The byte layout lives in ``records`` (record framing), ``images`` (``IRHeader`` payloads, the
header label an index label becomes, and header peeking), ``idx`` (``.idx`` files and finding a
``.rec``/``.idx`` pair) and ``ids`` (rewriting a finished shard's ids in place). This
package imports no paddle and no packer.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from readers import handles
from readers.formats.base import ShardFormat, StoredRecords
from readers.formats.recordio.ids import IR_ID_OFFSET, rewrite_ids
from readers.formats.recordio.idx import (
    IDX_SUFFIX,
    REC_SUFFIX,
    find_recordio_pair,
    format_idx_line,
    read_idx,
)
from readers.formats.recordio.images import (
    IR_FIELDS,
    IR_HEADER,
    IRHeader,
    cut_short,
    header_at,
    header_label,
    image_record_bound,
    image_record_size,
    ir_field,
    pack_image_record,
    pack_labelled_image,
    unpack_image_record,
)
from readers.formats.recordio.records import (
    HEAD_SIZE,
    MAGIC,
    MAGIC_BYTES,
    MAX_PART,
    MAX_PAYLOAD,
    RECORD_HEAD,
    Buffer,
    RecordFileWriter,
    RecordIOError,
    RecordIOFormatError,
    RecordTooLargeError,
    check_payload_size,
    decode_lrec,
    encode_lrec,
    encode_record,
    iter_records,
    read_record_at,
    scan_offsets,
    view_record_at,
)

__all__ = [
    "FORMAT",
    "HEAD_SIZE",
    "IDX_SUFFIX",
    "IR_FIELDS",
    "IR_HEADER",
    "IR_ID_OFFSET",
    "MAGIC",
    "MAGIC_BYTES",
    "MAX_PART",
    "MAX_PAYLOAD",
    "RECORD_HEAD",
    "REC_SUFFIX",
    "Buffer",
    "IRHeader",
    "RecordFileWriter",
    "RecordIOError",
    "RecordIOFormat",
    "RecordIOFormatError",
    "RecordTooLargeError",
    "check_payload_size",
    "cut_short",
    "decode_lrec",
    "encode_lrec",
    "encode_record",
    "find_recordio_pair",
    "format_idx_line",
    "header_at",
    "header_label",
    "image_record_bound",
    "image_record_size",
    "ir_field",
    "iter_records",
    "open_rec_readonly",
    "pack_image_record",
    "pack_labelled_image",
    "read_idx",
    "read_record_at",
    "rewrite_ids",
    "scan_offsets",
    "shared_rec",
    "unpack_image_record",
    "view_record_at",
]


def open_rec_readonly(path: str) -> mmap.mmap | bytes:
    """Map a ``.rec`` read-only, for one pass (the caller closes it); see ``handles``."""
    return handles.open_mmap_readonly(path)


def shared_rec(path: str) -> mmap.mmap | bytes:
    """The process's shared read-only mapping of the ``.rec`` at `path`."""
    return handles.shared_mmap(path)


class RecordIOFormat(ShardFormat):
    """RecordIO shards: a ``.rec`` file and its ``.idx`` per shard."""

    name = "recordio"
    title = "RecordIO"
    summary = "MXNet/dmlc .rec/.idx shards of MXNet image records"
    bare_hint = f"a RecordIO file ({REC_SUFFIX} with its {IDX_SUFFIX})"
    dataset = "readers.datasets.recordio:RecordIODataset"
    offsets_locate_records = True

    def shard_path(self, root: Path, shard: str) -> str:
        """Return the path of the ``.rec`` file of `shard` under `root`."""
        return str(root / f"{shard}{REC_SUFFIX}")

    def shard_files(self, shard: str) -> tuple[str, ...]:
        """Return the files of `shard`, relative to the dataset: its ``.rec`` and ``.idx``."""
        return (f"{shard}{REC_SUFFIX}", f"{shard}{IDX_SUFFIX}")

    def open_shard(self, path: str) -> Any:
        """Return the shared read-only handle of the ``.rec`` at `path`."""
        return shared_rec(path)

    def find_bare(self, path: Path) -> tuple[Path, Path | None] | None:
        """Return the ``.rec`` / ``.idx`` pair that `path` names, or None."""
        return find_recordio_pair(path)

    def stored_records(self, found: tuple[Path, Path | None]) -> StoredRecords:
        """Return the image records of the bare pair `found`, as stored."""
        from readers.formats.recordio.bare import bare_records

        return bare_records(found, shared_rec(str(found[0])))

    def read_stored(
        self, shard_path: str, positions: Sequence[int], offsets: Sequence[int]
    ) -> Iterator[bytes]:
        """Return the image bytes of the records at `offsets` of the shard at `shard_path`."""
        from readers.formats.recordio.bare import read_stored

        return read_stored(shared_rec(shard_path), offsets)

    def near_miss(self, path: Path) -> str | None:
        """Say why `path` is almost, but not, a bare RecordIO file, or None."""
        if path.is_dir():
            recs = sorted(p.name for p in path.glob(f"*{REC_SUFFIX}") if p.is_file())
            if len(recs) > 1:
                return f"{len(recs)} {REC_SUFFIX} files {recs[:10]}; name the one to open"
        elif path.is_file() and path.suffix == IDX_SUFFIX:
            return f"a {IDX_SUFFIX} without its {REC_SUFFIX}"
        return None


FORMAT = RecordIOFormat()
