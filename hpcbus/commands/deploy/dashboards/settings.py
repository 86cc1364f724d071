"""Settings of `hpcbus deploy grafana` (`[grafana]`) and `hpcbus deploy influx-retention` (`[retention]`).

Where InfluxDB is and which database and retention policy hold the raw data come from `[influx]`, the table
`consume influx` reads, so the dashboards, the downsampling and the writer always agree on them.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from hpcbus.options import Section

DURATION = r"^([0-9]+(ns|u|µ|ms|s|m|h|d|w))+$|^INF$"
"""An InfluxQL duration literal (`30d`, `1h30m`; `INF` = keep for ever)."""
Duration = Annotated[str, msgspec.Meta(pattern=DURATION)]


class GrafanaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What `deploy grafana` writes and where Grafana will find it."""

    output: str = "deploy/grafana"
    """Directory the provisioning files and dashboards are written to (`provisioning/`, `dashboards/`)."""
    dashboards_path: str = "/var/lib/grafana/dashboards/hpcbus"
    """Where Grafana reads the dashboards from (copy `OUTPUT/dashboards/` there): the dashboard provider's
    `path`."""
    min_interval: Duration = "30s"
    """The data source's minimum `$__interval`: the node producer's sample interval, so a graph never asks
    for buckets finer than the data."""


class RetentionSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How long InfluxDB keeps raw data and the 5-minute means, and how often the means are computed."""

    raw_duration: Duration = "30d"
    """How long the raw retention policy (`[influx] rp`, else `autogen`) keeps data."""
    downsampled_duration: Duration = "365d"
    """How long the `5m` retention policy keeps the 5-minute means."""
    resample_every: Duration = "5m"
    """How often each continuous query runs (InfluxQL `RESAMPLE EVERY`)."""
    resample_for: Duration = "15m"
    """The window each run recomputes (`RESAMPLE FOR`, at least 5m): samples that arrive late (a node's
    outbox after a NATS outage) are still averaged in if they are younger than this."""


def duration_seconds(text: str) -> float:
    """Seconds of an InfluxQL duration (`INF` -> infinity)."""
    if text == "INF":
        return float("inf")
    unit = {"ns": 1e-9, "u": 1e-6, "µ": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ns|u|µ|ms|s|m|h|d|w)", text))


GRAFANA = Section("grafana", GrafanaSettings, metavars={"output": "DIR", "dashboards_path": "DIR"})
RETENTION = Section("retention", RetentionSettings)
