"""An accounting file's bytes as numbered lines: the pure reference beside its compiled twin (`_read.c`).

The follower (`producers/ocs/follow.py`) reads the file in blocks and hands each block's complete lines on;
cutting them is the hot loop of reading a large file from the start, so `_read.c` does it where it is built,
and this module is the reference it must equal (tests/test_compiled_ocs.py holds the two equal).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec

from hpcbus.schemas.native import extension

__all__ = ["RawLine", "split_lines", "split_lines_pure"]


class RawLine(msgspec.Struct, frozen=True, gc=False):
    """One complete line (a struct: built in C, thousands per chunk)."""

    number: int
    """1-based line number in the file."""
    start: int
    """Byte offset of the line's first byte."""
    end: int
    """Byte offset just after its newline."""
    text: bytes
    """The line without its newline."""


def split_lines_pure(body: bytes, number: int, offset: int) -> tuple[list[RawLine], int, int]:
    """The lines of `body` that end in a newline, numbered on from `number` (the line before them) and placed
    from byte `offset`; the last one's number and the offset after it. The reference of `split_lines`."""
    lines: list[RawLine] = []
    for text in body.split(b"\n")[:-1]:
        number += 1
        after = offset + len(text) + 1
        lines.append(RawLine(number, offset, after, text))
        offset = after
    return lines, number, offset


_read = extension("hpcbus.schemas.ocs._read")
split_lines: Callable[[bytes, int, int], tuple[list[RawLine], int, int]] = (
    split_lines_pure if _read is None else functools.partial(_read.split_lines, RawLine)
)
"""`split_lines_pure`, compiled where the extension is built (`schemas/ocs/_read.c`): the same lines."""
