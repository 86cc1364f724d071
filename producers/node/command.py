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
import logging
import sys
import time
import urllib.parse

import msgspec

from hpcbus.options import Section, add_section_arguments, read_section
from hpcbus.outbox import OutboxSettings
from hpcbus.producers.node.collector import NodeCollectorConfig
from hpcbus.producers.node.pipeline import AgentConfig
from hpcbus.settings import BUS, BusSettings, SettingsError, bus_settings
from hpcbus.settings import clusters as cluster_names

HELP = "sample this node (metrics, jobs, processes, GPUs, energy) and publish it on the bus; --once prints one sample"
USES_BUS = True

log = logging.getLogger("hpcbus.node")


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
        "stream_max_age": "S",
        "stream_max_bytes": "BYTES",
        "max_payload": "BYTES",
        "stop_timeout": "S",
    },
)
OUTBOX = Section("outbox", OutboxSettings, metavars={"spill_dir": "DIR", "max_bytes": "BYTES"})


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
    node: NodeCollectorConfig = read_section(args, NODE)
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


def once(bus: BusSettings, node: object, agent: object, fmt: str) -> int:
    """Two readings, the second printed. Job starts seen in the first reading are printed with it."""
    from hpcbus.producers.node.collector import NodeCollector, NodeCollectorConfig
    from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
    from hpcbus.producers.node.to_sonar import sample_envelope
    from hpcbus.schemas.lineprotocol import format_lines
    from hpcbus.schemas.sonar.validate import encode_envelope

    assert isinstance(node, NodeCollectorConfig) and isinstance(agent, AgentConfig)
    # Nothing is published, so no cluster is needed: the lines say `local` (as `hpcbus run`'s) without one.
    cluster = cluster_names(bus)[0] if bus.cluster.strip() else ONCE_CLUSTER
    collector = NodeCollector(node)
    host = agent.node_name(collector.hostname)
    try:
        pipeline = Pipeline(cluster, host, agent)
        first = collector.collect()
        time.sleep(agent.once_settle)
        s = collector.collect()
    except ValueError as exc:  # SubjectError: a cluster name that cannot start a subject
        raise SettingsError(str(exc)) from None
    finally:
        collector.close()
    s.job_events = first.job_events + s.job_events
    if fmt == "sonar":
        sys.stdout.write(encode_envelope(sample_envelope(s, cluster, node=host)).decode() + "\n")
    else:
        lines, _ = pipeline.sample_lines(s)
        sys.stdout.write(format_lines(lines))
    sys.stdout.flush()
    return 0


async def serve(
    bus: BusSettings, node: object, agent: object, outbox: object, *, ingest: bool = False
) -> int:
    from hpcbus.outbox import OutboxSettings
    from hpcbus.producers.node.agent import NodeAgent
    from hpcbus.producers.node.collector import NodeCollectorConfig
    from hpcbus.producers.node.pipeline import AgentConfig

    assert isinstance(node, NodeCollectorConfig) and isinstance(agent, AgentConfig)
    assert isinstance(outbox, OutboxSettings)
    return await NodeAgent(bus, node, agent, outbox, ingest=ingest).run()


def run(args: argparse.Namespace) -> int:
    try:
        bus, node, agent, outbox = load_settings(args)
        if args.once:
            return once(bus, node, agent, args.format)
        ingest: IngestSettings = read_section(args, INGEST)
        return asyncio.run(serve(bus, node, agent, outbox, ingest=ingest.ingest))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
