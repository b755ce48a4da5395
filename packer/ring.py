"""Shared memory in which a build's pool processes hand back the bytes they read and checked.

A pool process that prepares images for the shard written in the main process reads and
checks each image; the main process needs the same bytes to store. Sending them through the
pool's pipe (pickled, copied into and out of the kernel, unpickled by the pool's result thread)
cost more than reading each file again, and reading it again costs an open, a path check, two
fstats and a CRC in the one process that every image passes through. A `ByteRing` is one
anonymous shared mapping, made before the pool forks and so mapped in every pool process
(also one the pool starts later: it comes with the initializer's arguments): batch ``k`` of
the in-flight batches owns slot ``k % slots``; its pool process copies each record's bytes
into the slot, and the main process copies them out when it takes the batch's results, before
the slot is handed to another batch. Bytes that do not fit in the slot (large images) are left
out as before, and read again with their CRC checked (`packer.prepare.restore_bytes`).

Only where processes fork: a spawned process cannot share the mapping, and gets no ring.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

SLOT_BYTES = 16 << 20
"""The most bytes a batch hands back through its slot (a batch of 64 KB images fits)."""
RING_BYTES = 256 << 20
"""The most address space a ring takes; pages are used only where a batch wrote."""


class ByteRing:
    """``slots`` regions of shared memory, one per batch in flight (see this module)."""

    def __init__(self, slots: int) -> None:
        """Map ``slots`` regions of `SLOT_BYTES` (fewer bytes each when that exceeds RING_BYTES)."""
        self.slots = slots
        self.slot_bytes = min(SLOT_BYTES, RING_BYTES // max(slots, 1))
        # anonymous and MAP_SHARED (Python's default): forked children write the same pages
        self.memory = mmap.mmap(-1, slots * self.slot_bytes)

    def put(self, slot: int, blobs: Sequence[bytes]) -> list[int]:
        """Copy `blobs` into `slot` in order while they fit; their lengths (0: left out)."""
        memory = self.memory
        at = slot * self.slot_bytes
        end = at + self.slot_bytes
        lengths = []
        for blob in blobs:
            n = len(blob)
            if n and at + n <= end:
                memory[at : at + n] = blob
                at += n
                lengths.append(n)
            else:
                lengths.append(0)
        return lengths

    def take(self, slot: int, lengths: Sequence[int]) -> list[bytes]:
        """The bytes that `put` stored in `slot` with these `lengths` (b"" where 0)."""
        memory = self.memory
        at = slot * self.slot_bytes
        out = []
        for n in lengths:
            out.append(memory[at : at + n] if n else b"")
            at += n
        return out

    def close(self) -> None:
        """Unmap this process's view (other processes keep theirs until they exit)."""
        self.memory.close()


_worker_ring: ByteRing | None = None


def use_ring(ring: ByteRing | None) -> None:
    """In a pool process: the ring its batches hand bytes back in (None: none)."""
    global _worker_ring
    _worker_ring = ring


def worker_ring() -> ByteRing | None:
    """The ring `use_ring` gave this pool process, if any."""
    return _worker_ring
