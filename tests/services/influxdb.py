"""InfluxDB 1.x for tests and benchmarks: `hpcbus.local.influxdb.InfluxDB` (the process `hpcbus run` also
starts) plus the InfluxQL query and `/write` helpers that let a test check what a worker wrote, kept out of
the shipped package because only tests and `bench/` read data back this way."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from typing import Any

from hpcbus.local.daemon import ServiceError, http_request
from hpcbus.local.influxdb import InfluxDB as _InfluxDBProcess


class InfluxDB(_InfluxDBProcess):
    """The private InfluxDB 1.x of `hpcbus.local.influxdb`, with `query`, `points`, `create_db` and `write`."""

    def query(self, q: str, db: str | None = None, *, epoch: str | None = None) -> dict[str, Any]:
        """Run InfluxQL via POST `/query`; return the JSON answer. Raises `ServiceError` on an HTTP error or
        when a statement reports an error, so a typo never looks like "no data". `epoch` ("s", "ms", "ns",
        ...) returns integer timestamps instead of RFC3339 strings."""
        params = {"q": q}
        if db:
            params["db"] = db
        if epoch:
            params["epoch"] = epoch
        body = urllib.parse.urlencode(params).encode()
        status, raw = http_request(
            "POST",
            f"{self.url}/query",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 200:
            raise ServiceError(f"InfluxDB query {q!r} failed: HTTP {status}: {raw.decode(errors='replace')}")
        answer: dict[str, Any] = json.loads(raw)
        for result in answer.get("results", []):
            if "error" in result:
                raise ServiceError(f"InfluxDB query {q!r} failed: {result['error']}")
        return answer

    def points(self, q: str, db: str | None = None, *, epoch: str | None = None) -> list[dict[str, Any]]:
        """The rows of all series of `query(q, db)` as dicts (column -> value), each with the series' tags
        (GROUP BY) merged in and the measurement under `"_measurement"`."""
        rows: list[dict[str, Any]] = []
        for result in self.query(q, db, epoch=epoch).get("results", []):
            for series in result.get("series", []):
                base = {"_measurement": series.get("name"), **series.get("tags", {})}
                rows.extend(
                    {**base, **dict(zip(series["columns"], v, strict=True))} for v in series["values"]
                )
        return rows

    def create_db(self, name: str) -> None:
        """CREATE DATABASE (idempotent in InfluxDB 1.x)."""
        ident = name.replace("\\", "\\\\").replace('"', '\\"')
        self.query(f'CREATE DATABASE "{ident}"')

    def write(self, lines: str | Iterable[str], db: str, precision: str = "s", rp: str | None = None) -> None:
        """POST line protocol to `/write`; raise `ServiceError` unless it answers 204 (1.x answers 400
        "partial write" when some lines are bad, after storing the good ones)."""
        text = lines if isinstance(lines, str) else "\n".join(lines)
        params = {"db": db, "precision": precision}
        if rp:
            params["rp"] = rp
        status, raw = http_request("POST", f"{self.url}/write", params=params, data=text.encode())
        if status != 204:
            raise ServiceError(
                f"InfluxDB write to {db!r} failed: HTTP {status}: {raw.decode(errors='replace')}"
            )
