"""Options of `hpcbus status` and `hpcbus tail` (flags > `[status]` of `--config` > defaults)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.consumers.report.settings import WRITE_ONLY
from hpcbus.influx.settings import INFLUX
from hpcbus.options import Section


class StatusSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[status]`: how long `hpcbus status` looks, and when it calls something unhealthy."""

    timeout: Annotated[float, msgspec.Meta(gt=0.0, le=60.0)] = 3.0
    """Seconds to wait for a NATS server to answer (connect and each request); an unreachable bus is an
    answer (exit 3), never a hang."""
    json: bool = False
    """Print the facts as one JSON object instead of the screen."""
    watch: bool = False
    """Refresh in the terminal (rates per subject and cluster, lag per durable, busiest and silent nodes,
    latest errors) until Ctrl-C."""
    refresh: Annotated[float, msgspec.Meta(ge=0.2, le=3600.0)] = 2.0
    """Seconds between two screens of `--watch`."""
    node_window: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0
    """Seconds of node samples (the `<cluster>.events.sample` skeletons) read for the last sample per host,
    stretched to `silent_intervals + 1` of the hosts' interval when that is longer; hosts silent for longer
    are found by a few probes further back (docs/status.md)."""
    silent_intervals: Annotated[float, msgspec.Meta(ge=1.0)] = 3.0
    """A host is silent when its last sample is older than this many of its sample intervals."""
    worker_window: Annotated[float, msgspec.Meta(gt=0.0)] = 600.0
    """Seconds of self-telemetry (`<cluster>.telemetry`) read for the workers and producers that report it."""
    stalled_after: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0
    """A durable with messages waiting and no acknowledgement for this many seconds is stalled."""
    influx: bool = False
    """Also ask InfluxDB (the `[influx]` settings: `--influx-url`, `--db`, ...) for each host's last sample
    (`hpcbus_collect_seconds`, last 30 days): hosts silent for longer than the stream keeps, and exact
    times where the bus only probed."""
    max_values_per_tag: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    """InfluxDB's `max-values-per-tag` (`[data]` of influxdb.conf; Debian's default 100000; 0: no limit, as
    `hpcbus deploy influxdb` sets it). With `--influx`, a tag of a measurement holding `tag_values_warn` of
    it is a warning, one at the limit a problem: InfluxDB refuses the points of every new value."""
    tag_values_warn: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.8
    """The share of `max_values_per_tag` at which a tag's distinct values are a warning."""
    rate_seconds: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 1.0
    """Seconds between the two looks at each durable that give its current rate (0: rates from telemetry
    only)."""


INFLUX_STATUS = Section(
    INFLUX.table,
    INFLUX.struct,
    env=INFLUX.env,
    flags={**INFLUX.flags, "timeout": ("--influx-timeout",), **{name: () for name in WRITE_ONLY}},
    metavars=INFLUX.metavars,
    notes={name: "Not used by `status` (it only reads)." for name in WRITE_ONLY},
)
"""`consume influx`'s `[influx]` (same keys and `INFLUX_*` variables), read with `--influx`; its `timeout`
is `--influx-timeout` here (`--timeout` is NATS')."""

STATUS = Section(
    "status",
    StatusSettings,
    metavars={
        "timeout": "S",
        "refresh": "S",
        "node_window": "S",
        "silent_intervals": "N",
        "worker_window": "S",
        "stalled_after": "S",
        "rate_seconds": "S",
        "max_values_per_tag": "N",
        "tag_values_warn": "SHARE",
    },
)


UNREACHABLE = 3
"""The exit status when the bus does not answer: Nagios' UNKNOWN (no answer is not the same as a bad
answer)."""


def wanted_clusters(cluster: str) -> list[str]:
    """`--cluster a,b` -> [a, b]; none: every cluster the bus has a stream for."""
    return [c.strip() for c in cluster.split(",") if c.strip()]
