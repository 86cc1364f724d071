"""Inflating a gzip or deflate request body in bounded pieces.

zlib inflates 1 KiB of a gzip bomb to about 1 MiB; one `decompress` call on a 64 KiB chunk of one would hold
the event loop for tens of milliseconds and produce 64 MiB. Here no call produces more than `step` bytes
(`max_length`), so the caller can count the size against its limit after each piece, stop there, and let
other clients run between pieces.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""`Content-Encoding` -> zlib's `wbits` (InfluxDB takes gzip; deflate is what aiohttp took too)."""


class Inflater:
    """`pieces(chunk)` for each compressed chunk in order, then `complete` says whether the stream ended.
    A body of several gzip members (concatenated files) inflates to their concatenation, as `gzip -d`
    does. `zlib.error` for data that is not of the encoding."""

    def __init__(self, encoding: str, step: int) -> None:
        self.wbits = WBITS[encoding]
        self.step = step
        self.seen = False
        self._z = zlib.decompressobj(self.wbits)

    def pieces(self, chunk: bytes) -> Iterator[bytes]:
        """The inflated bytes of `chunk`, at most `step` at a time (and none after the caller stops)."""
        pending = chunk
        self.seen = self.seen or bool(chunk)
        while True:
            if self._z.eof:  # the next member
                if not pending:
                    return
                self._z = zlib.decompressobj(self.wbits)
            out = self._z.decompress(pending, self.step)
            pending = self._z.unconsumed_tail or (self._z.unused_data if self._z.eof else b"")
            if out:
                yield out
            # output cut at `step` may leave more inside zlib even when all input was taken
            if not pending and (len(out) < self.step or self._z.eof):
                return

    @property
    def complete(self) -> bool:
        """The compressed stream ended (or there was none: an empty body)."""
        return self._z.eof or not self.seen
