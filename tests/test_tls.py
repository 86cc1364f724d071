"""TLS between clients and nats-server, with a throw-away CA made here: `--tls-ca/--tls-cert/--tls-key`
(or `[bus] tlsca/tlscert/tlskey`) reach the server over verified TLS with a client certificate; a client that
does not trust the server's CA, or has no certificate the server's CA signed, does not get in."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest

from hpcbus.bus import round_trip
from hpcbus.connection import connect
from hpcbus.settings import BusSettings, nats_connect_options
from hpcbus.streams import server_info
from tests.consumer_helpers import Worker
from tests.services import NatsServer
from tests.tls_helpers import Pki

pytestmark = pytest.mark.services


class TlsNatsServer(NatsServer):
    """The test nats-server requiring TLS and a client certificate signed by `ca`."""

    def __init__(self, base_dir: Path, cert: Path, key: Path, ca: Path) -> None:
        super().__init__(base_dir)
        self.tls = (cert, key, ca)

    def _write_config(self) -> None:
        super()._write_config()
        cert, key, ca = self.tls
        with self.config_path.open("a") as f:
            f.write(
                f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n  ca_file: "{ca}"\n  verify: true\n}}\n'
            )


class Setup:
    def __init__(self, server: TlsNatsServer, pki: Pki, client: tuple[Path, Path], stranger: Pki) -> None:
        self.server, self.pki, self.client, self.stranger = server, pki, client, stranger


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = tmp_path_factory.mktemp("tls")
    pki = Pki(base, "site")
    cert, key = pki.issue("nats-server", server=True)
    client = pki.issue("hpcbus-client", server=False)
    stranger = Pki(base, "other")
    with TlsNatsServer(base / "nats", cert, key, pki.ca_path) as server:
        yield Setup(server, pki, client, stranger)


def bus(tls: Setup, **kw: str) -> BusSettings:
    settings = {"tlsca": str(tls.pki.ca_path), "tlscert": str(tls.client[0]), "tlskey": str(tls.client[1])}
    return msgspec.convert({"nats": [tls.server.url], "cluster": "fox", **settings, **kw}, BusSettings)


async def _round_trip(settings: BusSettings) -> bytes:
    nc = await nats.connect(**nats_connect_options(settings), allow_reconnect=False, connect_timeout=5)  # type: ignore[arg-type]
    try:
        sub = await nc.subscribe("tls.check")
        await nc.publish("tls.check", b"over tls")
        msg = await sub.next_msg(timeout=5)
        return msg.data
    finally:
        await nc.close()


def test_the_runtime_connects_over_verified_tls_with_a_client_certificate(tls: Setup) -> None:
    async def go() -> bool:
        nc = await asyncio.wait_for(connect(bus(tls), "tls-test"), 20)
        try:
            # the server requires TLS and a verified client certificate: being connected means both held
            return nc.is_connected and bool(
                server_info(nc).get("tls_required") and server_info(nc).get("tls_verify")
            )
        finally:
            await nc.close()

    assert asyncio.run(go())
    assert asyncio.run(_round_trip(bus(tls))) == b"over tls"


def test_the_flags_reach_a_real_command(tls: Setup, tmp_path: Path) -> None:
    """`hpcbus pub` with `--tls-ca/--tls-cert/--tls-key` (the spelling of the issue) publishes."""
    ca, (cert, key) = tls.pki.ca_path, tls.client
    argv = ["pub", "--nats", tls.server.url, "--cluster", "fox", "--tls-ca", str(ca)]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), "tls.cmd", "hello"]

    async def go() -> bytes:
        nc = await nats.connect(**nats_connect_options(bus(tls)), allow_reconnect=False)  # type: ignore[arg-type]
        try:
            sub = await nc.subscribe("tls.cmd")
            await round_trip(nc, 5)
            w = Worker(argv, tmp_path / "pub.log")
            w.start(ready=None)
            assert await asyncio.to_thread(w.wait, 30) == 0, w.log()
            return (await sub.next_msg(timeout=10)).data
        finally:
            await nc.close()

    assert asyncio.run(go()) == b"hello"


@pytest.mark.parametrize(
    "case", ["no CA: the server is not trusted", "no client certificate", "a stranger's certificate"]
)
def test_who_may_not_in_does_not_get_in(tls: Setup, case: str) -> None:
    if case.startswith("no CA"):
        settings = bus(tls, tlsca=str(tls.stranger.ca_path))
    elif case == "no client certificate":
        settings = bus(tls, tlscert="", tlskey="")
    else:
        cert, key = tls.stranger.issue("intruder", server=False)
        settings = bus(tls, tlscert=str(cert), tlskey=str(key))
    # TLS 1.3 may report a refused client certificate as the connection dropped right after the handshake
    with pytest.raises((ssl.SSLError, ConnectionError)):
        asyncio.run(asyncio.wait_for(_round_trip(settings), 20))


def test_a_command_over_tls_logs_no_asyncio_eof_warning(tls: Setup) -> None:
    """`hpcbus status` over TLS prints its report and no asyncio "returning true from eof_received() has no
    effect when using ssl" WARNING for each connection a server closes (nats-py's TLS upgrade: nats-io/nats.py
    #574): a harmless line that would otherwise stand in every admin's terminal and journal on a TLS site."""
    ca, (cert, key) = tls.pki.ca_path, tls.client
    argv = ["status", "--nats", tls.server.url, "--cluster", "fox", "--tls-ca", str(ca)]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--no-influx"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcbus.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert "server " in done.stdout and "up, JetStream" in done.stdout, (done.stdout, done.stderr)
    assert "eof_received" not in done.stderr, done.stderr
