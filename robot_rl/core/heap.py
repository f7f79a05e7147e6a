"""The C heap of processes that handle camera frames by the hundred: big blocks straight from the system.

Why: a decoded 640x480 frame is 0.9 MB. glibc serves a block that big with its own ``mmap`` (handed
back to the system when freed) only until the first such block is freed: from then on its threshold
rises past that size and frames come from the heap's arenas, one per thread that decodes, where what is
freed stays with the process, fragmented. A learner decoding two robots' cameras on several threads
then grows by hundreds of MB that nothing holds. A fixed threshold keeps every frame-sized block a
mapping of its own: freed, it is gone. What it costs, a fresh mapping's page faults per frame (~0.1 ms
for 0.9 MB), is a few percent of a core at 240 frames/s.

``release_free_heap`` hands back what the arenas do hold free (``malloc_trim``), for a process that
still allocates below the threshold by the thousand. Both are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import functools

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
# Blocks from this size on get a mapping of their own: a 64x64 frame (12 kB) stays on the heap, a
# segment's 640x480 frames (0.9 MB each) never do.
BIG_BLOCK_BYTES = 256 << 10


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def map_big_blocks() -> None:
    """From now on blocks of ``BIG_BLOCK_BYTES`` and more are mapped and unmapped one by one (this process)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, BIG_BLOCK_BYTES)


def release_free_heap() -> None:
    """glibc's ``malloc_trim``: the heap's free pages back to the system."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
