"""Per-input problems and notes: a path, a stable reason code and a message.

A `Problem` is an input that was NOT packed (one line of ``errors.jsonl``); a `Note` is an
input that WAS packed but that the user should know about (one line of ``warnings.jsonl``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Stable reason codes of skipped inputs; errors.jsonl and the tests rely on them.
EMPTY = "empty"  # zero-byte file
UNREADABLE = "unreadable"  # open/read failed, or the file vanished after the scan
NOT_IMAGE = "not_image"  # content is not a known image format
UNDECODABLE = "undecodable"  # looks like an image but does not decode
TRUNCATED = "truncated"  # JPEG/PNG whose end marker is missing
TOO_MANY_PIXELS = "too_many_pixels"  # header dimensions above --max-pixels: never decoded
CHANGED = "changed"  # the file changed while it was being read (a torn read)
NOT_REGULAR = "not_regular"  # FIFO, socket, device: never opened
BROKEN_LINK = "broken_link"  # a symlink to nothing
SYMLINK_LOOP = "symlink_loop"  # a directory reached twice through links
OUTSIDE_SRC = "outside_src"  # a link or list entry that leaves SRC
BAD_NAME = "bad_name"  # a name that is not UTF-8 or holds a tab or newline
NO_LABEL = "no_label"  # labels required but this image has none
MISSING = "missing"  # a list entry whose file does not exist
DUPLICATE = "duplicate"  # a list entry seen before
BAD_LINE = "bad_line"  # a list-file line that does not parse
BAD_LABEL = "bad_label"  # a label that is not UTF-8 text, not a finite number, or not parsable
EXTRA_MEMBER = "extra_member"  # not packed: a 2nd image in a tar sample, a key past num-samples
DAMAGED = "damaged"  # a stretch of an input file that does not parse (a damaged tar header)

# The message of a no_label problem whose label source gave no reason of its own.
NO_LABEL_MESSAGE = "an image outside every class folder (labels from dirname)"

# Stable reason codes of packed inputs with a caveat (warnings.jsonl).
EXTENSION_MISMATCH = "extension_mismatch"  # content is another image format than the name says
EXIF_ORIENTATION = "exif_orientation"  # an EXIF orientation other than 1 (see packer/prepare.py)
NAME_COLLISION = "name_collision"  # same path as another one when case/Unicode form is ignored
DECODE_WARNING = "decode_warning"  # the decoder warned, the image is whole (decode_check.py)
WH_MISMATCH = "wh_mismatch"  # convert: a foreign LMDB's wh-%09d disagrees with the image's size

NOTE_REASONS = frozenset(
    {EXTENSION_MISMATCH, EXIF_ORIENTATION, NAME_COLLISION, DECODE_WARNING, WH_MISMATCH}
)

# The file of a packed dataset that lists the notes: readers.formats.layout.WARNINGS_NAME.


@dataclass(frozen=True)
class Problem:
    """One input that was not packed, and why."""

    path: str
    reason: str
    message: str

    def as_json(self) -> dict[str, str]:
        """Return the problem as a JSON object: path, reason and message."""
        return {"path": self.path, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class Note:
    """One input that was packed as it is, with something worth knowing about it."""

    path: str
    reason: str
    message: str

    def as_json(self, sample_id: int | None = None) -> dict[str, Any]:
        """Return the ``warnings.jsonl`` object of this warning.

        It holds path, reason, message, ``packed: true`` and the sample id when given.
        """
        obj: dict[str, Any] = {"path": self.path, "reason": self.reason, "message": self.message}
        obj["packed"] = True
        if sample_id is not None:
            obj["id"] = sample_id
        return obj
