"""`hpcbus validate PATH|-`: is this file what the bus accepts? One line per problem, exit 1 if any error.

Detects the input kind from the first meaningful character: `{` is Sonar JSON (one envelope, JSONL, or
pretty-printed envelopes back to back), anything else is line protocol. Reads in constant memory.

Timestamps are held to what the workers accept: read as s/ms/us/ns by magnitude, a time before 2000-01-01 or
more than `--max-future` seconds ahead of now is an error (the workers would dead-letter the line); so is a
Sonar envelope's time outside that window.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator

import msgspec

from hpcbus.commands.inputs import input_blocks, lp_chunks, sniff, sonar_envelopes
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.problems import Problem

HELP = "check Sonar JSON or ClusterCockpit line protocol; one line per problem"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH|-", help="file to check, - for standard input")
    p.add_argument("--json", action="store_true", help="print the problems as JSON lines")
    p.add_argument("--quiet", "-q", action="store_true", help="print errors only, no warnings")
    p.add_argument(
        "--max-future",
        type=int,
        default=DEFAULT_MAX_FUTURE,
        metavar="SECONDS",
        help="how far ahead of now a timestamp or Sonar envelope time may be (as the workers' max_future; "
        f"default {DEFAULT_MAX_FUTURE})",
    )


def lp_problems(
    blocks: Iterable[bytes], place: str, now: int, max_future: int = DEFAULT_MAX_FUTURE
) -> Iterator[Problem]:
    """Problems of each block (`inputs.lp_chunks`, with the time window), line numbers counted from the start
    of the input."""
    for parsed in lp_chunks(blocks, place, now, max_future=max_future):
        yield from parsed.problems


def sonar_problems(blocks: Iterable[bytes], place: str, latest: int | None = None) -> Iterator[Problem]:
    """Problems of a Sonar input; `latest` (now + max_future) holds its times to the workers' window."""
    for item in sonar_envelopes(blocks, place, latest):
        if isinstance(item, list):
            yield from item


def problems_of(path: str, now: int | None = None, max_future: int = DEFAULT_MAX_FUTURE) -> Iterator[Problem]:
    now = int(time.time()) if now is None else now
    with input_blocks(path) as raw:
        kind, blocks = sniff(raw)
        if not kind:  # an empty file is no proof that what was meant to be in it is valid: say so
            reason = "nothing to validate: no line protocol and no Sonar envelope (empty, or only comments)"
            yield Problem(reason, path, 0, "input")
        elif kind == "sonar":
            yield from sonar_problems(blocks, path, now + max_future)
        else:
            yield from lp_problems(blocks, path, now, max_future)


def run(args: argparse.Namespace) -> int:
    errors = 0
    out = sys.stdout
    try:
        if args.max_future < 0:
            print("hpcbus validate: --max-future must be 0 or more seconds", file=sys.stderr)
            return 2
        for problem in problems_of(args.path, max_future=args.max_future):
            if problem.severity == "error":
                errors += 1
            elif args.quiet:
                continue
            out.write((msgspec.json.encode(problem).decode() if args.json else str(problem)) + "\n")
    except OSError as exc:
        print(f"hpcbus validate: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 1 if errors else 0
