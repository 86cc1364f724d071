"""`hpcbus simulate`: publish the samples of N simulated 128-core, 4-GPU nodes, for scale and fault tests.

The load is real: every node's sample goes through the node agent's pipeline and the producer runtime's
outbox (see `producers.simulate.source`), so a broker, a stream and the workers behind it see what N real
`hpcbus produce node` would send. `--samples K` makes it a bounded flood that exits 0 once JetStream has
acknowledged all K samples of every node; without it, it runs until SIGTERM like any producer.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from hpcbus.options import add_section_arguments, read_section
from hpcbus.outbox import outbox_section
from hpcbus.producers.simulate.settings import SIMULATE
from hpcbus.settings import BUS, STREAM, SettingsError, add_stream_arguments, bus_settings, stream_overrides
from hpcbus.settings import clusters as cluster_names

HELP = "publish realistic node samples for N simulated nodes (scale tests)"
USES_BUS = True
OUTBOX = outbox_section("outbox")
"""The node agent's `[outbox]`: the simulated nodes queue as real ones do."""
SECTIONS = (BUS, SIMULATE, OUTBOX, STREAM)

log = logging.getLogger("hpcbus.simulate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, SIMULATE)
    add_section_arguments(p, OUTBOX)
    add_stream_arguments(p)


async def serve(args: argparse.Namespace) -> int:
    from hpcbus.bus import telemetry_stream
    from hpcbus.producers.simulate.shape import CorpusError
    from hpcbus.producers.simulate.source import SimulatedNodes
    from hpcbus.sources import Telemetry
    from hpcbus.sources import serve as serve_sources

    bus = bus_settings(args)
    (cluster,) = cluster_names(bus)
    settings = read_section(args, SIMULATE)
    outbox = read_section(args, OUTBOX)
    limits = read_section(args, STREAM)
    try:
        source = SimulatedNodes(settings, cluster, prefix=bus.subject_prefix)
    except CorpusError as exc:
        raise SettingsError(str(exc)) from None
    stream = telemetry_stream(
        cluster, prefix=bus.subject_prefix, **stream_overrides(limits.stream_max_age, limits.stream_max_bytes)
    )
    log.info(
        "simulating %d nodes (%s..) of cluster %s, a sample every %gs%s",
        settings.nodes,
        source.nodes[0][0].hostname,
        cluster,
        settings.interval,
        f", {settings.samples} samples each" if settings.samples else "",
    )
    telemetry = Telemetry("simulate", cluster, bus.subject_prefix, settings.stats_seconds)
    return await serve_sources(
        bus, "hpcbus-simulate", [source], outbox, [stream], on_loop=source.on_loop, telemetry=telemetry
    )


def run(args: argparse.Namespace) -> int:
    return asyncio.run(serve(args))
