"""`hpcbus consume influx` against a real nats-server and InfluxDB 1.6: every log report is its own point, and a
line outside the time window is dead-lettered, never stored in 1970.

3,828 reports on `<cluster>.log.hpcbus` once became 853 points: reports of one second share tags and timestamp.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import nats
import pytest

from tests.consumer_helpers import Process, Worker, collect_while, count_points, js_publish, wait_for
from tests.services import InfluxDB, NatsServer

pytestmark = pytest.mark.services


def _consumer(
    workers: list[Process], tmp_path: Path, nats_url: str, url: str, cluster: str, db: str
) -> Worker:
    args = ["consume", "influx", "--nats", nats_url, "--cluster", cluster, "--influx-url", url, "--db", db]
    w = Worker(args, tmp_path / "w.log")
    workers.append(w)
    return w.start()


def _log_points(influxdb: InfluxDB, db: str) -> int:
    rows = influxdb.points('SELECT count("log") FROM "hpcbus"', db)
    return int(rows[0]["count"]) if rows else 0


def test_500_reports_in_one_second_are_500_points(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    db = f"db_{uuid.uuid4().hex[:8]}"
    _consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, db)
    second = int(time.time()) - 5
    subject = f"{cluster}.log.hpcbus"
    line = 'hpcbus,hostname=w1,loglevel=error log="{cluster}.metrics:{n}: lp: line: syntax" {t}\n'
    # 500 reports as the workers send them (one per message), and one message of 20 reports
    messages = [(subject, line.format(cluster=cluster, n=n, t=second).encode()) for n in range(500)]
    messages.append(
        (subject, "".join(line.format(cluster=cluster, n=1000 + n, t=second) for n in range(20)).encode())
    )
    js_publish(nats_server.url, messages)
    wait_for(lambda: _log_points(influxdb, db) == 520, 30, "520 log points")
    rows = influxdb.points('SELECT "log", "hostname", "loglevel", "cluster" FROM "hpcbus"', db, epoch="s")
    assert {row["time"] for row in rows} == {second}  # every point stays in its second
    assert len({row["log"] for row in rows}) == 520
    assert {(row["hostname"], row["loglevel"], row["cluster"]) for row in rows} == {("w1", "error", cluster)}
    # no tag was added: still one series
    series = influxdb.points('SHOW SERIES FROM "hpcbus"', db)
    assert len(series) == 1
    # metrics next to them keep their second precision
    js_publish(
        nats_server.url, [(f"{cluster}.metrics", f"m,hostname=n1,type=node value=1 {second}\n".encode())]
    )
    wait_for(lambda: count_points(influxdb, db, "m") == 1, 15, "the metric point")
    (row,) = influxdb.points('SELECT "value" FROM "m"', db, epoch="ns")
    assert row["time"] == second * 1_000_000_000


def test_far_future_and_1970_lines_are_dead_lettered_not_stored(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    db = f"db_{uuid.uuid4().hex[:8]}"
    _consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, db)
    now = int(time.time())
    payload = (
        f"good,hostname=n1,type=node value=1 {now}\n"
        "good,hostname=n2,type=node value=2 7258118400\n"
        "good,hostname=n3,type=node value=3 0\n"
        "good,hostname=n4,type=node value=4,value=5 " + str(now) + "\n"
    ).encode()

    async def publish(nc: nats.NATS) -> None:
        await nc.jetstream().publish(f"{cluster}.metrics", payload)

    logged = asyncio.run(
        collect_while(nats_server.url, f"{cluster}.log.hpcbus", publish, lambda got: len(got) >= 3)
    )
    wait_for(lambda: count_points(influxdb, db, "good") == 1, 15, "the good point")
    text = "\n".join(logged).replace("\\", "")
    assert f"{cluster}.metrics:2: lp metric: timestamp: timestamp 7258118400 read as ms" in text
    assert f"{cluster}.metrics:3: lp metric: timestamp: timestamp 0 read as s" in text
    assert f"{cluster}.metrics:4: lp metric: field value: field key value given twice" in text
    time.sleep(1)
    rows = influxdb.points('SELECT "value", "hostname" FROM "good"', db, epoch="s")
    assert [(row["hostname"], row["time"]) for row in rows] == [("n1", now)]
