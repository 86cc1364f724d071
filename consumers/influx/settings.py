"""InfluxDB settings, named as InfluxDB's own tools name them (INFLUX_URL, INFLUX_TOKEN, ...)."""

from __future__ import annotations

import msgspec


class InfluxSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str = "http://127.0.0.1:8086"
    """InfluxDB base URL (INFLUX_URL)."""
    api: str = "v1"
    """`v1` (`/write?db=&rp=`, InfluxDB 1.x) or `v2` (`/api/v2/write` through influxdb-client: 2.x, 3.x,
    1.8+, VictoriaMetrics)."""
    db: str = "hpcbus"
    """v1 database (INFLUX_DB); created at start-up when missing."""
    rp: str = ""
    """v1 retention policy ("" = the database's default)."""
    username: str = ""
    """v1 basic-auth user (INFLUX_USERNAME)."""
    password: str = ""
    """v1 basic-auth password (INFLUX_PASSWORD)."""
    token: str = ""
    """v2 API token (INFLUX_TOKEN)."""
    org: str = ""
    """v2 organisation (INFLUX_ORG)."""
    bucket: str = "hpcbus"
    """v2 bucket (INFLUX_BUCKET)."""
    batch_lines: int = 5000
    """Lines per write request (InfluxDB's recommended batch)."""
    batch_seconds: float = 1.0
    """A batch is written at least this often when lines are waiting."""
    gzip: bool = True
    """Compress write requests (up to 5x faster writes)."""
    timeout: float = 10.0
    """Seconds per write request."""
    max_retry_wait: float = 30.0
    """Longest back-off between retries of a failed batch."""
    processes: str = "aggregate"
    """Process-level lines: `aggregate` to one series per (host, job) (default; pid/cmd tags would explode
    InfluxDB's series cardinality), or `full` to keep every process series."""


ENV = {
    "url": "INFLUX_URL",
    "token": "INFLUX_TOKEN",
    "org": "INFLUX_ORG",
    "bucket": "INFLUX_BUCKET",
    "db": "INFLUX_DB",
    "username": "INFLUX_USERNAME",
    "password": "INFLUX_PASSWORD",
}
