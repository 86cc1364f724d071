"""`hpcbus consume influx`: options, then one runner per cluster sharing one InfluxDB writer."""

from __future__ import annotations

import argparse
import asyncio
import logging

import msgspec

from consumers.influx.settings import ENV, InfluxSettings
from consumers.runner import RunnerSettings
from hpcbus.settings import (
    SettingsError,
    add_stream_arguments,
    bus_settings,
    load_table,
    section_settings,
    stream_overrides,
)

HELP = "write <cluster>.metrics, .events.> and .log.> into InfluxDB (v1 /write or v2 /api/v2/write)"
USES_BUS = True

log = logging.getLogger("hpcbus.influx")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("influx")
    g.add_argument("--influx-url", dest="influx_url", help="InfluxDB URL (INFLUX_URL)")
    g.add_argument("--influx-api", dest="influx_api", choices=["v1", "v2"], help="write API (default v1)")
    g.add_argument("--db", help="v1 database (INFLUX_DB)")
    g.add_argument("--rp", help="v1 retention policy")
    g.add_argument("--influx-user", dest="influx_username", help="v1 user (INFLUX_USERNAME)")
    g.add_argument("--influx-password", dest="influx_password", help="v1 password (INFLUX_PASSWORD)")
    g.add_argument("--token", help="v2 token (INFLUX_TOKEN)")
    g.add_argument("--org", help="v2 organisation (INFLUX_ORG)")
    g.add_argument("--bucket", help="v2 bucket (INFLUX_BUCKET)")
    g.add_argument("--processes", choices=["aggregate", "full"], help="process-level series policy")
    g.add_argument(
        "--no-gzip", dest="gzip", action="store_false", default=None, help="send writes uncompressed"
    )
    r = p.add_argument_group("delivery")
    r.add_argument(
        "--mode", choices=["jetstream", "core"], help="jetstream: at-least-once (default); core: at-most-once"
    )
    r.add_argument("--durable", help="durable consumer name; workers with one name share the load")
    add_stream_arguments(p)


_BUS_NAMES = frozenset({"user", "password", "username", "url", "api"})


def influx_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> InfluxSettings:
    # Flags that would clash with the bus options (--user, --password) carry an `influx_` prefix.
    renamed = argparse.Namespace(
        **{
            name: getattr(
                args, f"influx_{name}", getattr(args, name, None) if name not in _BUS_NAMES else None
            )
            for name in InfluxSettings.__struct_fields__
        },
        config=getattr(args, "config", None),
    )
    return section_settings(renamed, "influx", InfluxSettings, environ_vars=ENV, environ=environ)


def runner_settings(args: argparse.Namespace) -> RunnerSettings:
    values: dict[str, object] = dict(load_table(getattr(args, "config", None), "delivery"))
    for key in ("mode", "durable"):
        if getattr(args, key, None):
            values[key] = getattr(args, key)
    values.setdefault("durable", "hpcbus-influx")
    try:
        return msgspec.convert(values, RunnerSettings)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"delivery settings: {exc}") from None


async def main(args: argparse.Namespace) -> int:
    from consumers.influx.sink import InfluxSink
    from consumers.influx.writer import Retryable, make_writer
    from consumers.runner import Runner, stop_on_signals
    from hpcbus.bus import close as close_bus
    from hpcbus.bus import connect, deadletter_stream, ensure_stream, telemetry_stream

    bus = bus_settings(args)
    influx = influx_settings(args)
    delivery = runner_settings(args)
    clusters = [c.strip() for c in bus.cluster.split(",") if c.strip()]
    if not clusters:
        raise SettingsError(
            "--cluster (HPCBUS_CLUSTER) is required: the cluster(s) whose subjects to consume"
        )
    overrides = stream_overrides(args.stream_max_age, args.stream_max_bytes)

    stopping = asyncio.Event()
    stop_on_signals(stopping)
    nc = await connect(bus, delivery.durable)
    writer = make_writer(influx)
    try:
        try:
            await writer.ensure_database()
        except Retryable as exc:
            log.warning("InfluxDB not reachable yet (%s); writes will retry", exc)
        js = nc.jetstream()
        runners = []
        for cluster in clusters:
            subjects = [f"{cluster}.metrics", f"{cluster}.events.>", f"{cluster}.log.>"]
            stream = telemetry_stream(cluster, **overrides)
            if delivery.mode == "jetstream":
                await ensure_stream(js, stream)
                await ensure_stream(js, deadletter_stream(cluster))
            sink = InfluxSink(nc, writer, influx, cluster, delivery.durable)
            runners.append(Runner(nc, delivery, stream.name, subjects, sink, stopping))
        log.info(
            "writing to %s (%s, %s)",
            influx.url,
            influx.api,
            influx.db if influx.api == "v1" else influx.bucket,
        )
        await asyncio.gather(*(r.run() for r in runners))
    finally:
        await writer.close()
        await close_bus(nc)
    log.info("stopped cleanly")
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
