"""A 3-node nats-server cluster with JetStream on loopback ports: what the fault suite, the scale benchmark
and the cluster tests run hpcbus on, so "a member died" is a real Raft election, not a mock.

Each member is a `hpcbus.local.nats_server.NatsServer` (same binary, config, store layout and readiness
checks) with a name of its own and a `cluster {}` block routing to the others. nats-server reads its config
as a map in which a later key replaces an earlier one, so the member only appends to the file its parent
writes.

A lone member of a fresh cluster cannot report JetStream healthy (there is no meta leader until a majority
runs), so the cluster first launches every member, then waits until each one's `/healthz` passes. A member
restarted with `start(i)` rejoins on its own ports and store and is ready once it has caught up.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from hpcbus.local.daemon import LOOPBACK, ServiceError, free_ports, http_request, wait_until
from hpcbus.local.nats_server import NatsServer

CLUSTER_NAME = "hpcbus-test-cluster"


class ClusterMember(NatsServer):
    """One member: a `NatsServer` whose config adds `server_name` (unique, JetStream needs it) and routes."""

    def __init__(
        self,
        base_dir: Path,
        *,
        name: str,
        cluster_port: int,
        route_ports: Sequence[int],
        start_timeout: float,
        advertise: bool = True,
    ) -> None:
        super().__init__(base_dir, start_timeout=start_timeout)
        self.name = name
        self.cluster_port = cluster_port
        self.route_ports = list(route_ports)
        self.advertise = advertise

    def _write_config(self) -> None:
        super()._write_config()
        routes = ", ".join(f'"nats-route://{LOOPBACK}:{p}"' for p in self.route_ports)
        extra = [
            f'server_name: "{self.name}"',
            "cluster {",
            f'  name: "{CLUSTER_NAME}"',
            f'  listen: "{LOOPBACK}:{self.cluster_port}"',
            f"  routes: [{routes}]",
            # Without advertising, clients know only the URLs they were given: a client behind a proxy
            # stays behind it instead of reconnecting straight to a member it learnt from INFO.
            f"  no_advertise: {'false' if self.advertise else 'true'}",
            "}",
        ]
        with self.config_path.open("a") as f:
            f.write("\n".join(extra) + "\n")

    def launch(self, timeout: float) -> None:
        """Start the process and wait until it accepts clients, without waiting for JetStream health (which
        needs the other members)."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._daemon.start()
        info = wait_until(
            f"{self.name} on {self.url}", self._client_info, timeout, alive=self._daemon.check_alive
        )
        if not info.get("jetstream"):
            raise ServiceError(f"{self.name} runs without JetStream:\n{self._daemon.log_tail()}")

    def wait_healthy(self, timeout: float) -> None:
        wait_until(f"{self.name} /healthz", self._healthy, timeout, alive=self._daemon.check_alive)

    def _start(self, timeout: float) -> None:
        self.launch(timeout)
        self.wait_healthy(timeout)

    def jsz(self) -> dict[str, Any]:
        """The member's `/jsz` with stream details (which streams it hosts and who leads each)."""
        status, body = http_request(
            "GET", f"{self.monitor_url}/jsz", params={"accounts": "true", "streams": "true"}, timeout=2.0
        )
        if status != 200:
            raise ServiceError(f"{self.name} /jsz: HTTP {status}")
        answer: dict[str, Any] = json.loads(body)
        return answer


class NatsCluster:
    """`size` nats-servers with JetStream routed into one cluster, each in `base_dir/n<i>/`.

    `advertise=False` keeps members from telling clients about each other (`cluster.no_advertise`), for
    tests that put a proxy between a client and the cluster.

    `urls` lists every member's client URL (what `--nats` takes, comma-joined as `url`); `kill(i)` SIGKILLs
    member i (its store stays), `start(i)` starts it again on the same ports and store and returns once it
    is healthy, `leader(stream)` is the index of the member leading the stream's Raft group.
    """

    def __init__(
        self, base_dir: Path | str, size: int = 3, *, start_timeout: float = 60.0, advertise: bool = True
    ) -> None:
        self.base_dir = Path(base_dir)
        self.start_timeout = start_timeout
        ports = free_ports(size)
        self.members = [
            ClusterMember(
                self.base_dir / f"n{i}",
                name=f"n{i}",
                cluster_port=ports[i],
                route_ports=[p for j, p in enumerate(ports) if j != i],
                start_timeout=start_timeout,
                advertise=advertise,
            )
            for i in range(size)
        ]
        self.start_seconds: float | None = None

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """All members, comma-separated: the form `--nats` and `NATS_URL` take."""
        return ",".join(self.urls)

    def start_all(self) -> Self:
        """Launch every member, then wait until each reports JetStream healthy (a meta leader exists)."""
        t0 = time.monotonic()
        try:
            for m in self.members:
                if not m.alive():
                    m.launch(self.start_timeout)
            for m in self.members:
                m.wait_healthy(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def kill(self, i: int) -> None:
        """SIGKILL member `i` (a crash: no clean shutdown, no leadership hand-over)."""
        member = self.members[i]
        pid = member.pid
        if pid is not None and member.alive():
            os.kill(pid, signal.SIGKILL)
        member.stop()  # reaps the process; its store stays

    def start(self, i: int, timeout: float | None = None) -> None:
        """Start member `i` again on its ports and store; returns once it has rejoined and caught up."""
        self.members[i].start(timeout)

    def alive(self, i: int) -> bool:
        return self.members[i].alive()

    def leader(self, stream: str, timeout: float = 30.0) -> int:
        """Index of the member that leads `stream` (waits through an election, up to `timeout` seconds)."""
        names = {m.name: i for i, m in enumerate(self.members)}

        def find() -> int | None:
            for m in self.members:
                if not m.alive():
                    continue
                try:
                    jsz = m.jsz()
                except (OSError, ServiceError):
                    continue
                for account in jsz.get("account_details") or []:
                    for detail in account.get("stream_detail") or []:
                        if detail.get("name") == stream:
                            leader = (detail.get("cluster") or {}).get("leader")
                            if leader in names and self.members[names[leader]].alive():
                                return names[leader]
            return None

        found: tuple[int] = wait_until(
            f"a leader of stream {stream}", lambda: (lambda i: None if i is None else (i,))(find()), timeout
        )
        return found[0]

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> Self:
        return self.start_all()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
