"""Reading the LP -> Sonar translator's input: a payload's lines as `Line`s, and its problems.

`read_payload` is what `parse_payload` returns for the lines and problems (`Parsed.texts` is left empty:
the translator never forwards a line's text). With the compiled twin (`_place.c`, a C extension on the
stable ABI, built when a compiler is there: setup.py) the ordinary metric lines, nearly all of a node's
sample, are built as `Line`s straight from the bytes, and every other line goes to the pure path alone
(`parse.parse_numbered`), which decides it and names its problem exactly as `parse_payload` does. Without
the extension, or with `HPCBUS_PURE=1`, `read_payload` is `read_pure` (`parse_payload` itself); both give
equal results (tests/test_compiled_place.py).

Why: reading was two thirds of the translator's time (the C parser's dict per line, then the checks and the
`Line` in Python); built in C from the bytes, a line costs less than the bare parser's dict, and the
placer (`lp_to_sample`, `lp_placer`) reads the same `Line`s as before.
"""

from __future__ import annotations

from hpcbus.schemas.lineprotocol import Line, Parsed, parse_payload
from hpcbus.schemas.lineprotocol.parse import read_with_rest
from hpcbus.schemas.native import extension

__all__ = ["read_compiled", "read_payload", "read_pure"]

_place = extension("hpcbus.schemas.translate._place")


def read_pure(payload: bytes | str, *, now: int, place: str = "", max_future: int | None = None) -> Parsed:
    """`read_payload` on the pure path: `parse_payload`, its `texts` dropped."""
    parsed = parse_payload(payload, now=now, place=place, max_future=max_future)
    return Parsed(parsed.lines, parsed.problems, [])


def read_compiled(
    payload: bytes | str, *, now: int, place: str = "", max_future: int | None = None
) -> Parsed:
    """`read_payload` on the compiled path (the extension must be there): canonical metric lines built by C,
    every other line by the pure path, alone (`parse_numbered`), in its place. A `str` payload goes the pure
    way (the wire gives bytes)."""
    if _place is None or not isinstance(payload, bytes):
        return read_pure(payload, now=now, place=place, max_future=max_future)
    lines, problems = read_with_rest(_read_lines, payload, _line, now=now, place=place, max_future=max_future)
    return Parsed(lines, problems, [])


def _read_lines(payload: bytes, earliest: int, end: int) -> tuple[list[Line | int], int, bool]:
    """The C reader (`_place.read`), building `Line`s."""
    assert _place is not None
    return _place.read(payload, earliest, end, Line)


def _line(line: Line, text: str) -> Line:
    """What the translator keeps of a line the pure path read: the line."""
    return line


read_payload = read_compiled if _place is not None else read_pure
"""Read a payload for the translator: `read_compiled` where the extension is built, else `read_pure`."""
