"""`hpcbus validate PATH|-`: is this file what the bus accepts? One line per problem, exit 1 if any error.

Detects the input kind from the first meaningful character: `{` is Sonar JSON (one envelope, JSONL, or
pretty-printed envelopes back to back), anything else is line protocol. Reads in constant memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator

import msgspec

from hpcbus.commands.inputs import LP_CHUNK_LINES, input_blocks, lp_chunks, sniff, sonar_envelopes
from schemas.problems import Problem

HELP = "check Sonar JSON or ClusterCockpit line protocol; one line per problem"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH|-", help="file to check, - for standard input")
    p.add_argument("--json", action="store_true", help="print the problems as JSON lines")
    p.add_argument("--quiet", "-q", action="store_true", help="print errors only, no warnings")


def lp_problems(blocks: Iterable[bytes], place: str, now: int) -> Iterator[Problem]:
    # LP_CHUNK_LINES is read here, at call time, so that a test can make chunks small
    for parsed in lp_chunks(blocks, place, now, LP_CHUNK_LINES):
        yield from parsed.problems


def sonar_problems(blocks: Iterable[bytes], place: str) -> Iterator[Problem]:
    for item in sonar_envelopes(blocks, place):
        if isinstance(item, list):
            yield from item


def problems_of(path: str, now: int | None = None) -> Iterator[Problem]:
    now = int(time.time()) if now is None else now
    with input_blocks(path) as raw:
        kind, blocks = sniff(raw)
        yield from sonar_problems(blocks, path) if kind == "sonar" else lp_problems(blocks, path, now)


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
