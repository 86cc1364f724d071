"""`hpcbus gateway`: an HTTP server that speaks InfluxDB's write APIs and Sonar's HTTP sink, and acknowledges a
request only once JetStream has stored what it carried.

    hpcbus gateway --listen 0.0.0.0:8086 --cluster fox [--auth-file FILE] [--http-cert F --http-key F]

Point Slurm's `ProfileInfluxDBHost`, Telegraf's or cc-metric-collector's InfluxDB output, an influxdb-client,
or Sonar's `api-root` (`http://host:8086/sonar`) at it. What becomes of each kind of input is in
docs/gateway.md; the routes and publishing are in `server.py`, request intake (credentials, slots, body) in
`intake.py`, what a body becomes in `influx.py` and `sonar.py`, refusals and counters in `answers.py`, the
secrets in `auth.py`.

It runs on the shared runtime (`hpcbus.service.Service`): the HTTP server starts at once and answers 503
until NATS is reached (and whenever it is away), the cluster's telemetry stream is ensured in the
background, and SIGTERM stops accepting requests, lets those in progress finish within the stop deadline
and exits 0 within 5 s. `--hash-secret` prints the hash of a secret read from stdin, for the auth file.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import ssl
import sys
from typing import TYPE_CHECKING

from hpcbus.options import Section, add_section_arguments, read_section
from hpcbus.producers.gateway.settings import GATEWAY, GatewaySettings
from hpcbus.settings import BUS, STREAM, SettingsError, add_stream_arguments, bus_settings, stream_overrides
from hpcbus.settings import clusters as cluster_names

if TYPE_CHECKING:
    from hpcbus.producers.gateway.auth import Authenticator

HELP = "HTTP gateway: InfluxDB write APIs and Sonar's HTTP sink onto the bus"
GATEWAY_BUS = Section(
    BUS.table,
    BUS.struct,
    env=BUS.env,
    flags=BUS.flags,
    metavars=BUS.metavars,
    notes={
        "cluster": "With `--auth-file` optional: the clusters are the file's (this one must be among them)."
    },
)

USES_BUS = True
SECTIONS = (GATEWAY_BUS, GATEWAY, STREAM)

log = logging.getLogger("hpcbus.gateway")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = add_section_arguments(p, GATEWAY)
    g.add_argument(
        "--hash-secret",
        action="store_true",
        help="read a secret from stdin (or the terminal) and print its hash for the auth file; nothing else",
    )
    add_stream_arguments(p)


def gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    from hpcbus.producers.gateway.server import listen_address

    settings = read_section(args, GATEWAY)
    try:
        listen_address(settings.listen)
    except ValueError as exc:
        raise SettingsError(f"--listen: {exc}") from None
    if settings.http_key and not settings.http_cert:
        raise SettingsError("--http-key needs --http-cert")
    if settings.max_body_memory < settings.max_body:
        raise SettingsError(
            f"--max-body-memory {settings.max_body_memory} is less than --max-body {settings.max_body}: "
            "a body of the size allowed could never be held"
        )
    return settings


def tls_context(settings: GatewaySettings) -> ssl.SSLContext | None:
    if not settings.http_cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(settings.http_cert, settings.http_key or None)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"--http-cert/--http-key: {exc}") from None
    return ctx


def run(args: argparse.Namespace) -> int:
    from hpcbus.producers.gateway.auth import Authenticator, FailureBudget, hash_secret, load_auth_file

    if args.hash_secret:
        secret = getpass.getpass("secret: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
        if not secret:
            log.error("--hash-secret: empty secret")
            return 2
        print(hash_secret(secret))
        return 0
    settings = gateway_settings(args)
    bus = bus_settings(args)
    if settings.auth_file:
        entries = load_auth_file(settings.auth_file)
        default = cluster_names(bus)[0] if bus.cluster else ""
        if default and default not in entries:
            raise SettingsError(f"--cluster {default!r} is not in --auth-file {settings.auth_file}")
        budget = FailureBudget(settings.failed_checks, settings.failed_check_seconds)
        auth = Authenticator(entries, default, max_checks=settings.max_checks, budget=budget)
    else:
        auth = Authenticator(None, cluster_names(bus)[0])
    ctx = tls_context(settings)
    return asyncio.run(serve(settings, auth, args, ctx))


async def serve(
    settings: GatewaySettings,
    auth: Authenticator,
    args: argparse.Namespace,
    ctx: ssl.SSLContext | None,
    *,
    stopping: asyncio.Event | None = None,
) -> int:
    """Listen, then run the service until SIGTERM/SIGINT (or `stopping`, when given)."""
    from aiohttp import web
    from nats.aio.client import Client as NATS

    from hpcbus.bus import telemetry_stream
    from hpcbus.interest import Interest
    from hpcbus.producers.gateway.httpserver import GatewayRunner
    from hpcbus.producers.gateway.server import Gateway, listen_address
    from hpcbus.service import Service
    from hpcbus.sources import follow

    bus = bus_settings(args)
    limits = read_section(args, STREAM)
    overrides = stream_overrides(limits.stream_max_age, limits.stream_max_bytes)
    streams = [telemetry_stream(c, prefix=bus.subject_prefix, **overrides) for c in auth.clusters]
    service = Service(bus, "hpcbus-gateway", streams=streams)
    gateway = Gateway(settings, auth, service.stopping, prefix=bus.subject_prefix)
    gateway.core.interest = Interest(service.streams)  # 503 while a stream would keep nothing
    # aiohttp's keep-alive timer runs from a connection's opening (and each answer) until a request's head
    # is complete: that is the header timeout. Bodies are inflated by the gateway (server.py), not aiohttp.
    runner = GatewayRunner(
        gateway.app(),
        access_log=None,
        handle_signals=False,
        auto_decompress=False,
        keepalive_timeout=settings.header_timeout,
        logger=gateway.http_log,
    )
    await runner.setup()
    host, port = listen_address(settings.listen)
    site = web.TCPSite(runner, host, port, ssl_context=ctx, shutdown_timeout=1.0)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s: %s", settings.listen, exc.strerror or exc)
        await runner.cleanup()
        return 1
    scheme = "https" if ctx else "http"
    log.info("listening on %s://%s:%d for %s", scheme, host, port, ", ".join(auth.clusters))
    if auth.open:
        log.warning(
            "no --auth-file: anyone who reaches %s:%d may publish for cluster %s, without credentials "
            "(InfluxDB's own default); give an auth file to require them",
            host,
            port,
            auth.default,
        )

    async def body(nc: NATS) -> None:
        gateway.nc = nc
        try:
            await service.stopping.wait()
            auth.stop()  # requests still in progress hash nothing more: the process exits within 5 s
            if not await gateway.drain(service.stopping.remaining() - 1.0):
                log.warning(
                    "%d requests still in progress at the stop deadline; their clients retry",
                    gateway.in_flight,
                )
            await gateway.core.stats.report(nc, running=False)  # status: stopped, not "alive" a while
        finally:
            gateway.nc = None

    reporting = asyncio.create_task(gateway.report_loop())
    bridge = None
    if stopping is not None:
        bridge = asyncio.create_task(follow(stopping, service.stopping))
    try:
        return await service.run(body, signals=stopping is None)
    finally:
        service.stopping.set()
        auth.stop()
        reporting.cancel()
        if bridge is not None:
            bridge.cancel()
        gateway.flush()
        log.info("gateway: %s", gateway.summary())
        await runner.cleanup()
