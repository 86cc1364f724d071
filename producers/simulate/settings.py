"""Options of `hpcbus simulate` (flags > `[simulate]` table of `--config` > defaults)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.keys import ALIGN, STATS_SECONDS, Align, StatsSeconds
from hpcbus.options import Section


class SimulateSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[simulate]`: how many nodes, how often, and for how long."""

    nodes: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 10
    """Simulated nodes, each a 128-core, 4-GPU node with jobs (about 1,250 lines, 130 kB per sample)."""
    interval: Annotated[float, msgspec.Meta(ge=1.0, le=86400.0)] = 30.0
    """Seconds between samples of each node (every node samples at each tick, as aligned real nodes do).
    At least 1: sample times are whole seconds on the bus, so two samples within one second would be one
    point in InfluxDB."""
    samples: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Stop (exit 0) once this many samples of every node were acknowledged by JetStream; 0 = run until
    SIGTERM. A bounded run is a countable flood: nodes x samples samples, each one the same message
    whenever it is built (the same Nats-Msg-Id), so a re-send is never stored twice."""
    hostname_prefix: str = "sim"
    """Node names are this prefix and a 5-digit number (`sim00001`, ...)."""
    first: Annotated[int, msgspec.Meta(ge=0)] = 1
    """Number of the first node: several simulators with disjoint ranges act as one bigger cluster."""
    align: Align = ALIGN
    max_pending: Annotated[int, msgspec.Meta(ge=1)] = 4
    """Ticks built but not yet acknowledged before the simulator waits (a slow bus then shows as ticks
    skipped, counted in the log, instead of as a growing backlog)."""
    stats_seconds: StatsSeconds = STATS_SECONDS


SIMULATE = Section(
    "simulate",
    SimulateSettings,
    metavars={
        "nodes": "N",
        "interval": "S",
        "samples": "N",
        "hostname_prefix": "PREFIX",
        "first": "N",
        "max_pending": "N",
        "stats_seconds": "S",
    },
)
