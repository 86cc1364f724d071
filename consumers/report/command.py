"""`hpcbus report --job JOB`: one job's use of what it was given, from what the pipeline stored in InfluxDB.

JOB is the job as the bus keys it (`<job>` for Slurm and OCS, `<job>@<epoch>` for a process group); a bare
number is enough when it names one job (several -> the candidates are listed, exit 1). InfluxDB is named
exactly as for `consume influx` (`--influx-url`, `--db`, `INFLUX_*`, `[influx]`), so one config file serves
both. Expected failures (no such job, InfluxDB away, a refused query) are one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from hpcbus.consumers.report.settings import INFLUX_READ, REPORT, ReportSettings
from hpcbus.influx.settings import InfluxSettings
from hpcbus.options import add_section_arguments, read_section

HELP = "a job's report from InfluxDB: text, HTML with plots, or JSON"
SECTIONS = (INFLUX_READ, REPORT)

log = logging.getLogger("hpcbus.report")

NO_DATA_HINT = (
    "note: the node producer leaves out processes of users below uid 1000 (root's included) unless "
    "`--min-uid 0` or `[node.jobs] min_uid = 0`, so their jobs have no samples"
)
"""Said with every "no data" answer: the first job a new user tries is often root's or a system user's."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, metavar="JOB", help="job key: <job> (Slurm, OCS) or <job>@<epoch>")
    p.add_argument(
        "--cluster", default="", metavar="NAME", help="the job's cluster (needed when the key repeats)"
    )
    p.add_argument("--format", choices=("text", "html", "json"), default="text", help="output format (text)")
    p.add_argument(
        "--output",
        metavar="FILE",
        help="write here instead of stdout (- = stdout; html on a terminal: default job-<JOB>.html)",
    )
    add_section_arguments(p, INFLUX_READ)
    add_section_arguments(p, REPORT)


class Progress:
    """What the report is waiting for, on stderr: rewritten in place on a terminal, one line per step with
    -v, nothing otherwise (a script reading stdout gets only the report)."""

    def __init__(self, stream: TextIO, verbose: bool) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.enabled = self.tty or verbose
        self.started = time.monotonic()
        self._width = 0

    def __call__(self, what: str) -> None:
        if not self.enabled:
            return
        text = f"hpcbus report: {what} ({time.monotonic() - self.started:.1f} s)"
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


async def make_report(
    influx_settings: InfluxSettings, settings: ReportSettings, job: str, cluster: str, progress: Progress
) -> tuple[object, list[str]]:
    """The Report of `job` and notes for stderr (other jobs a bare number also matched)."""
    from hpcbus.consumers.report.fetch import fetch, resolve
    from hpcbus.consumers.report.model import build
    from hpcbus.influx.query import Influx

    influx = Influx(influx_settings)
    try:
        ref, others = await resolve(influx, job, cluster, progress)
        data = await fetch(influx, ref, settings.max_points, progress)
    finally:
        await influx.close()
    notes = [f"also found: --cluster {r.cluster} --job {r.key}" for r in others]
    return build(data, settings), notes


def render(report: object, fmt: str) -> str:
    import msgspec

    from hpcbus.consumers.report import html, text
    from hpcbus.consumers.report.model import Report

    assert isinstance(report, Report)
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(report), indent=1).decode() + "\n"
    if fmt == "html":
        return html.render(report)
    return text.render(report)


def run(args: argparse.Namespace) -> int:
    from hpcbus.consumers.report.fetch import NoSuchJob
    from hpcbus.influx.query import QueryError

    influx_settings = read_section(args, INFLUX_READ)
    settings = read_section(args, REPORT)
    progress = Progress(sys.stderr, bool(getattr(args, "verbose", 0)))
    try:
        report, notes = asyncio.run(make_report(influx_settings, settings, args.job, args.cluster, progress))
    except (NoSuchJob, QueryError) as exc:
        progress.done()
        print(f"hpcbus report: {exc}", file=sys.stderr)
        if isinstance(exc, NoSuchJob) and str(exc).startswith("no data"):
            print(f"hpcbus report: {NO_DATA_HINT}", file=sys.stderr)
        return 1
    progress.done()
    for note in notes:
        print(f"hpcbus report: {note}", file=sys.stderr)
    output = render(report, args.format)
    target = args.output
    if target is None and args.format == "html" and sys.stdout.isatty():
        target = f"job-{args.job.replace('/', '_')}.html"  # a page of HTML is no use in a terminal
    if target and target != "-":
        try:
            Path(target).write_text(output, encoding="utf-8")
        except OSError as exc:
            print(f"hpcbus report: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if args.format == "html" or sys.stderr.isatty():
            print(f"hpcbus report: wrote {target}", file=sys.stderr)
    else:
        sys.stdout.write(output)
    return 0
