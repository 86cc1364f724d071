"""What every long-running hpcbus process promises, tested on the real processes: SIGTERM ends it within 5 s
in every state (connecting, NATS gone, InfluxDB refusing mid-batch, a backlog on disk) with exit 0, no
traceback and nothing acknowledged that was not delivered; trouble that stops the flow is said in the log;
and a message at the server's `max_payload` with a bad line is dead-lettered without stalling the stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.consumer_helpers import (
    Process,
    Worker,
    bus_messages,
    consumer_counts,
    count_points,
    js_publish,
    raw_pub,
    wait_for,
)
from tests.node_fixtures import tree
from tests.services import InfluxDB, NatsServer, SlurmCluster, free_port
from tests.test_ocs_producer import record

pytestmark = pytest.mark.services

STOP_LIMIT = 5.0
"""Seconds from SIGTERM to exit that every long-running command promises."""


def stop_within_limit(worker: Worker) -> str:
    """SIGTERM, then assert: exit 0 within `STOP_LIMIT`, no traceback, the runtime's last word. The log."""
    started = time.monotonic()
    rc = worker.terminate(timeout=STOP_LIMIT + 5)
    took = time.monotonic() - started
    text = worker.log()
    assert rc == 0, text
    assert took < STOP_LIMIT, f"took {took:.1f} s to stop:\n{text}"
    assert "Traceback" not in text, text
    assert "stopped" in text.splitlines()[-1] or "stopped cleanly" in text, text
    return text


def start(workers: list[Process], tmp_path: Path, name: str, args: list[str], **kw: object) -> Worker:
    w = Worker(args, tmp_path / f"{name}.log", **kw)  # type: ignore[arg-type]
    workers.append(w)
    return w.start(ready=None)


def commands(tmp_path: Path, nats_url: str, cluster: str, slurm: SlurmCluster | None) -> dict[str, list[str]]:
    """Each long-running command, pointed at `nats_url`, ready to run without more set-up."""
    bus = ["--nats", nats_url, "--cluster", cluster]
    accounting = tmp_path / "accounting.jsonl"
    accounting.write_text(record(1) + "\n")
    dead_influx = f"http://127.0.0.1:{free_port()}"
    return {
        "produce node": ["produce", "node", *bus, "--root", str(tree(tmp_path)), "--interval", "1"],
        "produce ocs": ["produce", "ocs", *bus, "--accounting", str(accounting), "--interval", "0.2"],
        "produce slurm": ["produce", "slurm", *bus, "--interval", "1", "--tz", "UTC"],
        "consume influx": ["consume", "influx", *bus, "--influx-url", dead_influx],
        "consume sonar": ["consume", "sonar", *bus, "--directory", str(tmp_path / "sonar")],
    }


COMMANDS = ["produce node", "produce ocs", "produce slurm", "consume influx", "consume sonar"]


def env_for(command: str, slurm: SlurmCluster | None) -> dict[str, str] | None:
    return slurm.env() if command == "produce slurm" and slurm is not None else None


