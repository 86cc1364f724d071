"""`hpcbus.permanent.outcome` against a real nats-server: a publish this identity may not make is a
permissions violation that no retry cures (nats-py only times the request out and keeps the server's -ERR as
the connection's last error: `Outlet.publish` raises that), so the runtime dead-letters instead of retrying it
for ever; no stream for the subject is permanent too."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from hpcbus.bus import StreamSpec, ensure_stream, stream_name
from hpcbus.outlet import Outlet
from hpcbus.permanent import Permanent, outcome
from tests.services import NatsServer

pytestmark = pytest.mark.services


class DenyingNatsServer(NatsServer):
    """The test nats-server with one user who may publish anywhere but `<cluster>.sonar.>`."""

    def __init__(self, base_dir: Path, denied: str) -> None:
        super().__init__(base_dir)
        self.denied = denied

    def _write_config(self) -> None:
        super()._write_config()
        with self.config_path.open("a") as f:
            f.write(
                "authorization { users = [ { user: w, password: w, permissions: {"
                f' publish: {{ allow: [">"], deny: ["{self.denied}"] }}, subscribe: {{ allow: [">"] }} }} }} ] }}\n'
            )


async def test_a_publish_refused_by_permissions_or_without_a_stream_is_permanent(
    tmp_path: Path, cluster: str
) -> None:
    server = DenyingNatsServer(tmp_path / "nats", f"{cluster}.sonar.>")
    server.start()
    try:
        nc = await nats.connect(server.url, user="w", password="w", error_cb=_quiet)
        try:
            spec = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.>"])
            await ensure_stream(nc.jetstream(), spec)
            outlet = Outlet(nc, cluster, jetstream=True, timeout=1.0)
            await outlet.publish(f"{cluster}.metrics", b"m value=1 1\n", {})  # allowed: stored
            with pytest.raises(Exception) as denied:
                await outlet.publish(f"{cluster}.sonar.sample", b"{}", {})
            found = outcome(denied.value)
            assert isinstance(found, Permanent) and "permissions violation" in found.reason.lower()
            with pytest.raises(Exception) as nowhere:
                await outlet.publish("nostream.anywhere", b"x", {})
            assert isinstance(outcome(nowhere.value), Permanent)
        finally:
            await nc.close()
    finally:
        server.stop()


async def _quiet(exc: Exception) -> None:
    """The client's error callback: the violation is expected here."""
