"""`hpcbus consume ingest`: the worker between the nodes' ingest subjects and the cluster's subjects.

Reads `<cluster>.ingest.>` (the ingest stream, filled by nodes that publish with `--ingest` under their own
credentials) through a durable pull consumer, and forwards what each node may say about itself to
`<cluster>.metrics`, `.events.<class>`, `.log.<component>`, `.sonar.<kind>` (the telemetry stream); the
rest is refused (`consumers.ingest.sink`), then reported and dead-lettered by the runtime (`hpcbus.runner`).
Several workers may share the durable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from hpcbus.delivery import delivery_section
from hpcbus.options import add_section_arguments, read_section
from hpcbus.settings import BUS, SettingsError, add_stream_arguments, bus_settings

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

    from hpcbus.consumers.ingest.sink import IngestSink
    from hpcbus.outlet import Outlet
    from hpcbus.schemas import subjects
    from hpcbus.sinks import Feed, serve, worker_clusters
    from hpcbus.streams import ingest_stream, telemetry_stream

    bus = bus_settings(args)
    delivery = read_section(args, DELIVERY)
    if delivery.mode != "jetstream":
        raise SettingsError("[ingest] mode: the ingest worker needs `jetstream` (it acks after forwarding)")
    if delivery.peers:
        raise SettingsError(
            "[ingest] peers: the ingest worker has no peer groups (one group forwards each message)"
        )
    clusters = worker_clusters(args, bus, ingest_stream, also=[telemetry_stream])
    prefix = clusters.prefix

    async def feeds(nc: NATS) -> list[Feed]:
        log.info("forwarding the ingest subjects of %s", ", ".join(clusters.names))
        return [
            Feed(
                clusters.streams[cluster].name,
                [subjects.ingest_wildcard(cluster, prefix=prefix)],
                delivery,
                IngestSink(Outlet(nc, cluster, jetstream=True, prefix=prefix), delivery.durable),
            )
            for cluster in clusters.names
        ]

    return await serve(bus, delivery.durable, clusters.wanted, feeds)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
