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

from hpcbus.consumers.sonar.settings import SONAR, SonarSettings
from hpcbus.delivery import PEERS_ELSEWHERE, RunnerSettings, delivery_section
from hpcbus.options import add_section_arguments, read_section
from hpcbus.settings import BUS, SettingsError, add_stream_arguments, bus_settings, check_sonar_names

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


_DURABLE_NOTE = "This command appends `-to-sonar` / `-to-lp` (one durable per direction)."
DELIVERY = delivery_section(
    DEFAULT_DURABLE,
    notes={
        "durable": _DURABLE_NOTE,
        "peers": PEERS_ELSEWHERE,
        "max_ack_pending": f"LP -> Sonar defaults to {TO_SONAR_MAX_ACK_PENDING} (it holds input for `grace`).",
        "ack_wait": "LP -> Sonar raises it to at least 2 x `grace` + 10.",
    },
)
_TO_SONAR = delivery_section(DEFAULT_DURABLE, defaults={"max_ack_pending": TO_SONAR_MAX_ACK_PENDING})
SECTIONS = (BUS, SONAR, DELIVERY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, SONAR)
    add_section_arguments(p, DELIVERY)
    add_stream_arguments(p)


def sonar_settings(args: argparse.Namespace) -> SonarSettings:
    settings = read_section(args, SONAR)
    return settings


def runner_settings(args: argparse.Namespace, sonar: SonarSettings) -> dict[str, RunnerSettings]:
    """The `[delivery]` table and flags, per direction: `to_sonar` and `to_lp`."""
    to_lp = read_section(args, DELIVERY)
    to_sonar = read_section(args, _TO_SONAR)
    base = to_lp.durable or DEFAULT_DURABLE
    if not _DURABLE.match(base):
        raise SettingsError(f"[delivery] durable = {base!r}: only letters, digits, - and _ are allowed")
    # `peers` is for the InfluxDB writer's groups, which share the table: not this command's durables.
    to_lp = msgspec.structs.replace(to_lp, durable=f"{base}-to-lp", peers=[])
    to_sonar = msgspec.structs.replace(to_sonar, durable=f"{base}-to-sonar", peers=[])
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


def sonar_names(clusters: list[str], sonar: SonarSettings) -> None:
    """`SettingsError` when LP -> Sonar could make no valid envelope: it stamps each with the cluster and the
    node's name in `hostname_form`, and Sonar's `Clustername` and `Hostname` are stricter than the bus's names
    (`_`): every envelope of every interval would be dead-lettered."""
    if sonar.to in ("sonar", "both"):
        check_sonar_names(clusters, sonar)


def check(args: argparse.Namespace) -> None:
    """What `--check-config` checks besides the tables: the names LP -> Sonar would stamp (`sonar_names`)."""
    from hpcbus.settings import clusters

    sonar_names(clusters(bus_settings(args), several=True), sonar_settings(args))


def directory_for(template: str, cluster: str, clusters: list[str]) -> str:
    """The tree of one cluster: Sonar writes one cluster per tree, and so does Jobanalyzer read it."""
    if "{cluster}" in template:
        return template.replace("{cluster}", cluster)
    if len(clusters) > 1:
        raise SettingsError("--directory: with several clusters, put {cluster} in the path (one tree each)")
    return template


async def main(args: argparse.Namespace) -> int:
    from nats.aio.client import Client as NATS

    from hpcbus.consumers.sonar.directory import DirectoryWriter
    from hpcbus.consumers.sonar.to_lp import ToLpSink
    from hpcbus.consumers.sonar.to_sonar import ToSonarSink
    from hpcbus.outlet import Outlet
    from hpcbus.schemas import subjects
    from hpcbus.sinks import Feed, serve, worker_clusters

    bus = bus_settings(args)
    sonar = sonar_settings(args)
    delivery = runner_settings(args, sonar)
    to_sonar, to_lp = delivery["to_sonar"], delivery["to_lp"]
    jetstream = to_lp.mode == "jetstream"
    clusters = worker_clusters(args, bus, jetstream=jetstream)
    names, prefix = clusters.names, clusters.prefix
    sonar_names(names, sonar)
    trees = {c: directory_for(sonar.directory, c, names) for c in names} if sonar.directory else {}
    if trees:
        log.info("writing Sonar's directory tree to %s", ", ".join(sorted(set(trees.values()))))

    async def feeds(nc: NATS) -> list[Feed]:
        out = []
        for cluster in names:
            outlet = Outlet(nc, cluster, jetstream=jetstream, timeout=sonar.publish_timeout, prefix=prefix)
            tree = DirectoryWriter(trees[cluster]) if cluster in trees else None
            stream = clusters.streams[cluster].name
            if sonar.to in ("sonar", "both"):
                sink = ToSonarSink(outlet, to_sonar.durable, sonar, tree, acks=jetstream)
                lp = subjects.wildcards(cluster, "metrics", "events", prefix=prefix)
                out.append(Feed(stream, lp, to_sonar, sink))
            if sonar.to in ("lp", "both"):
                envelopes = subjects.wildcards(cluster, "sonar", prefix=prefix)
                out.append(
                    Feed(
                        stream,
                        envelopes,
                        to_lp,
                        ToLpSink(outlet, to_lp.durable, tree, sonar, sonar.max_future),
                    )
                )
        return out

    return await serve(bus, to_sonar.durable.removesuffix("-to-sonar"), clusters.wanted, feeds)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
