"""Issue 30: sources speak the sinks' vocabulary. Every source publishes its counters as the workers do
(`hpcbus_<counter>` lines on `<cluster>.telemetry`, stype-id its name), the standard counters of
`hpcbus.counters` among them, and a producer's own add up: received = delivered + dropped + pending. Real
processes on a real nats-server; the counters read back from the telemetry stream."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import msgspec
import pytest

from hpcbus.counters import STANDARD
from hpcbus.outbox import OutboxCounters
from hpcbus.producers.gateway.answers import SourceCounters
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import parse_payload
from tests.consumer_helpers import Process, Worker, bus_messages, wait_for
from tests.services import NatsServer
from tests.test_gateway import auth_file, http, start_gateway
from tests.test_ocs_producer import COLON_FILE

pytestmark = pytest.mark.services


def reports(url: str, cluster: str, name: str) -> list[dict[str, float]]:
    """Each self-telemetry report of `name` on the cluster's telemetry subject, oldest first: counter ->
    value (the `hpcbus_` taken off)."""
    out: list[dict[str, float]] = []
    for msg in bus_messages(url, cluster, subjects.telemetry(cluster)):
        lines = parse_payload(msg.data or b"", now=int(time.time())).lines
        mine = {
            line.measurement.removeprefix("hpcbus_"): float(line.fields["value"])
            for line in lines
            if line.tags.get("stype-id") == name
        }
        if mine:
            out.append(mine)
    return out


def fields_of(struct: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct)}


def test_the_producers_report_the_standard_counters_and_they_add_up(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    simulate = Worker(
        ["simulate", *bus, "--nodes", "2", "--interval", "1", "--samples", "2", "--stats-seconds", "0.5"],
        tmp_path / "simulate.log",
    )
    workers.append(simulate)
    simulate.start(ready=None)
    assert simulate.wait(120) == 0, simulate.log()
    accounting = tmp_path / "accounting"
    accounting.write_bytes(COLON_FILE.read_bytes())
    state = str(tmp_path / "ocs.state")
    argv = [
        "produce",
        "ocs",
        *bus,
        "--accounting",
        str(accounting),
        "--state-file",
        state,
        "--interval",
        "0.1",
    ]
    ocs = Worker([*argv, "--stats-seconds", "0.5"], tmp_path / "ocs.log")
    workers.append(ocs)
    ocs.start(ready=None)
    wait_for(lambda: any(r["delivered"] > 0 for r in reports(nats_server.url, cluster, "ocs")), 60, ocs.log)
    assert ocs.terminate() == 0, ocs.log()

    for name in ("simulate", "ocs"):
        found = reports(nats_server.url, cluster, name)
        assert found, name
        last = found[-1]  # said at the end, after the outbox was flushed
        assert set(last) == fields_of(OutboxCounters) and set(STANDARD) <= set(last), (name, sorted(last))
        for report in found:
            assert report["received"] == report["delivered"] + report["dropped"] + report["pending"], report
        assert last["delivered"] > 0 and last["pending"] == 0 and last["dropped"] == 0, (name, last)


def test_the_gateway_reports_the_standard_counters(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    path = auth_file(tmp_path, {cluster: "s3cret"})
    _, url = start_gateway(
        workers, tmp_path, nats_server.url, "--auth-file", str(path), "--stats-seconds", "0.5"
    )
    headers = {"Authorization": "Basic " + base64.b64encode(f"{cluster}:s3cret".encode()).decode()}
    now = int(time.time())
    body = f"mem_used,hostname=n1,type=node value=1 {now}\nbroken line\n".encode()
    assert http(f"{url}/write?db=x&precision=s", body, headers=headers).status == 400  # a partial write
    name = "gateway-influx-v1"
    wait_for(
        lambda: any(r.get("received") == 2 for r in reports(nats_server.url, cluster, name)), 30, "report"
    )
    last = reports(nats_server.url, cluster, name)[-1]
    assert set(last) == fields_of(SourceCounters) and set(STANDARD) <= set(last), sorted(last)
    assert (last["received"], last["delivered"], last["rejected"]) == (2, 1, 1), last
