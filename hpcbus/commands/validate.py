"""`hpcbus validate PATH|-`: is this file what the bus accepts? One line per problem, exit 1 if any error.

Detects the input kind from the first meaningful character: `{` is Sonar JSON (one envelope, JSONL, or
pretty-printed envelopes back to back), anything else is line protocol. Reads in constant memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO

import msgspec

from schemas.problems import Problem

HELP = "check Sonar JSON or ClusterCockpit line protocol; one line per problem"

LP_CHUNK_LINES = 20_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH|-", help="file to check, - for standard input")
    p.add_argument("--json", action="store_true", help="print the problems as JSON lines")
    p.add_argument("--quiet", "-q", action="store_true", help="print errors only, no warnings")


def sniff(first_chunk: str) -> str:
    """`sonar` or `lp`, from the first character that is not white space or a `#` comment line."""
    for raw in first_chunk.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        return "sonar" if s[0] in "{[" else "lp"
    return "lp"


def open_input(path: str) -> IO[str]:
    if path == "-":
        return sys.stdin
    return open(path, encoding="utf-8", errors="surrogateescape", newline="")


def peek_lines(stream: IO[str]) -> tuple[str, Iterator[str]]:
    """The input kind and an iterator over all lines (the peeked ones included)."""
    head: list[str] = []
    for raw in stream:
        head.append(raw)
        if raw.strip() and not raw.lstrip().startswith("#"):
            break
    kind = sniff("".join(head))

    def chained() -> Iterator[str]:
        yield from head
        yield from stream

    return kind, chained()


def lp_problems(lines: Iterable[str], place: str, now: int) -> Iterator[Problem]:
    chunk: list[str] = []
    offset = 0
    for raw in lines:
        chunk.append(raw)
        if len(chunk) >= LP_CHUNK_LINES:
            yield from _lp_chunk(chunk, place, now, offset)
            offset += len(chunk)
            chunk = []
    if chunk:
        yield from _lp_chunk(chunk, place, now, offset)


def _lp_chunk(chunk: list[str], place: str, now: int, offset: int) -> Iterator[Problem]:
    from schemas.lineprotocol import parse_payload

    text = "".join(line.rstrip("\r\n") + "\n" for line in chunk)
    for problem in parse_payload(text, now=now, place=place).problems:
        yield msgspec.structs.replace(problem, line=problem.line + offset)


def sonar_problems(lines: Iterable[str], place: str) -> Iterator[Problem]:
    from schemas.problems import InvalidInput
    from schemas.sonar.validate import iter_envelopes_from_lines

    for _start, result in iter_envelopes_from_lines(lines):
        if isinstance(result, InvalidInput):
            for problem in result.problems:  # lines are absolute already (the envelope's or the error's)
                yield problem.located(place)


def problems_of(path: str, now: int | None = None) -> Iterator[Problem]:
    now = int(time.time()) if now is None else now
    place = "-" if path == "-" else path
    stream = open_input(path)
    try:
        kind, lines = peek_lines(stream)
        yield from sonar_problems(lines, place) if kind == "sonar" else lp_problems(lines, place, now)
    finally:
        if stream is not sys.stdin:
            stream.close()


def run(args: argparse.Namespace) -> int:
    errors = 0
    out = sys.stdout
    try:
        for problem in problems_of(args.path):
            if problem.severity == "error":
                errors += 1
            elif args.quiet:
                continue
            out.write((msgspec.json.encode(problem).decode() if args.json else str(problem)) + "\n")
    except OSError as exc:
        print(f"hpcbus validate: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 1 if errors else 0
