"""Per-input problems: a path, a stable reason code and a message, as in errors.jsonl."""

from __future__ import annotations

from dataclasses import dataclass

# Stable reason codes; errors.jsonl and the tests rely on them.
EMPTY = "empty"  # zero-byte file
UNREADABLE = "unreadable"  # open/read failed
NOT_IMAGE = "not_image"  # content is not a known image format
UNDECODABLE = "undecodable"  # looks like an image but does not decode
TRUNCATED = "truncated"  # JPEG/PNG whose end marker is missing
NOT_REGULAR = "not_regular"  # FIFO, socket, device: never opened
BROKEN_LINK = "broken_link"  # a symlink to nothing
SYMLINK_LOOP = "symlink_loop"  # a directory reached twice through links
OUTSIDE_SRC = "outside_src"  # a link or list entry that leaves SRC
BAD_NAME = "bad_name"  # a name that is not UTF-8 or holds a tab or newline
NO_LABEL = "no_label"  # labels required but this image has none
MISSING = "missing"  # a list entry whose file does not exist
DUPLICATE = "duplicate"  # a list entry seen before
BAD_LINE = "bad_line"  # a list-file line that does not parse


@dataclass(frozen=True)
class Problem:
    """One input that was not packed, and why."""

    path: str
    reason: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason, "message": self.message}
