"""Issue 23's "first hour, fixed": each rough edge a new user hit, reproduced as that user hits it (the real
`hpcbus` command in a subprocess, against the real nats-server and InfluxDB of tests/services)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hpcbus.commands.run import banner
from tests.consumer_helpers import ROOT, bus_messages, make_telemetry_stream
from tests.services import InfluxDB, NatsServer, free_port

pytestmark = pytest.mark.services

BARE_PATH = "/usr/bin:/bin"
"""PATH of a shell that has not activated the virtual environment (as after `make run`)."""


def hpcbus(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HPCBUS_CLUSTER", "NATS_URL")}
    return subprocess.run(
        [sys.executable, "-m", "hpcbus", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`command` as a person pastes it into a fresh shell (no venv on PATH)."""
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PATH": BARE_PATH, "HOME": str(cwd)},
        check=False,
    )


def make_stream(nats: NatsServer, cluster: str) -> None:
    make_telemetry_stream(nats.url, cluster)


def banner_commands(text: str, start: str) -> list[str]:
    """The shell commands of the banner that begin with `start` (continuation lines joined)."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip().startswith(start):
            command = line.strip()
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i].strip()
            out.append(command)
    return out


# 1, 2, 3: the banner's commands work as printed, and it says which users' jobs are left out.
def test_banner_commands_work_as_printed(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", BARE_PATH)  # the shell `make run` leaves: the venv not activated
    db = f"fh_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    influxdb.write(
        f'job_summary,cluster={cluster},job=42 user="alice",cpu_eff=50.0,mem_peak=1024i,flags="" '
        f"{int(time.time())}",
        db,
    )
    make_stream(nats_server, cluster)
    text = banner(nats_server.url, influxdb.url, db, cluster, tmp_path)
    assert "nats pub -s" not in text.split("Inject a line")[1].splitlines()[1]  # leads with what is installed
    # The job_summary query: `user` is an InfluxQL keyword, quoted.
    (query,) = [c for c in banner_commands(text, "curl") if "job_summary" in c]
    done = shell(query, tmp_path)
    answer = json.loads(done.stdout)
    assert "error" not in answer["results"][0], answer
    assert answer["results"][0]["series"][0]["values"][0][1] == "alice"
    # `hpcbus report` as printed, from a shell without the venv: it runs, and its no-data answer says why a
    # root job may have none.
    (report,) = [line.strip() for line in text.splitlines() if " report --job " in line]
    done = shell(report.replace("JOB", "987654"), tmp_path)
    assert done.returncode == 1 and "no data for job '987654'" in done.stderr, done.stderr
    assert "uid 1000" in done.stderr and "--min-uid 0" in done.stderr
    assert "uid 1000 (root's too) are not sampled" in text and "--min-uid 0" in text
    # `hpcbus pub` as printed: checked, stored, and it says where.
    (pub,) = [line.strip() for line in text.splitlines() if " pub -s " in line and "nats pub" not in line]
    done = shell(pub, tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"stored as HPCBUS_\S+ #1\b", done.stderr), done.stderr
    assert [m.data for m in bus_messages(nats_server.url, cluster)] == [
        b"cpu_load,hostname=test01,type=node value=42"
    ]


# 4: unreachable NATS ends with a clear message and exit code; bad URLs are refused before connecting.
def test_pub_checks_the_url_and_gives_up_on_unreachable_nats() -> None:
    line = "cpu_load,hostname=n1,type=node value=1"
    for url, reason in (
        ("nats://127.0.0.1:99999", "Port out of range"),
        ("http//bad", "expected nats://HOST[:PORT]"),
        ("http://127.0.0.1:4222", "scheme 'http' is not nats://"),
    ):
        done = hpcbus("pub", "-s", url, "fox.metrics", line)
        assert done.returncode == 2 and reason in done.stderr and url in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # Every command of the bus checks them so, not only pub.
    done = hpcbus("consume", "influx", "--nats", "nats://127.0.0.1:99999", "--cluster", "x")
    assert done.returncode == 2 and "Port out of range" in done.stderr and "Traceback" not in done.stderr
    started = time.monotonic()
    done = hpcbus(
        "pub", "-s", f"nats://127.0.0.1:{free_port()}", "--connect-timeout", "2", "fox.metrics", line
    )
    assert time.monotonic() - started < 20
    assert done.returncode == 1 and "not sent" in done.stderr and "not reachable" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# 5: a malformed line is refused unless --raw; what was stored is said.
def test_pub_validates_by_default_and_raw_sends_anyway(nats_server: NatsServer, cluster: str) -> None:
    make_stream(nats_server, cluster)
    bad = "cpu_load value=1"
    done = hpcbus("pub", "-s", nats_server.url, f"{cluster}.metrics", bad)
    assert (
        done.returncode == 1 and "a metric needs a hostname tag" in done.stderr and "not sent" in done.stderr
    )
    assert bus_messages(nats_server.url, cluster) == []
    done = hpcbus("pub", "-s", nats_server.url, "--raw", f"{cluster}.metrics", bad)
    assert done.returncode == 0 and re.search(r"stored as HPCBUS_\S+ #1\b", done.stderr), done.stderr
    # A subject no stream stores still goes out (like `nats pub`), and says so; --jetstream insists.
    done = hpcbus("pub", "-s", nats_server.url, "nobody.listens.here", "x")
    assert done.returncode == 0 and "no stream stores it" in done.stderr, done.stderr
    done = hpcbus("pub", "-s", nats_server.url, "--jetstream", "nobody.listens.here", "x")
    assert done.returncode == 1 and "no stream stores nobody.listens.here" in done.stderr


def test_pub_tells_no_stream_apart_from_could_not_ask(tmp_path: Path) -> None:
    """A server that cannot say which stream stores a subject (here: no JetStream at all; likewise an
    identity without `$JS.API` rights, or no answer in time) is not "no stream stores it": pub says that it
    could not ask, and with --jetstream does not send (was: "no stream stores it" either way)."""
    import socket

    from hpcbus.local.nats_server import nats_server_binary
    from tests.services import wait_until

    port = free_port()

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), 1):
            return True

    log = (tmp_path / "nats.log").open("w")
    server = subprocess.Popen(  # no -js: a core NATS server
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    try:
        wait_until("the core NATS server", listening, 20)
        url = f"nats://127.0.0.1:{port}"
        done = hpcbus("pub", "-s", url, "nobody.listens.here", "x")
        assert done.returncode == 0, done.stderr
        assert "core NATS only: the server could not say whether a stream stores it" in done.stderr, (
            done.stderr
        )
        assert "no JetStream answered" in done.stderr and "no stream stores it" not in done.stderr
        done = hpcbus("pub", "-s", url, "--jetstream", "nobody.listens.here", "x")
        assert (
            done.returncode == 1 and "not sent: could not ask the server which stream stores" in done.stderr
        )
        assert "Traceback" not in done.stderr
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def _process_group(influx: InfluxDB, db: str, cluster: str) -> str:
    """A process group's points as `consume influx` stores them (job_processes, CPU, RSS), 9 samples."""
    t0 = int(time.time()) - 300
    tags = f"cluster={cluster},hostname=n1,job=4242,epoch=99,user=alice"
    lines = []
    for i in range(9):
        t = t0 + 10 * i
        lines += [
            f"job_processes,{tags} value=1i {t}",
            f"process_cpu_util,{tags} value=90.0 {t}",
            f"process_rss,{tags} value=2700i {t}",
        ]
    influx.create_db(db)
    influx.write(lines, db)
    return "4242@99"


