"""sacct text -> `SacctRow`s, line by line; a bad line becomes a `Problem` and the next line is read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import tzinfo
from typing import Any, Final

from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.sacct import compiled as _compiled
from hpcbus.schemas.slurm.sacct.columns import Plan
from hpcbus.schemas.slurm.sacct.row import SacctRow

KIND: Final = "sacct"
CHUNK: Final = 1024
"""Lines the compiled reader reads a call (the rows of a chunk are built before the first is yielded)."""


def parse_sacct_line(
    line: str,
    fields: Sequence[str],
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    lineno: int = 0,
    place: str = "",
) -> SacctRow | Problem:
    """One line -> `SacctRow`, or a `Problem` naming the column and why. See `parse_sacct` (use that for
    many lines: it prepares the field list once)."""
    return _parse_line(line, Plan(fields, tz), delimiter, trailing_delimiter, lineno, place)


def _parse_line(
    line: str, plan: Plan, delimiter: str, trailing_delimiter: bool, lineno: int, place: str
) -> SacctRow | Problem:
    if trailing_delimiter:
        if not line.endswith(delimiter):
            return Problem(
                f"line does not end with the delimiter {delimiter!r} (expected sacct --parsable output)",
                place=place,
                line=lineno,
                kind=KIND,
            )
        line = line[: -len(delimiter)]
    parts = line.split(delimiter)
    width = plan.width
    if len(parts) != width:
        if len(parts) < width or not plan.joinable:
            return Problem(
                f"{len(parts)} fields, expected {width} ({delimiter.join(plan.fields)})",
                place=place,
                line=lineno,
                kind=KIND,
            )
        parts[width - 1 :] = [delimiter.join(parts[width - 1 :])]
    kw: dict[str, Any] = {"line": lineno}
    for i, attr in plan.strings:
        value = parts[i]
        if value:
            kw[attr] = value
    i = 0
    try:
        for i, attr, parse in plan.singles:
            value = parts[i]
            if value:
                kw[attr] = parse(value)
        for i, attr, attr2, parse in plan.pairs:
            value = parts[i]
            if value:
                kw[attr], kw[attr2] = parse(value)
    except ValueError as error:
        return Problem(str(error), place=place, line=lineno, kind=KIND, path=plan.fields[i])
    if plan.extras:
        extra = {name: parts[i] for i, name in plan.extras if parts[i]}
        if extra:
            kw["extra"] = extra
    if "job" not in kw and "job_id_raw" not in kw:
        return Problem(
            "no JobID or JobIDRaw: cannot tell which job this line is about",
            place=place,
            line=lineno,
            kind=KIND,
        )
    return SacctRow(**kw)


def parse_sacct(
    text_or_lines: str | Iterable[str],
    fields: Sequence[str],
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    place: str = "",
) -> Iterator[SacctRow | Problem]:
    """Parse sacct output line by line; a bad line yields a `Problem` (with its line number) and parsing
    goes on, so one odd job never hides the others.

    `fields` is the `-o` list the command was run with, in order (`SACCT_FIELDS` for Sonar's command; names
    match case-insensitively, as sacct's do; unknown names land in `SacctRow.extra`). `tz` is the zone of
    sacct's local times: required, because sacct prints no offset and guessing the host's zone is how
    timestamps end up an hour off. Blank lines are skipped, and so is a header line repeating the fields.

    Lines go through the compiled reader when it is built (`compiled.py`), each line it is not sure of
    through the pure one; `parse_sacct_pure` is the pure path alone (the reference, equal results).
    """
    return _parse(text_or_lines, fields, tz, delimiter, trailing_delimiter, place, compiled=True)


def parse_sacct_pure(
    text_or_lines: str | Iterable[str],
    fields: Sequence[str],
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    place: str = "",
) -> Iterator[SacctRow | Problem]:
    """`parse_sacct` on the pure-Python path alone, whether or not the compiled reader is built."""
    return _parse(text_or_lines, fields, tz, delimiter, trailing_delimiter, place, compiled=False)


def _parse(
    text_or_lines: str | Iterable[str],
    fields: Sequence[str],
    tz: tzinfo,
    delimiter: str,
    trailing_delimiter: bool,
    place: str,
    *,
    compiled: bool,
) -> Iterator[SacctRow | Problem]:
    if not delimiter:
        raise ValueError("the sacct delimiter must not be empty")
    plan = Plan(fields, tz)
    # None: no extension, or a field list it does not take
    fast = _compiled.row_plan(plan, delimiter, trailing_delimiter) if compiled else None
    native = _compiled.native if fast is not None else None
    if native is not None and isinstance(text_or_lines, str) and native.lines_plain(text_or_lines):
        # the compiled reader splits the lines and reads a chunk of them a call; each line it leaves (a
        # possible header, one it is not sure of) is read here as below
        text, offset, number = text_or_lines, 0, 0
        while offset >= 0:
            items, offset, number, left = native.rows(fast, text, offset, number, CHUNK)
            if not left:
                yield from items
                continue
            for item in items:
                if type(item) is tuple:
                    lineno, line = item
                    if not _header(line, plan, delimiter, trailing_delimiter):
                        yield native.row(fast, line, lineno) or _parse_line(
                            line, plan, delimiter, trailing_delimiter, lineno, place
                        )
                else:
                    yield item
        return
    lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else text_or_lines
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line or _header(line, plan, delimiter, trailing_delimiter):
            continue
        if native is not None:
            row = native.row(fast, line, lineno)
            if row is not None:
                yield row
                continue
        yield _parse_line(line, plan, delimiter, trailing_delimiter, lineno, place)


def _header(line: str, plan: Plan, delimiter: str, trailing_delimiter: bool) -> bool:
    """A header line repeating the field list (sacct without `--noheader`)."""
    if not line[0].isalpha():
        return False
    body = line[: -len(delimiter)] if trailing_delimiter and line.endswith(delimiter) else line
    return [p.lower() for p in body.split(delimiter)] == plan.header
