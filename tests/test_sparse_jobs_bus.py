"""Issue 10, point 2 on the real bus: a Sonar jobs envelope whose records carry only the fields the spec makes
mandatory (and a mixture) goes through the real `consume sonar --to lp` and `consume influx` workers like any
other: translated to `<cluster>.events.slurm`, stored in InfluxDB, nothing dead-lettered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.consumer_helpers import (
    Process,
    Worker,
    bus_messages,
    js_publish,
    settled,
    wait_for,
)
from tests.services import InfluxDB, NatsServer
from tests.test_sonar_jsonschema import FOUR, MIXED, minimal_jobs

pytestmark = pytest.mark.services


def test_sparse_slurm_records_are_translated_and_stored_as_two_points(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    db = f"db_{cluster.split('.')[0]}"
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    sonar = Worker(["consume", "sonar", "--to", "lp", *bus], tmp_path / "sonar.log")
    influx = Worker(["consume", "influx", *bus, "--influx-url", influxdb.url, "--db", db], tmp_path / "i.log")
    workers += [sonar, influx]
    sonar.start()
    influx.start()
    envelopes = [minimal_jobs(FOUR), minimal_jobs(MIXED)]
    for env in envelopes:
        env["data"]["attributes"]["cluster"] = cluster
    js_publish(nats_server.url, [(f"{cluster}.sonar.job", json.dumps(env).encode()) for env in envelopes])

    def translated() -> list[str]:
        return [
            (m.data or b"").decode()
            for m in bus_messages(nats_server.url, cluster)
            if m.subject == f"{cluster}.events.slurm"
        ]

    lines = wait_for(lambda: len(translated()) >= 2 and translated(), 30, sonar.log)
    assert all(line.startswith("slurm,") for text in lines for line in text.splitlines())

    def stored() -> int:
        rows = influxdb.points('SELECT count("event") FROM "slurm"', db)
        return int(rows[0]["count"]) if rows else 0

    wait_for(lambda: stored() >= 2, 30, influx.log)  # two envelopes of one second: two points
    wait_for(lambda: settled(nats_server.url, cluster, "hpcbus-sonar-to-lp", "hpcbus-influx"), 30, sonar.log)
    assert bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ") == []  # nothing refused
    assert sonar.terminate() == 0
    assert re.search(r"skipped messages \d+, envelopes 2,", sonar.log()), sonar.log()
    assert "rejected 0, dead-lettered 0" in sonar.log()
