"""`hpcbus produce node`: the agent every compute node runs (sample, translate, publish), or `--once`.

Configuration: flag > environment > `--config` TOML > default. The file's tables are `[bus]` (NATS, cluster),
`[node]` (what to read: `NodeCollectorConfig`), `[node_agent]` (when and how to publish: `AgentConfig`) and
`[outbox]` (the backlog while NATS is unreachable: `OutboxSettings`); deploy/node.toml documents each key.
Unknown keys are errors that name the key (exit 2), so a typo never silently falls back to a default.

`--once` reads the node twice, `once_settle` seconds apart (CPU percentages, rates and per-process CPU
utilisation need two readings), prints the second sample and exits without touching NATS: line protocol
(exactly what would be published, all subjects' lines together) or, with `--format sonar`, the Sonar
sample envelope. Either passes `hpcbus validate`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.parse

import msgspec

from hpcbus.options import Section, add_section_arguments, read_section
from hpcbus.outbox import OutboxSettings, outbox_section
from hpcbus.producers.node.collector import NodeCollectorConfig
from hpcbus.producers.node.pipeline import AgentConfig
from hpcbus.settings import BUS, STREAM_METAVARS, BusSettings, SettingsError, bus_settings

HELP = "sample this node (metrics, jobs, processes, GPUs, energy) and publish it on the bus; --once prints one sample"
USES_BUS = True


NODE = Section(
    "node", NodeCollectorConfig, metavars={"root": "DIR", "cgroup_settle_s": "S", "nvml_retry_s": "S"}
)
AGENT = Section(
    "node_agent",
    AgentConfig,
    flags={"once_settle": ("--settle",)},
    metavars={
        "interval": "SECONDS",
        "once_settle": "SECONDS",
        "hostname": "NAME",
        "sysinfo_interval": "SECONDS",
        "cpu_fields": "FIELD,FIELD",
        "max_payload": "BYTES",
        "stop_timeout": "S",
        **STREAM_METAVARS,
    },
)
OUTBOX = outbox_section("outbox")


class IngestSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Forgery protection (docs/security.md)."""

    ingest: bool = False
    """Publish on this node's own ingest subjects (`<cluster>.ingest.<host>.metrics`, ...), the only ones a
    node credential of `hpcbus deploy nats-auth` may publish on; `hpcbus consume ingest` checks that the
    lines name this node and forwards them to `<cluster>.metrics`, `.events.<class>`, ... The stream this
    agent ensures is then the ingest stream."""


INGEST = Section(None, IngestSettings, title="ingest", env={"ingest": "HPCBUS_NODE_INGEST"})
"""Flag and environment only (the node credential's environment file from `hpcbus deploy nats-auth` sets
it); read in `run`, like the other flags-only sections."""
SECTIONS = (BUS, NODE, AGENT, OUTBOX)


ONCE_CLUSTER = "local"
"""The cluster `--once` names in what it prints when `--cluster` is not given (the default of `hpcbus run`)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--once")
    g.add_argument(
        "--once",
        action="store_true",
        help=f"print one sample to stdout and exit (no NATS; --cluster optional, default {ONCE_CLUSTER!r})",
    )
    g.add_argument(
        "--format",
        choices=["lp", "sonar"],
        default="lp",
        help="--once: line protocol (default) or Sonar JSON",
    )
    for section in (NODE, AGENT, OUTBOX, INGEST):
        add_section_arguments(p, section)
    p.add_argument(
        "--min-uid",
        type=int,
        metavar="UID",
        help="`[node.jobs] min_uid`: leave out processes of users below this uid (default 1000, so root's "
        "and system users' jobs are not reported; 0 keeps all)",
    )


def load_settings(
    args: argparse.Namespace,
) -> tuple[BusSettings, NodeCollectorConfig, AgentConfig, OutboxSettings]:
    """(bus, NodeCollectorConfig, AgentConfig, OutboxSettings) from flags, environment and the config file.
    A websocket URL is refused: the agent runs without nats-py's websocket transport (`hpcbus.cli`)."""
    bus = bus_settings(args)
    for url in bus.nats:
        if urllib.parse.urlsplit(url).scheme.lower() in ("ws", "wss"):  # nats-py reads schemes so too
            raise SettingsError(
                f"NATS URL {url}: the node agent connects with nats:// or tls:// (websocket URLs are for "
                "browsers; point it at the server's client port)"
            )
    node = read_section(args, NODE)
    min_uid = getattr(args, "min_uid", None)
    if min_uid is not None:
        if min_uid < 0:
            raise SettingsError(f"--min-uid {min_uid}: a uid is 0 or more")
        node = msgspec.structs.replace(node, jobs=msgspec.structs.replace(node.jobs, min_uid=min_uid))
    return (
        bus,
        node,
        read_section(args, AGENT),
        read_section(args, OUTBOX),
    )


async def once(bus: BusSettings, node: NodeCollectorConfig, agent: AgentConfig, fmt: str) -> int:
    """The agent's first sample through the runtime's `--once` (two readings, `once_settle` apart; job starts
    seen in the first are printed with the second): its lines, or with `fmt` sonar its Sonar envelope."""
    from hpcbus.producers.node.agent import NodeAgent
    from hpcbus.schemas import subjects
    from hpcbus.schemas.message import Message
    from hpcbus.sources import once as poll_once

    # Nothing is published, so no cluster is needed: the lines say `local` (as `hpcbus run`'s) without one.
    if not bus.cluster.strip():
        bus = msgspec.structs.replace(bus, cluster=ONCE_CLUSTER)
    agent = msgspec.structs.replace(agent, sonar_subjects=fmt == "sonar")
    source = NodeAgent(bus, node, agent, settle=agent.once_settle)
    envelope = subjects.sonar(bus.cluster, "sample", prefix=bus.subject_prefix)

    def write(message: Message) -> None:
        if fmt != "sonar":
            sys.stdout.write(message.payload.decode())
        elif message.subject == envelope:
            sys.stdout.write(message.payload.decode() + "\n")

    try:
        await poll_once([source], write)
    finally:
        source.collector.close()
    sys.stdout.flush()
    return 0


async def serve(
    bus: BusSettings,
    node: NodeCollectorConfig,
    agent: AgentConfig,
    outbox: OutboxSettings,
    *,
    ingest: bool = False,
) -> int:
    from hpcbus.producers.node.agent import NodeAgent

    return await NodeAgent(bus, node, agent, outbox, ingest=ingest).run()


def run(args: argparse.Namespace) -> int:
    bus, node, agent, outbox = load_settings(args)
    if args.once:
        return asyncio.run(once(bus, node, agent, args.format))
    return asyncio.run(serve(bus, node, agent, outbox, ingest=read_section(args, INGEST).ingest))
