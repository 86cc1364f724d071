"""`hpcbus translate --to sonar|lp [--cluster NAME] [PATH|-]`: Sonar JSON <-> line protocol, as the bus does it.

The input kind is detected as `hpcbus validate` detects it (`hpcbus.commands.inputs`) and must be the other
one than `--to`. Output goes to stdout: `--to lp` writes each envelope's lines as the payloads the bus would
carry (`batch`), `--to sonar` one envelope per line (JSONL). Bad input is reported on stderr exactly as
`hpcbus validate` prints it (`PATH:LINE: kind: path: reason`) and never stops the good input around it from
being translated. Exit 0 when all input was valid, 1 when an error was reported, 2 on usage errors.

Memory stays flat whatever the input size: input is read a block at a time (a megabyte, or what a pipe has
delivered), Sonar is decoded one envelope at a time, and the line-protocol assembler holds only the envelopes
still open. Output is flushed after each block, so a live stream piped through comes out as it goes in.

The assembler's clock (`now` of `LpToSonar`, which decides when an envelope that cannot be completed, such as
one of a ClusterCockpit collector, is given up as partial) is the input's own: the newest line time of each
block. A file is a recording, so its timestamps say what arrived together, and the output must not depend on
how fast the machine reads it; the lines of a live stream carry times close to the wall clock anyway.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO

import msgspec

from hpcbus.commands.inputs import input_blocks, lp_chunks, sniff, sonar_envelopes
from hpcbus.schemas.problems import Problem

if TYPE_CHECKING:
    from hpcbus.schemas.translate import Assembled

HELP = "translate Sonar JSON to ClusterCockpit line protocol or back, as the bus does"

TARGETS = {"lp": "line protocol", "sonar": "Sonar JSON"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to", required=True, choices=sorted(TARGETS), help="output: lp = line protocol, sonar = Sonar JSONL"
    )
    p.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="cluster of lines without a cluster tag (--to sonar) or of errors-only envelopes without one "
        "(--to lp)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="report errors only, no warnings")
    p.add_argument("path", nargs="?", default="-", metavar="PATH|-", help="input file, - (default) for stdin")


class _Report:
    """Writes problems to stderr as `hpcbus validate` prints them and remembers whether any was an error."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.errors = 0

    def __call__(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            if problem.severity == "error":
                self.errors += 1
            elif self.quiet:
                continue
            sys.stderr.write(f"{problem}\n")


def run(args: argparse.Namespace) -> int:
    report = _Report(args.quiet)
    out = sys.stdout.buffer  # line protocol and JSON are bytes already
    try:
        with input_blocks(args.path) as raw:
            kind, blocks = sniff(raw)
            if kind == args.to:
                source = TARGETS["sonar" if kind == "lp" else "lp"]
                print(
                    f"hpcbus translate: {args.path}: is {TARGETS[kind]} already; --to {kind} reads {source}",
                    file=sys.stderr,
                )
                return 2
            if kind == "sonar":
                to_lp(blocks, args.path, args.cluster, report, out)
            elif kind == "lp":
                to_sonar(blocks, args.path, args.cluster, report, out)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # the reader went away: cli.main ends quietly
        print(f"hpcbus translate: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 1 if report.errors else 0


def to_lp(blocks: Iterable[bytes], place: str, cluster: str, report: _Report, out: BinaryIO) -> None:
    """Sonar envelopes -> line protocol: each envelope's lines as the payloads `batch` makes of them (the
    bus's messages, byte for byte). Per envelope rather than `batch(translate_envelopes(...))` over the whole
    stream, because `batch` holds lines back until it has 512 KiB, which a slow live stream may take minutes
    to fill."""
    from hpcbus.schemas.translate import batch, envelope_to_lines

    for item in sonar_envelopes(_flushing(blocks, out), place):
        if isinstance(item, list):
            report(item)
            continue
        start, envelope = item
        problems: list[Problem] = []  # what could not be derived (cc-backend events, metric lines)
        lines = envelope_to_lines(envelope, cluster=cluster, now=int(time.time()), problems=problems)
        report(msgspec.structs.replace(p, place=place, line=start) for p in problems)
        for payload in batch(lines):
            out.write(payload)
    out.flush()


def _flushing(blocks: Iterable[bytes], out: BinaryIO) -> Iterator[bytes]:
    """The blocks, flushing `out` before each read of the next: what the last block gave is written out
    before a live stream is waited for, without a write per envelope."""
    for block in blocks:
        yield block
        out.flush()


def to_sonar(blocks: Iterable[bytes], place: str, cluster: str, report: _Report, out: BinaryIO) -> None:
    """Line protocol -> Sonar JSONL, a block at a time into `LpToSonar`, flushing by the input's clock."""
    from hpcbus.schemas.sonar import encode_envelope
    from hpcbus.schemas.translate import LpToSonar

    translator = LpToSonar()

    def write(results: list[Assembled]) -> None:
        for result in results:
            report(p.located(place) for p in result.problems)
            out.write(encode_envelope(result.envelope) + b"\n")

    for parsed in lp_chunks(blocks, place, int(time.time())):
        report(parsed.problems)
        if parsed.lines:
            now = max(line.time for line in parsed.lines)
            unmade: list[Problem] = []  # events that carry no decodable envelope
            write(translator.add_lines(parsed.lines, cluster=cluster, now=now, problems=unmade))
            report(p.located(place) for p in unmade)
            write(translator.flush(now))
            out.flush()
    write(translator.flush_all())
    out.flush()
