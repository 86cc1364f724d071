"""`hpcbus consume influx`: its settings, and one InfluxDB sink per cluster sharing one writer."""

from __future__ import annotations

import argparse
import asyncio
import logging

from hpcbus.delivery import RunnerSettings, delivery_section
from hpcbus.influx.settings import INFLUX, InfluxSettings
from hpcbus.options import add_section_arguments, read_section
from hpcbus.settings import BUS, add_stream_arguments, bus_settings

HELP = "write <cluster>.metrics, .events.> and .log.> into InfluxDB (v1 /write or v2 /api/v2/write)"
USES_BUS = True

log = logging.getLogger("hpcbus.influx")


DELIVERY = delivery_section("hpcbus-influx")
SECTIONS = (BUS, INFLUX, DELIVERY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, INFLUX)
    add_section_arguments(p, DELIVERY)
    add_stream_arguments(p)


def influx_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> InfluxSettings:
    settings = read_section(args, INFLUX, environ)
    return settings


def runner_settings(args: argparse.Namespace) -> RunnerSettings:
    settings = read_section(args, DELIVERY)
    return settings


async def main(args: argparse.Namespace) -> int:
    from nats.aio.client import Client as NATS

    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.writer import make_writer, prepare
    from hpcbus.schemas import subjects
    from hpcbus.sinks import Feed, serve, worker_clusters

    bus = bus_settings(args)
    influx = influx_settings(args)
    delivery = runner_settings(args)
    clusters = worker_clusters(args, bus, jetstream=delivery.mode == "jetstream")
    prefix = clusters.prefix
    writer = make_writer(influx)

    async def feeds(nc: NATS) -> list[Feed]:
        await prepare(writer, "writes will retry")
        target = influx.db if influx.api == "v1" else influx.bucket
        log.info("writing to %s (%s, %s)", influx.url, influx.api, target)
        return [
            Feed(
                clusters.streams[cluster].name,
                subjects.wildcards(cluster, "metrics", subjects.TELEMETRY, "events", "log", prefix=prefix),
                delivery,
                InfluxSink(nc, writer, influx, cluster, delivery.durable, prefix=prefix),
            )
            for cluster in clusters.names
        ]

    return await serve(bus, delivery.durable, clusters.wanted, feeds, closing=[writer])


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
