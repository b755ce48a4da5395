"""A byte range of an object as it was received: the body's chunks, never joined.

A ranged GET's body arrives in chunks of up to a few hundred KB. Joining them into one buffer
would copy every byte once more and take fresh memory for it (page faults cost more than the
copy); `Piece` keeps the chunks and serves a range that lies inside one chunk from that chunk,
without a copy, and joins only a range that crosses chunk ends (a record cut by a chunk end:
a few in a hundred, of small records).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

__all__ = ["Piece"]


class Piece:
    """Bytes ``[begin, end)`` of an object, held as the chunks that were received.

    Args:
        begin: the object offset of the first byte.
        chunks: the bytes, in order (immutable ``bytes``: views of them stay valid).
    """

    __slots__ = ("begin", "chunks", "end", "starts")

    def __init__(self, begin: int, chunks: Sequence[bytes]) -> None:
        self.begin = begin
        self.chunks = [chunk for chunk in chunks if chunk]
        starts = [begin]
        for chunk in self.chunks:
            starts.append(starts[-1] + len(chunk))
        self.starts = starts
        self.end = starts[-1]

    def __len__(self) -> int:
        return self.end - self.begin

    def locate(self, begin: int, end: int) -> tuple[Any, int]:
        """A buffer holding object bytes ``[begin, end)`` and where they start in it.

        The chunk that holds them all, or a new buffer of just them when they cross a chunk end.
        `begin` and `end` must lie inside the piece.
        """
        k = bisect_right(self.starts, begin) - 1
        if end <= self.starts[k + 1]:
            return self.chunks[k], begin - self.starts[k]
        return self.bytes(begin, end), 0

    def bytes(self, begin: int, end: int) -> bytes:
        """A copy of object bytes ``[begin, end)`` (clipped to the piece)."""
        begin, end = max(begin, self.begin), min(end, self.end)
        if begin >= end:
            return b""
        starts, chunks = self.starts, self.chunks
        k = bisect_right(starts, begin) - 1
        if end <= starts[k + 1]:
            chunk = chunks[k]
            a = begin - starts[k]
            return chunk if a == 0 and end - begin == len(chunk) else chunk[a : a + end - begin]
        parts = []
        while begin < end:
            a, b = begin - starts[k], min(end, starts[k + 1]) - starts[k]
            parts.append(memoryview(chunks[k])[a:b])
            begin = starts[k + 1]
            k += 1
        return b"".join(parts)
