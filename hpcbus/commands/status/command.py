"""`hpcbus status`: is the bus healthy, is anything falling behind, which nodes stopped reporting.

One screen from the bus alone, for every cluster with an `HPCBUS_<cluster>` stream (or those of
`--cluster`): NATS servers, streams, durables, dead letters, the workers' self-telemetry and the nodes'
last samples (docs/status.md says where each fact comes from). Exit 0 healthy, 1 unhealthy (each problem on
its own line), 2 a usage mistake, 3 NATS not reachable: cron, Nagios or a Slurm health check can use it.
`--json` prints the same facts as one object; `--watch` refreshes in the terminal until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys

from hpcbus.commands.status.settings import INFLUX_STATUS, STATUS, UNREACHABLE, wanted_clusters
from hpcbus.options import add_section_arguments, read_section
from hpcbus.settings import BUS_CLIENT, bus_settings

HELP = (
    "health of the bus: servers, streams, durables, dead letters, workers, silent nodes (exit 1 if unhealthy)"
)
USES_BUS = True
SECTIONS = (BUS_CLIENT, STATUS, INFLUX_STATUS)

UNHEALTHY = 1
log = logging.getLogger("hpcbus.status")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, STATUS)
    add_section_arguments(p, INFLUX_STATUS)


async def once(args: argparse.Namespace) -> int:
    import msgspec

    from hpcbus.bus import Unreachable
    from hpcbus.commands.status.gather import ApiError, gather
    from hpcbus.commands.status.health import judge
    from hpcbus.commands.status.render import render

    bus = bus_settings(args)
    settings = read_section(args, STATUS)
    influx = read_section(args, INFLUX_STATUS) if settings.influx else None
    try:
        report = judge(await gather(bus, settings, wanted_clusters(bus.cluster), influx), settings)
    except (Unreachable, ApiError, TimeoutError) as exc:
        why = str(exc) or "NATS did not answer in time"
        print(f"hpcbus status: {why}", file=sys.stderr)
        if settings.json:  # a check reading stdout gets a verdict too, not an empty document
            answer = {"healthy": False, "nats_reachable": False, "problems": [{"where": "NATS", "what": why}]}
            sys.stdout.write(msgspec.json.encode(answer).decode() + "\n")
        return UNREACHABLE
    if settings.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        width = shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else 0
        sys.stdout.write(render(report, width))
    return 0 if report.healthy else UNHEALTHY


def run(args: argparse.Namespace) -> int:
    settings = read_section(args, STATUS)
    if settings.watch:
        from hpcbus.commands.status.live import watch

        return asyncio.run(watch(args))
    return asyncio.run(once(args))
