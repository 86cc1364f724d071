"""The shipped cluster configuration (deploy/nats/nats-server.conf with `hpcbus deploy nats-auth`'s
auth.conf and a throw-away CA) runs as a real 3-node cluster on loopback, with only addresses and paths
changed; hpcbus commands given every member's URL (`--nats a,b,c`) create R3 streams on it (`auto`) and
ride the restart of each member in turn, the stream leader first: every sample the node producer took
is in the telemetry stream exactly once."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import RawStreamMsg
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from hpcbus import cli
from hpcbus.bus import StreamUnavailable, js_publish
from hpcbus.local.daemon import http_request
from hpcbus.permanent import Permanent, outcome
from hpcbus.schemas import subjects
from hpcbus.settings import add_bus_arguments, bus_settings, nats_connect_options
from hpcbus.streams import ingest_stream, telemetry_stream
from tests.consumer_helpers import Process, Worker, wait_for
from tests.node_fixtures import tree
from tests.services import LOOPBACK, free_ports
from tests.services.nats_cluster import ClusterMember
from tests.test_nats_auth import Secured
from tests.test_node_producer_bus import sample_times
from tests.tls_helpers import Pki

pytestmark = pytest.mark.services

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "nats"


class DeployMember(ClusterMember):
    """A member running deploy/nats/nats-server.conf, rewritten for loopback ports and a temp directory;
    its name comes from NATS_SERVER_NAME as under the shipped systemd unit."""

    def __init__(
        self,
        base: Path,
        etc: Path,
        index: int,
        cluster_ports: list[int],
        *,
        binary: Path | None = None,
        conf: Path = DEPLOY / "nats-server.conf",
    ) -> None:
        """`binary` and `conf`: the nats-server and the configuration a page installed (tests/
        test_deploy_doc.py), instead of the venv's and the repository's."""
        super().__init__(
            base / f"n{index}",
            name=f"n{index}",
            cluster_port=cluster_ports[index],
            route_ports=cluster_ports,
            start_timeout=60.0,
        )
        self.etc, self.conf = etc, conf
        self._daemon.env = {**os.environ, "NATS_SERVER_NAME": self.name}
        if binary is not None:
            self._daemon.argv[0] = str(binary)

    def _write_config(self) -> None:
        text = self.conf.read_text()
        for i, port in enumerate(self.route_ports, 1):
            text = text.replace(f"nats-route://nats{i}.example.org:6222", f"nats-route://{LOOPBACK}:{port}")
        text = text.replace("listen: 0.0.0.0:4222", f"listen: {LOOPBACK}:{self.port}")
        text = text.replace("listen: 0.0.0.0:6222", f"listen: {LOOPBACK}:{self.cluster_port}")
        text = text.replace("http: 127.0.0.1:8222", f"http: {LOOPBACK}:{self.monitor_port}")
        text = text.replace("/var/lib/nats/jetstream", str(self.store_dir)).replace(
            "/etc/nats/", f"{self.etc}/"
        )
        text = text.replace("max_file_store: 200GB", "max_file_store: 1TB")
        text = text.replace(
            'include "auth.conf"', f'include "{os.path.relpath(self.etc / "auth.conf", self.base_dir)}"'
        )
        self.config_path.write_text(text)


class Deployed:
    def __init__(self, members: list[DeployMember], auth: Secured, tls: list[str]) -> None:
        self.members, self.auth, self.tls = members, auth, tls

    @property
    def url(self) -> str:
        return ",".join(m.url for m in self.members)

    def bus(self) -> list[str]:
        """The bus flags every command gets here: all members, TLS (the identity comes from its env file)."""
        return ["--nats", self.url, "--cluster", self.auth.cluster, *self.tls]

    def leader(self, stream: str) -> int:
        def find() -> tuple[int] | None:
            for m in self.members:
                if not m.alive():
                    continue
                for account in m.jsz().get("account_details") or []:
                    for detail in account.get("stream_detail") or []:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if detail.get("name") == stream and leader:
                            return (int(leader.removeprefix("n")),)
            return None

        found: tuple[int] = wait_for(find, 60, f"a leader of {stream}")
        return found[0]

    def serving(self, client: str) -> int:
        """The member a client (by connection name) is connected to, from the members' `/connz`."""

        def find() -> tuple[int] | None:
            for i, m in enumerate(self.members):
                if m.alive():
                    status, body = http_request("GET", f"{m.monitor_url}/connz", timeout=2.0)
                    names = [conn.get("name") for conn in json.loads(body).get("connections") or []]
                    if status == 200 and client in names:
                        return (i,)
            return None

        found: tuple[int] = wait_for(find, 60, f"the member serving {client}")
        return found[0]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    base = tmp_path_factory.mktemp("deployed")
    etc = base / "etc"
    (etc / "tls").mkdir(parents=True)
    pki = Pki(etc / "tls", "site")
    cert, key = pki.issue("server", server=True)
    cert.rename(etc / "tls" / "server.pem")
    key.rename(etc / "tls" / "server-key.pem")
    pki.ca_path.rename(etc / "tls" / "ca.pem")
    client_cert, client_key = pki.issue("client", server=False)
    cluster = "deployed.example.org"
    argv = ["deploy", "nats-auth", "--cluster", cluster, "--nodes", "n001", "--out", str(etc / "auth")]
    assert cli.main([*argv, "--seed-dir", str(etc / "auth")]) == 0
    (etc / "auth.conf").write_text((etc / "auth" / "auth.conf").read_text())
    ports = free_ports(3)
    members = [DeployMember(base, etc, i, ports) for i in range(3)]
    try:
        for m in members:
            m.launch(60)
        for m in members:
            m.wait_healthy(60)
        tls = [
            "--tls-ca",
            str(etc / "tls" / "ca.pem"),
            "--tls-cert",
            str(client_cert),
            "--tls-key",
            str(client_key),
        ]
        yield Deployed(members, Secured(members[0], cluster, etc / "auth"), tls)  # type: ignore[arg-type]
    finally:
        for m in members:
            m.stop()


