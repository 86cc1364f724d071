"""InfluxDB settings (`[influx]`), named as InfluxDB's own tools name them (INFLUX_URL, INFLUX_TOKEN, ...)."""

from __future__ import annotations

from typing import Literal

import msgspec

from hpcbus.keys import MAX_FUTURE, MaxFuture
from hpcbus.options import Section


class InfluxSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where and how to write to InfluxDB."""

    url: str = "http://127.0.0.1:8086"
    """InfluxDB base URL."""
    api: Literal["v1", "v2"] = "v1"
    """`v1` (`/write?db=&rp=`, InfluxDB 1.x) or `v2` (`/api/v2/write` through influxdb-client: 2.x, 3.x,
    1.8+, VictoriaMetrics)."""
    db: str = "hpcbus"
    """v1 database (`consume influx` creates it at start-up when missing)."""
    rp: str = ""
    """v1 retention policy ("" = the database's default)."""
    username: str = ""
    """v1 basic-auth user."""
    password: str = ""
    """v1 basic-auth password."""
    token: str = ""
    """v2 API token."""
    org: str = ""
    """v2 organisation."""
    bucket: str = "hpcbus"
    """v2 bucket."""
    batch_lines: int = 5000
    """Lines per write request (InfluxDB's recommended batch)."""
    gzip: bool = True
    """Compress write requests (up to 5x faster writes)."""
    timeout: float = 10.0
    """Seconds per request: a write of `consume influx`, a query of `report` (at least 30 s there)."""
    max_retry_wait: float = 30.0
    """Longest back-off between retries of a failed batch."""
    processes: Literal["aggregate", "full"] = "aggregate"
    """Process-level lines: `aggregate` to one series per (host, job) (pid/cmd tags would explode InfluxDB's
    series cardinality), or `full` to keep every process series."""
    max_future: MaxFuture = MAX_FUTURE


ENV = {
    "url": "INFLUX_URL",
    "token": "INFLUX_TOKEN",
    "org": "INFLUX_ORG",
    "bucket": "INFLUX_BUCKET",
    "db": "INFLUX_DB",
    "username": "INFLUX_USERNAME",
    "password": "INFLUX_PASSWORD",
}

INFLUX = Section(
    "influx",
    InfluxSettings,
    env=ENV,
    # --user, --password and --url-like names belong to the bus; InfluxDB's carry an `influx` prefix.
    flags={
        "url": ("--influx-url",),
        "api": ("--influx-api",),
        "username": ("--influx-user",),
        "password": ("--influx-password",),
    },
    metavars={"url": "URL", "username": "NAME", "password": "SECRET", "token": "SECRET"},
)