@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_while_connecting_to_an_absent_nats(
    command: str, tmp_path: Path, workers: list[Process], cluster: str, slurm: SlurmCluster
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    argv = commands(tmp_path, url, cluster, slurm)[command]
    w = start(workers, tmp_path, "w", argv, env=env_for(command, slurm))
    w.wait_log("retrying", timeout=20)  # the connection trouble, said once
    text = stop_within_limit(w)
    assert text.count("Connection refused") <= 2, text  # once per cause, not once per second


@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_right_after_nats_went_away(
    command: str,
    tmp_path: Path,
    workers: list[Process],
    cluster: str,
    nats_factory: Callable[..., NatsServer],
    slurm: SlurmCluster,
) -> None:
    server = nats_factory()
    argv = commands(tmp_path, server.url, cluster, slurm)[command]
    w = start(workers, tmp_path, "w", argv, env=env_for(command, slurm))
    w.wait_log("nats: connected", timeout=20)
    if command.startswith("consume"):
        w.wait_log("consuming", timeout=20)
    server.stop()
    w.wait_log("disconnected", timeout=20)
    stop_within_limit(w)


def test_sigterm_while_influxdb_refuses_a_batch_keeps_it_unacked(
    tmp_path: Path, workers: list[Process], cluster: str, nats_server: NatsServer
) -> None:
    argv = commands(tmp_path, nats_server.url, cluster, None)["consume influx"]
    w = start(workers, tmp_path, "w", argv)
    w.wait_log("consuming")
    js_publish(nats_server.url, [(f"{cluster}.metrics", b"m,hostname=n1,type=node value=1 1700000000\n")])
    w.wait_log("InfluxDB write failed")
    stop_within_limit(w)
    _, ack_pending = consumer_counts(nats_server.url, cluster, "hpcbus-influx")
    assert ack_pending == 1  # handed out, never acknowledged: it comes again


def test_sigterm_with_a_backlog_keeps_it_on_disk(
    tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    spill = tmp_path / "spill"
    argv = commands(tmp_path, url, cluster, None)["produce node"] + ["--spill-dir", str(spill)]
    w = start(workers, tmp_path, "w", argv)
    wait_for(lambda: len(list(spill.glob("*.msg"))) >= 4, 20, lambda: f"samples spilled:\n{w.log()}")
    text = stop_within_limit(w)
    assert f"kept in {spill}" in text
    assert len(list(spill.glob("*.msg"))) >= 4


def test_a_stream_that_is_unavailable_is_said_once_and_its_end_too(
    tmp_path: Path, workers: list[Process], cluster: str, nats_factory: Callable[..., NatsServer]
) -> None:
    """A worker whose durable cannot be bound (JetStream down on its server) says so at WARNING, not at
    DEBUG, and says when it works again."""
    server = nats_factory()
    argv = commands(tmp_path, server.url, cluster, None)["consume sonar"]
    w = start(workers, tmp_path, "w", argv)
    w.wait_log("consuming")
    server.stop()
    w.wait_log("disconnected")
    server.start()
    w.wait_log("working again", timeout=30)
    text = stop_within_limit(w)
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert warnings and len(warnings) < 20, text


def test_a_message_at_max_payload_with_a_bad_line_is_dead_lettered_and_the_next_one_stored(
    tmp_path: Path, workers: list[Process], cluster: str, nats_server: NatsServer, influxdb: InfluxDB
) -> None:
    """The dead letter carries headers on top of the original; at `max_payload` it must be cut into parts
    that fit (sending it whole makes the server close the connection, and the worker stalled for good)."""
    db = f"db_{cluster.split('.')[0]}"
    argv = ["consume", "influx", "--nats", nats_server.url, "--cluster", cluster]
    w = start(workers, tmp_path, "w", [*argv, "--influx-url", influxdb.url, "--db", db])
    w.wait_log("consuming")
    now = int(time.time())
    bad = b"this line has no fields\n"
    limit = 1024 * 1024  # nats-server's default max_payload
    lines: list[bytes] = []
    size = len(bad)
    i = 0
    while True:
        line = b"big_%d,hostname=n1,type=node value=%d %d\n" % (i % 50, i, now)
        if size + len(line) > limit:
            break
        lines.append(line)
        size += len(line)
        i += 1
    pad = limit - size  # make it exactly max_payload: a longer measurement name on the first line
    lines[0] = lines[0].replace(b"big_0,", b"big_0" + b"x" * pad + b",", 1)
    payload = b"".join(lines) + bad
    assert len(payload) == limit
    raw_pub(nats_server.port, f"{cluster}.metrics", payload)  # as `nats pub` sends it: no headers
    raw_pub(nats_server.port, f"{cluster}.metrics", b"next,hostname=n1,type=node value=7 %d\n" % now)
    wait_for(lambda: count_points(influxdb, db, "next") == 1, 30, lambda: f"the next message:\n{w.log()}")
    wait_for(lambda: consumer_counts(nats_server.url, cluster, "hpcbus-influx") == (0, 0), 30, w.log)
    parts = bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ")
    assert len(parts) >= 2 and all(len(p.data or b"") < limit for p in parts)
    assert b"".join(p.data or b"" for p in parts) == payload
    assert {(p.headers or {}).get("Hpcbus-Subject") for p in parts} == {f"{cluster}.metrics"}
    listing = Worker(["deadletter", "list", "--json", *argv[2:]], tmp_path / "list.log").start(ready=None)
    assert listing.wait(20) == 0
    (entry,) = [json.loads(line) for line in listing.log().splitlines() if line.startswith("{")]
    assert entry["bytes"] == limit and len(entry["parts"]) == len(parts)
    assert "nats: the connection was closed" not in w.log()
    stop_within_limit(w)
