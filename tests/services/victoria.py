"""A private VictoriaMetrics for tests: the InfluxDB-compatible time-series database the consumers must also
write to (hpcbus itself never starts one)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcbus.local.daemon import (
    LOOPBACK,
    Daemon,
    DaemonService,
    ServiceError,
    free_port,
    http_request,
    wait_until,
)


class VictoriaMetrics(DaemonService):
    """Single-node VictoriaMetrics (Debian `victoria-metrics`, 1.79) on a free loopback port with its data
    in `base_dir`. Only `-httpListenAddr` listens (the Influx/Graphite/OpenTSDB listeners are off by default).

    What we found about its InfluxDB-compatible write (`/write`, `/api/v2/write`, line protocol):
    - each field becomes its own series named `<measurement>_<field>`: `cpu,host=a value=1.5` is stored as
      `cpu_value{host="a"}`; `-influxSkipSingleField` (pass via `extra_args`) would make it `cpu`;
    - every value is a float: `3i` -> 3, `true`/`false` -> 1/0, and a string field becomes a series of
      zeros (`ev,host=a msg="hi"` -> `ev_msg{host="a"} 0`), it is not dropped;
    - `precision` (s, ms, us, ns) is honoured; timestamps are kept in milliseconds (finer parts cut off);
    - `?db=x` on the URL adds a label `db="x"` to every series; `?bucket=x` adds nothing;
    - `/api/v2/write` answers 204 before the data is searchable: samples wait in memory (~1 s) unless
      `flush()` (`/internal/force_flush`) runs, and even after a flush a *new* series occasionally shows
      up in `/api/v1/export` or `/api/v1/query` only 0.5-2 s later (seen on 1.79). `export()` flushes
      first; tests must poll for what they expect (`wait_for_series(match, until=...)`).
    Started with `-retentionPeriod=100y` (the default 1 month silently drops older test timestamps),
    `-search.latencyOffset=0s` (default 30 s hides fresh points from queries at "now") and
    `-search.disableCache` (cached results would hide backfilled points).
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(base_dir, "hpcbus-vm-", start_timeout)
        self.port = port if port is not None else free_port()
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "victoria-metrics.log"
        self._daemon = Daemon(
            "victoria-metrics",
            [
                "victoria-metrics",
                f"-httpListenAddr={LOOPBACK}:{self.port}",
                f"-storageDataPath={self.data_dir}",
                "-retentionPeriod=100y",
                "-search.latencyOffset=0s",
                "-search.disableCache",
                "-memory.allowedPercent=20",
                *extra_args,
            ],
            self.log_path,
            stop_timeout=15.0,
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def influx_write_url(self) -> str:
        """Where InfluxDB v2 clients point their write API (`/api/v2/write`)."""
        return f"{self.url}/api/v2/write"

    def healthy(self) -> bool:
        try:
            status, body = http_request("GET", f"{self.url}/health", timeout=2.0)
        except OSError:
            return False
        return status == 200 and body.strip() == b"OK"

    def _start(self, timeout: float) -> None:
        self._daemon.start()
        wait_until(
            f"VictoriaMetrics /health on {self.url}", self.healthy, timeout, alive=self._daemon.check_alive
        )

    def write(self, lines: str | Iterable[str], precision: str = "s", db: str | None = None) -> None:
        """POST line protocol to `/api/v2/write` (what an InfluxDB v2 client does); raise unless 204."""
        text = lines if isinstance(lines, str) else "\n".join(lines)
        params = {"precision": precision}
        if db:
            params["db"] = db
        status, raw = http_request("POST", self.influx_write_url, params=params, data=text.encode())
        if status != 204:
            raise ServiceError(f"VictoriaMetrics write failed: HTTP {status}: {raw.decode(errors='replace')}")

    def flush(self) -> None:
        """Make everything received so far searchable (`/internal/force_flush`)."""
        status, raw = http_request("GET", f"{self.url}/internal/force_flush")
        if status != 200:
            raise ServiceError(f"VictoriaMetrics force_flush: HTTP {status}: {raw.decode(errors='replace')}")

    def export(self, match: str = '{__name__=~".+"}') -> list[dict[str, Any]]:
        """All raw samples of the series matching the selector, via `/api/v1/export` after a flush: a list
        of `{"metric": {"__name__": ..., labels...}, "values": [float...], "timestamps": [ms...]}`."""
        self.flush()
        status, raw = http_request("POST", f"{self.url}/api/v1/export", data=_form({"match[]": match}))
        if status != 200:
            raise ServiceError(
                f"VictoriaMetrics export {match}: HTTP {status}: {raw.decode(errors='replace')}"
            )
        return [json.loads(line) for line in raw.splitlines() if line.strip()]

    def wait_for_series(
        self,
        match: str,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 10.0,
    ) -> list[dict[str, Any]]:
        """`export(match)` polled until `until(series)` holds (default: anything matched) and returned.
        Pass e.g. `until=lambda s: len(s) >= 2` when several series are expected: they become visible one
        by one."""

        def check() -> list[dict[str, Any]] | None:
            series = self.export(match)
            return series if until(series) else None

        result: list[dict[str, Any]] = wait_until(
            f"VictoriaMetrics series {match}", check, timeout, interval=0.1
        )
        return result

    def query(self, promql: str, at: float | None = None) -> dict[str, Any]:
        """Instant query (`/api/v1/query`, MetricsQL); `at` is a Unix time (default now). Raises on errors."""
        params = {"query": promql}
        if at is not None:
            params["time"] = str(at)
        status, raw = http_request("POST", f"{self.url}/api/v1/query", data=_form(params))
        answer: dict[str, Any] = json.loads(raw) if raw.startswith(b"{") else {}
        if status != 200 or answer.get("status") != "success":
            raise ServiceError(
                f"VictoriaMetrics query {promql!r}: HTTP {status}: {raw.decode(errors='replace')}"
            )
        return answer


def _form(params: Mapping[str, str]) -> bytes:
    return urllib.parse.urlencode(params).encode()