def test_nats_takes_every_member_comma_separated() -> None:
    parser = argparse.ArgumentParser()
    add_bus_arguments(parser)
    urls = "nats://a:4222, nats://b:4222,nats://c:4222"
    for argv, env in ((["--nats", urls], {}), (["-s", urls], {}), ([], {"NATS_URL": urls})):
        settings = bus_settings(parser.parse_args(argv), env)
        assert nats_connect_options(settings)["servers"] == [
            "nats://a:4222",
            "nats://b:4222",
            "nats://c:4222",
        ]


async def _admin(d: Deployed) -> nats.NATS:
    """The `admin` identity on every member, over the cluster's TLS."""
    import ssl

    env = d.auth.env("admin")
    ca, cert, key = d.tls[1], d.tls[3], d.tls[5]
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return await nats.connect(
        d.url.split(","), nkeys_seed=env["NATS_NKEY"], inbox_prefix=env["NATS_INBOX_PREFIX"], tls=ctx
    )


async def _stored(d: Deployed, stream: str) -> list[RawStreamMsg]:
    nc = await _admin(d)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        assert info.config.num_replicas == 3, info.config  # `auto` on a 3-node cluster
        if not info.state.messages:
            return []
        return [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    finally:
        await nc.close()


def test_a_stream_without_a_leader_is_unavailable_not_missing(deployed: Deployed) -> None:
    """A JetStream publish that nobody answers ("no responders") is permanent only when the server says no
    stream captures the subject. A stream whose leader is being elected (here: an R1 stream whose only
    replica is stopped) answers nothing for a while too; taken for "no stream", that moment dead-lettered
    good messages while a member restarted (seen in `test_commands_ride_the_restart_of_each_member`)."""
    d = deployed
    tag = os.urandom(4).hex()
    stream, subject = f"R1_{tag}", f"{d.auth.cluster}.r1probe.{tag}"

    async def go() -> tuple[BaseException, BaseException]:
        nc = await _admin(d)
        try:
            js = nc.jetstream(timeout=10)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while True:  # a fresh cluster under load may still be electing its meta leader
                try:
                    await js.add_stream(
                        name=stream, subjects=[subject], num_replicas=1
                    )  # same config: idempotent
                    info = await js.stream_info(stream)
                    break
                except (nats.errors.TimeoutError, ServiceUnavailableError):
                    assert loop.time() < deadline, "the cluster made no stream within 90 s"
                    await asyncio.sleep(0.5)
            assert info.cluster is not None and info.cluster.leader, info
            victim = d.members[int(info.cluster.leader.removeprefix("n"))]
            victim.stop()
            try:
                deadline = loop.time() + 60
                while True:  # on another member (the client reconnects if it was on the victim)
                    if nc.is_connected and str(victim.port) not in str(nc.connected_url):
                        try:
                            await js_publish(nc, subject, b"probe", None, 2)
                        except (StreamUnavailable, NoStreamResponseError) as exc:
                            unavailable = exc
                            break
                        except (ConnectionError, TimeoutError):
                            pass  # reconnecting, or the probe waited out a slow answer: again
                    assert loop.time() < deadline, "no answer from the cluster"
                    await asyncio.sleep(0.1)
                with pytest.raises(NoStreamResponseError) as missing:
                    await js_publish(nc, f"{d.auth.cluster}.nostream.{tag}", b"probe", None, 2)
            finally:
                victim.start(60)
            await js.delete_stream(stream)
            return unavailable, missing.value
        finally:
            await nc.close()

    unavailable, missing = asyncio.run(go())
    assert isinstance(unavailable, StreamUnavailable), unavailable
    assert not isinstance(outcome(unavailable), Permanent), (unavailable, outcome(unavailable))
    assert isinstance(outcome(missing), Permanent) and "no stream captures" in outcome(missing).reason


def test_commands_ride_the_restart_of_each_member(
    deployed: Deployed, tmp_path: Path, workers: list[Process]
) -> None:
    d, c = deployed, deployed.auth.cluster
    node = Worker(
        ["produce", "node", *d.bus(), "--root", str(tree(tmp_path)), "--interval", "1", "--hostname", "n001"],
        tmp_path / "node.log",
        d.auth.env("node-n001"),
    )
    ingest = Worker(["consume", "ingest", *d.bus()], tmp_path / "ingest.log", d.auth.env("worker-ingest"))
    workers += [ingest, node]
    ingest.start(timeout=60)
    node.start(ready="nats: connected", timeout=60)
    telemetry = telemetry_stream(c).name

    def samples() -> list[int]:
        return sample_times(asyncio.run(_stored(d, telemetry)), c)

    def count() -> int:
        """Samples stored; 0 while this test's own reader waits out an election (a timeout)."""
        try:
            return len(samples())
        except (nats.errors.Error, OSError):
            return 0

    wait_for(lambda: count() >= 3, 90, "samples through ingest on the cluster")
    leaders = (lambda: d.leader(ingest_stream(c).name), lambda: d.leader(telemetry))
    serving = (lambda: d.serving("hpcbus-node-n001"), lambda: d.serving("hpcbus-ingest"))
    restarted = []
    for find in (*leaders, *serving):
        victim = find()
        restarted.append(victim)
        wanted = wait_for(count, 60, "the stream readable") + 3
        d.members[victim].stop()
        wait_for(lambda: count() >= wanted, 120, f"samples while n{victim} is down")  # noqa: B023
        d.members[victim].start(60)
    assert len(set(restarted)) >= 2, restarted
    assert node.terminate() == 0, node.log()
    taken, unsent = map(int, re.findall(r"stopped after (\d+) samples;.*, (\d+) unsent", node.log())[-1])
    assert unsent == 0, node.log()
    wait_for(lambda: count() >= taken, 120, f"all {taken} samples forwarded")
    times = samples()
    assert len(times) == len(set(times)) == taken, (taken, times)  # none lost, none twice
    assert ingest.terminate() == 0, ingest.log()
    for w in (node, ingest):
        assert "Traceback" not in w.log() and "permissions violation" not in w.log().lower(), w.log()
    through = {m.subject for m in asyncio.run(_stored(d, ingest_stream(c).name))}
    assert subjects.ingest(c, "n001", subjects.metrics(c)) in through  # the node's own ingest subjects
    assert all(str(s).startswith(f"{c}.ingest.n001.") for s in through), through
