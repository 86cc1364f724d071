"""Reading a command's input (PATH or `-`): which kind it is, and its contents in constant memory.

Shared by `hpcbus validate` and `hpcbus translate`, so that both detect Sonar JSON and line protocol alike and
number lines alike: a problem `translate` reports names the line `validate` would name.

Input is read as bytes, in blocks of whole lines of at most about `BLOCK_BYTES`: from a file that is a
megabyte at a time, from a pipe whatever has arrived (so a live stream is handled as it comes rather than
when a buffer fills). Line protocol goes to `parse_payload` as bytes, which reports a line that is not UTF-8
and keeps the rest; a Sonar line that is not UTF-8 is reported here and its bad bytes become NUL, which JSON
forbids, so the envelope holding them is rejected rather than read with guessed characters.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import msgspec

from hpcbus.schemas.problems import Problem

if TYPE_CHECKING:  # the CLI imports every command to build its parser: codecs load when a command runs
    from hpcbus.schemas.lineprotocol import Parsed
    from hpcbus.schemas.sonar.validate import Envelope

BLOCK_BYTES = 1 << 20
"""Bytes asked for per read; a block is longer only by the rest of a line longer than that."""
LP_CHUNK_LINES = 20_000
"""At most this many lines of line protocol go to one `parse_payload` call."""
PEEK_BYTES = 1 << 20
"""Input that is only blank or `#` lines this far is line protocol (comments are line protocol, never JSON)."""

_MEANINGFUL = re.compile(rb"^[ \t\r\f\v]*([^\s#])", re.MULTILINE)
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


@contextlib.contextmanager
def input_blocks(path: str) -> Iterator[Iterator[bytes]]:
    """The blocks of PATH (`-`: standard input), read as they are needed. Each ends with a newline, except the
    input's last when its last line has none. Raises OSError when the file cannot be opened."""
    if path != "-":
        with open(path, "rb") as f:
            yield _whole_lines(f.read1)
        return
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        yield _whole_lines(buffer.read1)
    else:  # a text stream standing in for stdin (tests)
        text = sys.stdin
        yield _whole_lines(lambda n: text.read(n).encode("utf-8", "surrogateescape"))


def _whole_lines(read: Callable[[int], bytes]) -> Iterator[bytes]:
    rest: list[bytes] = []
    while data := read(BLOCK_BYTES):
        end = data.rfind(b"\n") + 1
        if not end:
            rest.append(data)
            continue
        if rest:
            rest.append(data[:end])
            yield b"".join(rest)
        else:
            yield data if end == len(data) else data[:end]
        rest = [data[end:]] if end < len(data) else []
    if rest:
        yield b"".join(rest)


def sniff(blocks: Iterator[bytes]) -> tuple[str, Iterator[bytes]]:
    """(`sonar`, `lp` or "" for empty input, all the blocks): `{` or `[` as the first character that is not
    white space nor in a `#` comment line means Sonar JSON, anything else line protocol."""
    head: list[bytes] = []
    size = 0
    kind = ""
    for block in blocks:
        head.append(block)
        m = _MEANINGFUL.search(block)
        if m is not None:
            kind = "sonar" if m[1] in b"{[" else "lp"
            break
        size += len(block)
        if size >= PEEK_BYTES:
            kind = "lp"
            break
    return kind, itertools.chain(head, blocks)


def lp_chunks(
    blocks: Iterable[bytes],
    place: str,
    now: int,
    chunk_lines: int | None = None,
    max_future: int | None = None,
) -> Iterator[Parsed]:
    """`parse_payload` of each block (cut to at most `chunk_lines` lines, default LP_CHUNK_LINES read at call
    time), every problem's line counted from the start of the input. `now` (epoch s) stands in for missing
    timestamps; with `max_future`, times outside 2000-01-01 .. now + max_future are problems."""
    from hpcbus.schemas.lineprotocol import parse_payload

    offset = 0
    for block in blocks:
        for chunk in _at_most(block, LP_CHUNK_LINES if chunk_lines is None else chunk_lines):
            parsed = parse_payload(chunk, now=now, place=place, max_future=max_future)
            if offset:
                parsed.problems = [msgspec.structs.replace(p, line=p.line + offset) for p in parsed.problems]
            offset += chunk.count(b"\n")
            yield parsed


def _at_most(block: bytes, n: int) -> Iterator[bytes]:
    if block.count(b"\n") <= n:
        yield block
        return
    start = pos = 0
    while True:
        for _ in range(n):
            pos = block.find(b"\n", pos) + 1
            if not pos:
                if start < len(block):
                    yield block[start:]
                return
        yield block[start:pos]
        start = pos


def sonar_envelopes(
    blocks: Iterable[bytes], place: str, latest: int | None = None
) -> Iterator[tuple[int, Envelope] | list[Problem]]:
    """Every valid envelope of a Sonar input (one envelope, JSONL, or pretty-printed back to back) with the
    line it starts on, and in its place the problems of each invalid one, in input order; memory holds one
    envelope at a time. `latest` (now + max_future): envelope times outside [2000-01-01, latest] are
    problems, as at the workers (`decode_envelope`)."""
    from hpcbus.schemas.problems import InvalidInput
    from hpcbus.schemas.sonar.validate import iter_envelopes_from_lines

    undecodable: list[Problem] = []

    def texts() -> Iterator[str]:
        number = 0
        for block in blocks:
            lines = block.split(b"\n")
            if not lines[-1]:
                lines.pop()
            for raw in lines:
                number += 1
                try:
                    yield raw.decode()
                except UnicodeDecodeError as exc:
                    reason = f"not UTF-8 ({exc.reason} at byte {exc.start})"
                    undecodable.append(Problem(reason, place, number, "sonar"))
                    yield _NOT_UTF8.sub("\x00", raw.decode("utf-8", "surrogateescape"))

    for start, result in iter_envelopes_from_lines(texts(), latest=latest):
        if undecodable:
            yield undecodable[:]
            undecodable.clear()
        if isinstance(result, InvalidInput):
            yield [p.located(place) for p in result.problems]  # lines are absolute already
        else:
            yield start, result
    if undecodable:
        yield undecodable
