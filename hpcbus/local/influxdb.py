"""A private InfluxDB 1.x: what `hpcbus run` starts when no `--influx-url` is given. The query and write
helpers tests need are added by `tests.services.influxdb.InfluxDB`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcbus.local.daemon import LOOPBACK, Daemon, DaemonService, free_ports, http_request, wait_until


class InfluxDB(DaemonService):
    """InfluxDB 1.x (Debian's `influxd`, 1.6.7) with a private config: meta/data/wal in `base_dir`, HTTP on
    a free loopback port, and the RPC (backup/restore) bind-address, 8088 by default, moved to a free
    loopback port as well. Reporting, UDP, Graphite, collectd, OpenTSDB, the `_internal` monitor store,
    continuous queries, retention and shard pre-creation services are off: they only add noise and ports.

    Ready means `/ping` answers 204. `stop()` + `start()` reuses the same ports and data.
    Quirk: 1.6 has no `/api/v2/write` (404); use `/write` (InfluxQL via `/query`).
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        start_timeout: float = 30.0,
        data: Mapping[str, str | int] | None = None,
    ) -> None:
        """`data`: more keys of influxdb.conf's `[data]` table (`index-version`, `max-values-per-tag`, ...:
        what `hpcbus deploy influxdb` prints, or a limit a test needs)."""
        super().__init__(base_dir, "hpcbus-influxdb-", start_timeout)
        self.data = dict(data or {})
        self.port, self.rpc_port = free_ports(2)
        if port is not None:
            self.port = port
        self.config_path = self.base_dir / "influxdb.conf"
        self.log_path = self.base_dir / "influxd.log"
        self.data_dir = self.base_dir / "data"
        self._daemon = Daemon(
            "influxd", ["influxd", "run", "-config", str(self.config_path)], self.log_path, stop_timeout=15.0
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _write_config(self) -> None:
        b = self.base_dir
        extra = "\n".join(
            f'  {key} = "{value}"' if isinstance(value, str) else f"  {key} = {value}"
            for key, value in self.data.items()
        )
        self.config_path.write_text(
            f"""reporting-enabled = false
bind-address = "{LOOPBACK}:{self.rpc_port}"

[meta]
  dir = "{b / "meta"}"
  retention-autocreate = true
  logging-enabled = false

[data]
  dir = "{self.data_dir}"
  wal-dir = "{b / "wal"}"
  wal-fsync-delay = "0s"
  query-log-enabled = false
{extra}

[coordinator]
  log-queries-after = "0s"

[retention]
  enabled = false

[shard-precreation]
  enabled = false

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[http]
  enabled = true
  bind-address = "{LOOPBACK}:{self.port}"
  auth-enabled = false
  log-enabled = false
  pprof-enabled = false
  unix-socket-enabled = false

[ifql]
  enabled = false

[logging]
  level = "info"
  suppress-logo = true

[[graphite]]
  enabled = false

[[collectd]]
  enabled = false

[[opentsdb]]
  enabled = false

[[udp]]
  enabled = false

[continuous_queries]
  enabled = false
"""
        )

    def ping(self) -> bool:
        try:
            status, _ = http_request("GET", f"{self.url}/ping", timeout=2.0)
        except OSError:
            return False
        return status == 204

    def _start(self, timeout: float) -> None:
        self._write_config()
        self._daemon.start()
        wait_until(f"InfluxDB /ping on {self.url}", self.ping, timeout, alive=self._daemon.check_alive)