# 6, 7: `report --format html > r.html` fills r.html; --help shows no writer texts.
def test_report_html_goes_to_stdout_when_not_a_terminal(
    influxdb: InfluxDB, cluster: str, tmp_path: Path
) -> None:
    db = f"fh_{uuid.uuid4().hex[:8]}"
    job = _process_group(influxdb, db, cluster)
    done = hpcbus(
        "report", "--influx-url", influxdb.url, "--db", db, "--job", job, "--format", "html", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and "<svg" in done.stdout
    assert list(tmp_path.iterdir()) == []  # no job-N.html behind the user's back
    text = hpcbus("report", "--influx-url", influxdb.url, "--db", db, "--job", job).stdout
    assert "0.9 cores busy on average" in text, text
    out = tmp_path / "r.html"
    done = hpcbus(
        "report",
        "--influx-url",
        influxdb.url,
        "--db",
        db,
        "--job",
        job,
        "--format",
        "html",
        "--output",
        str(out),
    )
    assert done.returncode == 0 and out.read_text().startswith("<!DOCTYPE html>")
    helptext = hpcbus("report", "--help").stdout
    assert "created at start-up when missing" not in helptext and "Seconds per write request" not in helptext


# 8: `produce node --once` needs no cluster; and root's processes are one flag away (3).
def test_node_once_needs_no_cluster_and_min_uid_is_a_flag() -> None:
    done = hpcbus("produce", "node", "--once", "--settle", "0.2")
    assert done.returncode == 0, done.stderr
    assert "cluster=local" in done.stdout and "cpu_load," in done.stdout
    assert "job_processes," not in done.stdout  # this test runs as root: left out by default
    done = hpcbus("produce", "node", "--once", "--settle", "0.2", "--min-uid", "0")
    assert done.returncode == 0 and "job_processes," in done.stdout, done.stderr


# 9: a key in the wrong table says where it belongs.
def test_a_key_in_the_wrong_table_names_its_table(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\ninterval = 5\n")
    done = hpcbus("produce", "node", "--config", str(config), "--once")
    assert done.returncode == 2
    assert "[node] interval: `interval` belongs in [node_agent], not [node]" in done.stderr, done.stderr


# 10: a child of `hpcbus run` names itself in every log line; times are written as times.
def test_child_log_lines_name_the_process(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\ninterval = 5\n")
    env = {**os.environ, "HPCBUS_LOG_TAG": "node producer"}
    done = subprocess.run(
        [sys.executable, "-m", "hpcbus", "produce", "node", "--config", str(config), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert re.search(r"Z ERROR \[node producer\] hpcbus: ", done.stderr), done.stderr


def test_node_agent_stop_line_says_the_last_sample_time_in_utc() -> None:
    from hpcbus.schemas.lineprotocol.timestamps import utc_text

    assert utc_text(1764097200.7) == "2025-11-25T19:00:00Z"


# 11: both missing tags of a line in one run.
def test_validate_says_every_missing_tag_of_a_line(tmp_path: Path) -> None:
    path = tmp_path / "x.lp"
    path.write_text("cpu_load value=42 1700000000\n")
    done = hpcbus("validate", str(path))
    assert done.returncode == 1
    assert "hostname" in done.stdout and "type tag" in done.stdout, done.stdout
