"""`hpcbus consume sonar`: options, then per cluster one runner per direction (each with its own durable).

Why a durable per direction: LP -> Sonar holds its input for up to `grace` seconds while envelopes assemble,
Sonar -> LP acknowledges each batch at once; one consumer would make the stateless direction wait behind the
other's `max_ack_pending`, and the two scale differently (LP -> Sonar must be one worker per cluster,
Sonar -> LP may be many).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re

import msgspec

from consumers.runner import RunnerSettings
from consumers.sonar.settings import DIRECTIONS, SonarSettings
from hpcbus.settings import (
    SettingsError,
    add_stream_arguments,
    bus_settings,
    load_table,
    section_settings,
    stream_overrides,
)

HELP = "translate between line protocol and Sonar envelopes on the bus (<cluster>.sonar.<kind>), both ways"
USES_BUS = True

log = logging.getLogger("hpcbus.sonar")

DEFAULT_DURABLE = "hpcbus-sonar"
TO_SONAR_MAX_ACK_PENDING = 20_000
"""LP -> Sonar holds every message for about `grace` seconds, so the unacknowledged count is the message rate
times `grace` (1000 nodes sending a sample = 2 messages every 30 s: about 2000). JetStream stops delivering at
`max_ack_pending`, so the runner's default of 1000 would throttle it; set `[delivery] max_ack_pending` to
override."""

_DURABLE = re.compile(r"^[A-Za-z0-9_-]+$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sonar")
    g.add_argument(
        "--to",
        choices=DIRECTIONS,
        help="sonar: LP -> envelopes; lp: envelopes -> LP; both (default; never re-translates its own output)",
    )
    g.add_argument(
        "--directory",
        metavar="DIR",
        help="also append envelopes to Sonar's directory tree DIR/yyyy/mm/dd/0+<type>-<host>.json "
        "(Jobanalyzer's input); {cluster} in DIR is replaced by the cluster name",
    )
    g.add_argument(
        "--grace", type=float, metavar="S", help="seconds an incomplete envelope waits (default 30)"
    )
    g.add_argument(
        "--on-stop",
        dest="on_stop",
        choices=["return", "flush"],
        help="SIGTERM: return waiting input to JetStream (default) or publish partial envelopes",
    )
    r = p.add_argument_group("delivery")
    r.add_argument(
        "--mode", choices=["jetstream", "core"], help="jetstream: at-least-once (default); core: at-most-once"
    )
    r.add_argument(
        "--durable",
        help=f"durable consumer name prefix (default {DEFAULT_DURABLE}); -to-sonar / -to-lp is appended",
    )
    add_stream_arguments(p)


def sonar_settings(args: argparse.Namespace) -> SonarSettings:
    return section_settings(args, "sonar", SonarSettings)


def runner_settings(args: argparse.Namespace, sonar: SonarSettings) -> dict[str, RunnerSettings]:
    """The `[delivery]` table and flags, per direction: `to_sonar` and `to_lp`."""
    table: dict[str, object] = dict(load_table(getattr(args, "config", None), "delivery"))
    for key in ("mode", "durable"):
        if getattr(args, key, None):
            table[key] = getattr(args, key)
    base = str(table.pop("durable", "") or DEFAULT_DURABLE)
    if not _DURABLE.match(base):
        raise SettingsError(f"durable {base!r}: only letters, digits, - and _ are allowed")
    try:
        to_lp = msgspec.convert({**table, "durable": f"{base}-to-lp"}, RunnerSettings)
        to_sonar = msgspec.convert(
            {"max_ack_pending": TO_SONAR_MAX_ACK_PENDING, **table, "durable": f"{base}-to-sonar"},
            RunnerSettings,
        )
    except msgspec.ValidationError as exc:
        raise SettingsError(f"delivery settings: {exc}") from None
    if to_lp.mode not in ("jetstream", "core"):
        raise SettingsError(f"delivery mode {to_lp.mode!r}: must be jetstream or core")
    # A held message must never time out while its envelope legitimately waits.
    least = 2 * sonar.grace + 10
    if to_sonar.ack_wait < least:
        log.info(
            "delivery ack_wait %.0fs raised to %.0fs (2 x grace + 10) for LP -> Sonar",
            to_sonar.ack_wait,
            least,
        )
        to_sonar.ack_wait = least
    return {"to_sonar": to_sonar, "to_lp": to_lp}


def directory_for(template: str, cluster: str, clusters: list[str]) -> str:
    """The tree of one cluster: Sonar writes one cluster per tree, and so does Jobanalyzer read it."""
    if "{cluster}" in template:
        return template.replace("{cluster}", cluster)
    if len(clusters) > 1:
        raise SettingsError("--directory: with several clusters, put {cluster} in the path (one tree each)")
    return template


async def main(args: argparse.Namespace) -> int:
    from consumers.outlet import Outlet
    from consumers.runner import Runner, stop_on_signals
    from consumers.sonar.directory import DirectoryWriter
    from consumers.sonar.to_lp import ToLpSink
    from consumers.sonar.to_sonar import ToSonarSink
    from hpcbus.bus import close as close_bus
    from hpcbus.bus import connect, deadletter_stream, ensure_stream, telemetry_stream

    bus = bus_settings(args)
    sonar = sonar_settings(args)
    delivery = runner_settings(args, sonar)
    clusters = [c.strip() for c in bus.cluster.split(",") if c.strip()]
    if not clusters:
        raise SettingsError(
            "--cluster (HPCBUS_CLUSTER) is required: the cluster(s) whose subjects to translate"
        )
    overrides = stream_overrides(args.stream_max_age, args.stream_max_bytes)
    trees = {c: directory_for(sonar.directory, c, clusters) for c in clusters} if sonar.directory else {}
    jetstream = delivery["to_lp"].mode == "jetstream"

    stopping = asyncio.Event()
    stop_on_signals(stopping)
    nc = await connect(bus, delivery["to_sonar"].durable.removesuffix("-to-sonar"))
    to_sonar_sinks: list[ToSonarSink] = []
    tickers: list[asyncio.Task[None]] = []
    try:
        js = nc.jetstream()
        runners = []
        for cluster in clusters:
            stream = telemetry_stream(cluster, **overrides)
            if jetstream:
                await ensure_stream(js, stream)
                await ensure_stream(js, deadletter_stream(cluster))
            outlet = Outlet(nc, cluster, jetstream=jetstream, timeout=sonar.publish_timeout)
            tree = DirectoryWriter(trees[cluster]) if cluster in trees else None
            if sonar.to in ("sonar", "both"):
                settings = delivery["to_sonar"]
                to_sonar = ToSonarSink(
                    nc,
                    outlet,
                    settings.durable,
                    sonar,
                    tree,
                    acks=jetstream,
                    ack_wait=settings.ack_wait,
                    drain_seconds=settings.drain_seconds,
                )
                to_sonar_sinks.append(to_sonar)
                subjects = [f"{cluster}.metrics", f"{cluster}.events.>"]
                runners.append(Runner(nc, settings, stream.name, subjects, to_sonar, stopping))
            if sonar.to in ("lp", "both"):
                settings = delivery["to_lp"]
                to_lp = ToLpSink(outlet, settings.durable, tree, settings.drain_seconds)
                runners.append(Runner(nc, settings, stream.name, [f"{cluster}.sonar.>"], to_lp, stopping))
        for sink in to_sonar_sinks:
            tickers.append(asyncio.create_task(sink.run(stopping)))
        if trees:
            log.info("writing Sonar's directory tree to %s", ", ".join(sorted(set(trees.values()))))
        await asyncio.gather(*(r.run() for r in runners))
    finally:
        stopping.set()
        if tickers:  # each finishes the step in hand (bounded by drain_seconds), then sees `stopping`
            _, late = await asyncio.wait(tickers, timeout=delivery["to_sonar"].drain_seconds + 5)
            for task in late:
                task.cancel()
        for sink in to_sonar_sinks:
            try:
                await sink.close(stopping)
            except Exception:
                log.exception("%s: shutdown step failed; unacked input will be redelivered", sink.name)
        await close_bus(nc)
    log.info("stopped cleanly")
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
