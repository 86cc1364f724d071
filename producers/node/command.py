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

import msgspec

from hpcbus.settings import BusSettings, SettingsError, bus_settings, load_table

HELP = "sample this node (metrics, jobs, processes, GPUs, energy) and publish it on the bus; --once prints one sample"
USES_BUS = True

log = logging.getLogger("hpcbus.node")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("node")
    g.add_argument("--once", action="store_true", help="print one sample to stdout and exit (no NATS)")
    g.add_argument(
        "--format",
        choices=["lp", "sonar"],
        default="lp",
        help="--once: line protocol (default) or Sonar JSON",
    )
    g.add_argument("--interval", type=float, metavar="SECONDS", help="seconds between samples (default 30)")
    g.add_argument(
        "--settle", type=float, metavar="SECONDS", help="--once: seconds between the two readings (default 1)"
    )
    g.add_argument("--root", metavar="DIR", help="read /proc and /sys under DIR (testing; default /)")
    g.add_argument("--hostname", metavar="NAME", help="node name on the bus (default: the kernel's hostname)")
    g.add_argument("--spill-dir", metavar="DIR", help="keep unsent messages on disk across restarts")


def _convert(values: dict[str, object], cls: type, what: str) -> object:
    try:
        return msgspec.convert(values, cls)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{what}: {exc}") from None


def load_settings(args: argparse.Namespace) -> tuple[BusSettings, object, object, object]:
    """(bus, NodeCollectorConfig, AgentConfig, OutboxSettings) from flags, environment and the config file."""
    from hpcbus.outbox import OutboxSettings
    from producers.node.collector import NodeCollectorConfig
    from producers.node.pipeline import AgentConfig

    config = getattr(args, "config", None)
    bus = bus_settings(args)
    node: dict[str, object] = dict(load_table(config, "node"))
    if args.root:
        node["root"] = args.root
    agent: dict[str, object] = dict(load_table(config, "node_agent"))
    if args.interval is not None:
        agent["interval"] = args.interval
    if args.settle is not None:
        agent["once_settle"] = args.settle
    if args.hostname:
        agent["hostname"] = args.hostname
    outbox: dict[str, object] = dict(load_table(config, "outbox"))
    if args.spill_dir:
        outbox["spill_dir"] = args.spill_dir
    return (
        bus,
        _convert(node, NodeCollectorConfig, "[node]"),
        _convert(agent, AgentConfig, "[node_agent]"),
        _convert(outbox, OutboxSettings, "[outbox]"),
    )


def once(bus: BusSettings, node: object, agent: object, fmt: str) -> int:
    """Two readings, the second printed. Job starts seen in the first reading are printed with it."""
    from producers.node.collector import NodeCollector, NodeCollectorConfig
    from producers.node.pipeline import AgentConfig, Pipeline
    from producers.node.to_sonar import sample_envelope
    from schemas.lineprotocol import format_lines
    from schemas.sonar.validate import encode_envelope

    assert isinstance(node, NodeCollectorConfig) and isinstance(agent, AgentConfig)
    if not bus.cluster:
        raise SettingsError("--cluster (HPCBUS_CLUSTER) is required: it names the cluster in every line")
    collector = NodeCollector(node)
    host = agent.hostname or collector.hostname
    try:
        pipeline = Pipeline(bus.cluster, host, agent)
        first = collector.collect()
        time.sleep(agent.once_settle)
        s = collector.collect()
    except ValueError as exc:  # SubjectError: a cluster name that cannot start a subject
        raise SettingsError(str(exc)) from None
    finally:
        collector.close()
    s.job_events = first.job_events + s.job_events
    if fmt == "sonar":
        sys.stdout.write(encode_envelope(sample_envelope(s, bus.cluster, node=host)).decode() + "\n")
    else:
        lines, _ = pipeline.sample_lines(s)
        sys.stdout.write(format_lines(lines))
    sys.stdout.flush()
    return 0


async def serve(bus: BusSettings, node: object, agent: object, outbox: object) -> int:
    from hpcbus.outbox import OutboxSettings
    from producers.node.agent import NodeAgent, stop_on_signals
    from producers.node.collector import NodeCollectorConfig
    from producers.node.pipeline import AgentConfig

    assert isinstance(node, NodeCollectorConfig) and isinstance(agent, AgentConfig)
    assert isinstance(outbox, OutboxSettings)
    stopping = asyncio.Event()
    stop_on_signals(stopping)
    return await NodeAgent(bus, node, agent, outbox).run(stopping)


def run(args: argparse.Namespace) -> int:
    try:
        bus, node, agent, outbox = load_settings(args)
        if args.once:
            return once(bus, node, agent, args.format)
        return asyncio.run(serve(bus, node, agent, outbox))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
