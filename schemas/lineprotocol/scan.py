"""The InfluxDB sink's line scan: every line of a payload as its canonical text, or as a `Line`, or a problem.

A node agent's metric lines arrive in canonical form (`format_line`'s text: measurement, tags, one numeric
`value`, seconds), and a writer forwards that text as it came (`Parsed.texts`). Checking such a line needs no
`Line`, no dict, no float: the compiled scan (`_scan.c`, a C extension on the stable ABI, built when a
compiler is there: setup.py) checks every rule the pure path checks on that shape and returns the text; any
line it is not sure of goes to the pure path (`parse.parse_numbered`), which decides and names the problem.
Without the extension, or with `HPCBUS_PURE=1` in the environment (tests, comparisons), `scan` is
`scan_pure`, built on `parse_payload`; both give equal results (tests/test_compiled_scan.py).

Why C and not mypyc: mypyc-compiled parse and translate modules ran at the same speed (the time is in
str/dict work and in building Python objects, which mypyc keeps), and mypyc cannot compile a module that
defines `msgspec.Struct`s (issue 24).

`consume influx` reads every message with it on its compiled path (`schemas.influxbody`: `Bodies.read` keeps
`items`); the compiled splice (`schemas/_influxdb.c`) then writes each canonical text as the sink's Python
rules would (the cluster spliced in after its measurement, or as it came when it carries it; a node-level
line with `type-id=0`; the value's int/float kind the one the sink writes it in; process lines to aggregate
folded by its `fold`), and hands every other item to those rules (`line_of` gives a text's `Line`). The
sink's worker then spends about 0.3x of bare `parse_line`'s CPU per line, 0.44x on a node agent's metric
messages (bench/consumer.py; the pure path: about 1.3x and 3.5x).
"""

from __future__ import annotations

import msgspec
from line_protocol_parser import parse_line

from hpcbus.schemas.lineprotocol.model import Line
from hpcbus.schemas.lineprotocol.parse import parse_payload, read_with_rest
from hpcbus.schemas.native import extension
from hpcbus.schemas.problems import Problem

_scan = extension("hpcbus.schemas.lineprotocol._scan")


class Scanned(msgspec.Struct):
    """One payload read: per kept line, in order, its canonical text (forward it as it is) or, when the
    line must be formatted again (repaired, ns timestamp, node level put in its bus form...), its `Line`;
    and the problems (errors and warnings) of the payload, in line order."""

    items: list[str | Line]
    problems: list[Problem]


def scan_pure(payload: bytes | str, *, now: int, place: str = "", max_future: int | None = None) -> Scanned:
    """`scan` on the pure path: `parse_payload`, each kept line as its text when it has one."""
    parsed = parse_payload(payload, now=now, place=place, max_future=max_future)
    items: list[str | Line] = [text or line for line, text in zip(parsed.lines, parsed.texts, strict=True)]
    return Scanned(items, parsed.problems)


def scan_compiled(
    payload: bytes | str, *, now: int, place: str = "", max_future: int | None = None
) -> Scanned:
    """`scan` on the compiled path (the extension must be there): canonical lines by the C scan, every
    other line by the pure path, alone (`parse_numbered`), in its place. A `str` payload goes the pure way
    (the wire gives bytes)."""
    if _scan is None or not isinstance(payload, bytes):
        return scan_pure(payload, now=now, place=place, max_future=max_future)
    items, problems = read_with_rest(
        _scan.scan, payload, _text_or_line, now=now, place=place, max_future=max_future
    )
    return Scanned(items, problems)


def _text_or_line(line: Line, text: str) -> str | Line:
    """What `scan` keeps of a line the pure path read: its text when it has one (`Scanned.items`)."""
    return text or line


def line_of(text: str) -> Line:
    """The `Line` of a canonical text that `scan` returned: what the pure path built for it. For a writer's
    less usual cases (a node-level line, a process line to aggregate, a value of the other type), where the
    text alone is not what it writes."""
    d = parse_line(text)
    return Line(d["measurement"], d["tags"], d["fields"], d["time"])


scan = scan_compiled if _scan is not None else scan_pure
"""Read a payload: `scan_compiled` where the extension is built, else `scan_pure`."""
