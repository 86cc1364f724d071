"""The memory request bodies hold: a budget for all of them together, and giving memory back after.

`max_body` bounds one body, `max_requests` how many are read at once, but their product (32 x 32 MiB) is
more than a gateway should take: 32 authenticated gzip bombs at once took it to 1.1 GB. `BodyMemory` counts
the inflated bytes every request holds (`take` as they come, `release` when the request ends) against
`max_body_memory`; the request that would pass it is refused (503), not the others.

What is freed is not given back to the system by itself: glibc keeps freed blocks of the heap and of its
per-thread arenas for reuse (and raises its threshold for using `mmap` once large blocks were freed), so the
gateway stayed at its peak after the bombs. Once bodies of `TRIM_AFTER` bytes have been released and at most
`TRIM_BELOW` are held, `malloc_trim(0)` hands the free pages of every arena back (a few milliseconds; only
where the C library has it: glibc).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_AFTER = 16 * 2**20
"""Bytes of bodies released since the last trim before the next one is worth its milliseconds."""

TRIM_BELOW = 4 * 2**20
"""Bytes of bodies still held at most when trimming (while large bodies are in memory, it would give back
little that is not taken again at once)."""


def malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none (musl, other systems)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class BodyMemory:
    """Inflated body bytes held by all requests, at most `limit`; memory given back after large bodies."""

    def __init__(self, limit: int, trim: Callable[[], object] | None = None) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        """The most ever held at once (for the progress line)."""
        self.trims = 0
        self._trim = trim
        self._released = 0

    def take(self, n: int) -> bool:
        """Count `n` more bytes held; False (nothing counted) when that would pass the limit."""
        if self.held + n > self.limit:
            return False
        self.held += n
        self.peak = max(self.peak, self.held)
        return True

    def release(self, n: int) -> None:
        """`n` bytes no longer held (a request ended); the free memory given back when worth it."""
        self.held -= n
        self._released += n
        if self._trim is not None and self._released >= TRIM_AFTER and self.held <= TRIM_BELOW:
            self._released = 0
            self.trims += 1
            # after this step of the loop: the request that released is still unwinding (its refusal's
            # traceback holds the body's pieces until it is answered)
            asyncio.get_running_loop().call_soon(self._trim)
