"""`hpcbus consume influx`: options, then one runner per cluster sharing one InfluxDB writer."""

from __future__ import annotations

import argparse
import asyncio
import logging

from hpcbus.influx.settings import INFLUX, InfluxSettings
from hpcbus.options import add_section_arguments, read_section
from hpcbus.runner import RunnerSettings, delivery_section
from hpcbus.settings import BUS, add_stream_arguments, bus_settings, stream_overrides
from hpcbus.settings import clusters as cluster_names

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
    settings: InfluxSettings = read_section(args, INFLUX, environ)
    return settings


def runner_settings(args: argparse.Namespace) -> RunnerSettings:
    settings: RunnerSettings = read_section(args, DELIVERY)
    return settings


async def main(args: argparse.Namespace) -> int:
    from nats.aio.client import Client as NATS

    from hpcbus.bus import deadletter_stream, telemetry_stream
    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.writer import Retryable, make_writer
    from hpcbus.runner import Runner
    from hpcbus.schemas import subjects
    from hpcbus.service import Service

    bus = bus_settings(args)
    influx = influx_settings(args)
    delivery = runner_settings(args)
    clusters = cluster_names(bus, several=True)
    overrides = stream_overrides(args.stream_max_age, args.stream_max_bytes)
    prefix = bus.subject_prefix
    streams = {cluster: telemetry_stream(cluster, prefix=prefix, **overrides) for cluster in clusters}
    wanted = []
    if delivery.mode == "jetstream":
        for cluster in clusters:
            wanted += [streams[cluster], deadletter_stream(cluster, prefix=prefix)]
    service = Service(bus, delivery.durable, streams=wanted)
    writer = make_writer(influx)

    async def body(nc: NATS) -> None:
        try:
            await writer.ensure_database()
        except Retryable as exc:
            log.warning("InfluxDB not reachable yet (%s); writes will retry", exc)
        runners = [
            Runner(
                nc,
                delivery,
                streams[cluster].name,
                subjects.wildcards(cluster, "metrics", subjects.TELEMETRY, "events", "log", prefix=prefix),
                InfluxSink(nc, writer, influx, cluster, delivery.durable, prefix=prefix),
                service.stopping,
            )
            for cluster in clusters
        ]
        log.info(
            "writing to %s (%s, %s)",
            influx.url,
            influx.api,
            influx.db if influx.api == "v1" else influx.bucket,
        )
        await asyncio.gather(*(r.run() for r in runners))

    try:
        return await service.run(body)
    finally:
        await writer.close()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
