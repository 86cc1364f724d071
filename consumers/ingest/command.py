"""`hpcbus consume ingest`: the worker between the nodes' ingest subjects and the cluster's subjects.

Reads `<cluster>.ingest.>` (the ingest stream, filled by nodes that publish with `--ingest` under their own
credentials) through a durable pull consumer, and forwards what each node may say about itself to
`<cluster>.metrics`, `.events.<class>`, `.log.<component>`, `.sonar.<kind>` (the telemetry stream); the
rest is reported and dead-lettered (`consumers.ingest.sink`). Several workers may share the durable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from hpcbus.options import add_section_arguments, read_section
from hpcbus.runner import RunnerSettings, delivery_section
from hpcbus.settings import BUS, SettingsError, add_stream_arguments, bus_settings, stream_overrides
from hpcbus.settings import clusters as cluster_names

HELP = "check per-node ingest subjects (hostname = credential) and forward to the cluster's subjects"
USES_BUS = True

log = logging.getLogger("hpcbus.ingest")

DELIVERY = delivery_section("hpcbus-ingest", "ingest")
"""`[ingest]`: the durable consumer on the ingest stream (the table `[delivery]` is the InfluxDB worker's)."""
SECTIONS = (BUS, DELIVERY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, DELIVERY)
    add_stream_arguments(p)


async def main(args: argparse.Namespace) -> int:
    from nats.aio.client import Client as NATS

    from hpcbus.bus import deadletter_stream, ingest_stream, telemetry_stream
    from hpcbus.consumers.ingest.sink import IngestSink
    from hpcbus.outlet import Outlet
    from hpcbus.runner import Runner
    from hpcbus.schemas import subjects
    from hpcbus.service import Service

    bus = bus_settings(args)
    delivery: RunnerSettings = read_section(args, DELIVERY)
    if delivery.mode != "jetstream":
        raise SettingsError("[ingest] mode: the ingest worker needs `jetstream` (it acks after forwarding)")
    clusters = cluster_names(bus, several=True)
    overrides = stream_overrides(args.stream_max_age, args.stream_max_bytes)
    prefix = bus.subject_prefix
    ingest = {cluster: ingest_stream(cluster, prefix=prefix, **overrides) for cluster in clusters}
    wanted = []
    for cluster in clusters:
        wanted += [
            ingest[cluster],
            telemetry_stream(cluster, prefix=prefix, **overrides),
            deadletter_stream(cluster, prefix=prefix),
        ]
    service = Service(bus, delivery.durable, streams=wanted)

    async def body(nc: NATS) -> None:
        runners = [
            Runner(
                nc,
                delivery,
                ingest[cluster].name,
                [subjects.ingest_wildcard(cluster, prefix=prefix)],
                IngestSink(Outlet(nc, cluster, jetstream=True, prefix=prefix), delivery.durable),
                service.stopping,
            )
            for cluster in clusters
        ]
        log.info("forwarding the ingest subjects of %s", ", ".join(clusters))
        await asyncio.gather(*(r.run() for r in runners))

    return await service.run(body)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
