"""`hpcbus consume influx` against a real nats-server and a real InfluxDB 1.6 (VictoriaMetrics for v2).

Every test runs the real worker process, with its own cluster name (so its own stream and durable).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import uuid
from pathlib import Path

import nats
import pytest

from tests.consumer_helpers import (
    Process,
    Worker,
    collect_while,
    consumer_counts,
    count_points,
    js_publish,
    log_counter,
    raw_pub,
    unacked,
    wait_for,
)
from tests.services import InfluxDB, NatsServer, VictoriaMetrics

pytestmark = pytest.mark.services


@pytest.fixture
def db() -> str:
    return f"db_{uuid.uuid4().hex[:8]}"


def consumer(
    workers: list[Process],
    tmp_path: Path,
    nats_url: str,
    url: str,
    cluster: str,
    *extra: str,
    name: str = "w",
) -> Worker:
    args = ["consume", "influx", "--nats", nats_url, "--cluster", cluster, "--influx-url", url, *extra]
    w = Worker(args, tmp_path / f"{name}.log")
    workers.append(w)
    return w.start()


def test_nats_pub_forms_are_stored_right(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    subject = f"{cluster}.metrics"
    raw_pub(nats_server.port, subject, b"one_line,hostname=n1,type=node value=1 1700000000")
    raw_pub(
        nats_server.port,
        subject,
        b"many,hostname=n1,type=node value=1 1700000000\nmany,hostname=n2,type=node value=2 1700000000\n",
    )
    raw_pub(nats_server.port, subject, b"prec,hostname=s,type=node value=1 1700000001\n")  # seconds
    raw_pub(nats_server.port, subject, b"prec,hostname=ms,type=node value=2 1700000002000\n")  # ms
    raw_pub(
        nats_server.port, subject, b"prec,hostname=ns,type=node value=3 1700000003000000000\n"
    )  # ns (cc-lib)
    spec_event = (
        b'job,hostname=mngmt02,type=node,type-id=0,function=stop_job event={"jobId": 69, "cluster": "ccfront",'
        b' "stopTime": 1738842306, "jobState": "completed"} 1740027951\n'
    )
    raw_pub(nats_server.port, f"{cluster}.events.job", spec_event)
    wait_for(lambda: count_points(influxdb, db, "prec") == 3, 15, "3 prec points")
    wait_for(lambda: influxdb.points('SELECT * FROM "job"', db), 15, "the job event")
    assert count_points(influxdb, db, "one_line") == 1
    assert count_points(influxdb, db, "many") == 2
    rows = influxdb.points('SELECT "value", "hostname", "cluster" FROM "prec"', db, epoch="s")
    assert sorted((r["hostname"], r["time"], r["value"]) for r in rows) == [
        ("ms", 1700000002, 2.0),
        ("ns", 1700000003, 3.0),
        ("s", 1700000001, 1.0),
    ]
    assert {r["cluster"] for r in rows} == {cluster}  # from the subject
    (event,) = influxdb.points('SELECT "event", "function" FROM "job"', db, epoch="s")
    assert event["function"] == "stop_job" and event["time"] == 1740027951
    assert json.loads(event["event"])["jobId"] == 69


def test_bad_lines_go_to_the_log_subject_and_dead_letter_stream(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    payload = (
        b"good,hostname=n1,type=node value=1 1700000000\n"
        b"garbage here\n"
        b"good,hostname=n2,type=node value=2 1700000000\n"
        b'good,hostname=n3,type=node value="text" 1700000000\n'
    )

    async def publish(nc: nats.NATS) -> None:
        await nc.jetstream().publish(f"{cluster}.metrics", payload)

    logged = asyncio.run(
        collect_while(nats_server.url, f"{cluster}.log.hpcbus", publish, lambda got: len(got) >= 2)
    )
    wait_for(lambda: count_points(influxdb, db, "good") == 2, 15, "the two good points")
    assert len(logged) == 2
    assert f"{cluster}.metrics:2: lp: line: syntax" in logged[0] and "loglevel=error" in logged[0]
    assert f"{cluster}.metrics:4: lp metric: field value: a metric value must be a number" in logged[
        1
    ].replace("\\", "")
    # The log lines are themselves stored (measurement hpcbus), and the message is in the dead-letter stream.
    wait_for(lambda: influxdb.points('SELECT * FROM "hpcbus"', db), 15, "log lines in InfluxDB")
    out = tmp_path / "dlq.txt"
    w = Worker(["deadletter", "list", "--json", "--nats", nats_server.url, "--cluster", cluster], out)
    workers.append(w)
    w.start(ready="seq")
    assert w.wait(10) == 0
    (record,) = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    assert record["subject"] == f"{cluster}.metrics"
    assert [p["line"] for p in record["problems"]] == [2, 4]


def test_killed_consumer_loses_nothing(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    # JetStream redelivers the killed worker's unacked messages after ack_wait (30 s by default; 2 s here).
    config = tmp_path / "hpcbus.toml"
    config.write_text("[delivery]\nack_wait = 2.0\n")
    w = consumer(
        workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, "--config", str(config)
    )
    n_msgs, per_msg = 200, 50
    payloads = [
        "".join(
            f"kill,hostname=h{j},type=node value={i}i {1700000000 + i}\n" for j in range(per_msg)
        ).encode()
        for i in range(n_msgs)
    ]

    async def publish_while_killing() -> None:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        for i, payload in enumerate(payloads):
            await js.publish(f"{cluster}.metrics", payload, headers={"Nats-Msg-Id": f"kill:{i}"})
            if i == n_msgs // 2:
                w.signal(signal.SIGKILL)
        await nc.close()

    asyncio.run(publish_while_killing())
    w.wait(10)
    consumer(
        workers,
        tmp_path,
        nats_server.url,
        influxdb.url,
        cluster,
        "--db",
        db,
        "--config",
        str(config),
        name="w2",
    )
    wait_for(
        lambda: count_points(influxdb, db, "kill") == n_msgs * per_msg, 60, "every point after the restart"
    )


def test_influxdb_down_for_a_while_loses_nothing(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    """InfluxDB is down until the worker has retried the batch at least 3 times (its own counter, from the
    counter summary it logs every 0.2 s here), with nothing acknowledged meanwhile."""
    config = tmp_path / "hpcbus.toml"
    config.write_text("[delivery]\nstats_seconds = 0.2\n")
    w = consumer(
        workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, "--config", str(config)
    )
    before = [(f"{cluster}.metrics", b"outage,hostname=a,type=node value=1 1700000000\n")]
    js_publish(nats_server.url, before)
    wait_for(lambda: count_points(influxdb, db, "outage") == 1, 15, "the first point")
    influxdb.stop()
    try:
        during = [
            (f"{cluster}.metrics", f"outage,hostname=b{i},type=node value={i} 1700000000\n".encode())
            for i in range(100)
        ]
        js_publish(nats_server.url, during)
        wait_for(
            lambda: log_counter(w.log(), r"retried (\d+),") >= 3,
            30,
            lambda: f"3 retries while InfluxDB is down:\n{w.log()}",
        )
        assert w.running(), "the worker must keep running while InfluxDB is down"
        assert unacked(nats_server.url, cluster, "hpcbus-influx") >= 100  # nothing acked meanwhile
    finally:
        influxdb.start()
    wait_for(lambda: count_points(influxdb, db, "outage") == 101, 60, "every point after InfluxDB came back")
    assert "InfluxDB write failed" in w.log()


def test_sigterm_finishes_the_batch_and_exits_cleanly(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    w = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    js_publish(nats_server.url, [(f"{cluster}.metrics", b"term,hostname=a,type=node value=1 1700000000\n")])
    # SIGTERM once the worker has the message in hand (delivered to it, perhaps not yet written or acked).
    wait_for(
        lambda: consumer_counts(nats_server.url, cluster, "hpcbus-influx")[0] == 0,
        15,
        "the message delivered",
    )
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    assert "stopped cleanly" in w.log()
    assert count_points(influxdb, db, "term") == 1


def test_two_workers_share_one_durable(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    a = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, name="a")
    b = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, name="b")
    payloads = [f"shared,hostname=h{i},type=node value={i} 1700000000\n".encode() for i in range(400)]
    js_publish(nats_server.url, [(f"{cluster}.metrics", p) for p in payloads])
    wait_for(lambda: count_points(influxdb, db, "shared") == 400, 30, "all 400 points")
    for w in (a, b):
        w.signal(signal.SIGTERM)
        assert w.wait(15) == 0
    received = [int(re.findall(r": received (\d+),", w.log())[-1]) for w in (a, b)]
    assert sum(received) >= 400 and min(received) > 0, received  # both took a share (+ their own log/stats)


def test_process_lines_are_aggregated_per_job_by_default(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    lines = "".join(
        f"process_rss,cmd=python,hostname=n1,job=42,pid={pid},stype=process,stype-id=42/{pid},type=node,type-id=0,"
        f"user=alice value={rss}i 1700000000\n"
        for pid, rss in ((100, 1000), (101, 2000), (102, 500))
    )
    js_publish(nats_server.url, [(f"{cluster}.metrics", lines.encode())])
    rows = wait_for(lambda: influxdb.points('SELECT * FROM "process_rss"', db), 15, "process_rss")
    assert len(rows) == 1
    assert rows[0]["value"] == 3500 and rows[0]["stype-id"] == "42" and rows[0]["stype"] == "job"
    assert "pid" not in rows[0] or rows[0]["pid"] is None


def test_v2_api_through_influxdb_client_into_victoriametrics(
    nats_server: NatsServer,
    victoriametrics: VictoriaMetrics,
    tmp_path: Path,
    cluster: str,
    workers: list[Process],
) -> None:
    consumer(
        workers,
        tmp_path,
        nats_server.url,
        victoriametrics.url,
        cluster,
        "--influx-api",
        "v2",
        "--org",
        "hpc",
        "--bucket",
        "hpcbus",
        "--token",
        "secret",
    )
    lines = f"vmcheck,hostname=n1,type=node value=7.5 {int(time.time())}\n".encode()
    js_publish(nats_server.url, [(f"{cluster}.metrics", lines)])
    series = victoriametrics.wait_for_series(f'{{__name__="vmcheck_value",cluster="{cluster}"}}', timeout=20)
    assert series[0]["values"] == [7.5]
    assert series[0]["metric"]["hostname"] == "n1"


def test_partial_write_keeps_the_good_points_and_reports_the_conflict(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Process]
) -> None:
    """Someone else created `legacy.value` as an integer; our float for it is refused, the rest is stored."""
    influxdb.create_db(db)
    influxdb.write("legacy,hostname=old,type=node,type-id=0 value=1i 1699999000", db)  # same shard
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    body = (
        b"legacy,hostname=new,type=node value=2 1700000000\nfine,hostname=new,type=node value=3 1700000000\n"
    )

    async def publish(nc: nats.NATS) -> None:
        await nc.jetstream().publish(f"{cluster}.metrics", body)

    logged = asyncio.run(collect_while(nats_server.url, f"{cluster}.log.hpcbus", publish, bool))
    wait_for(lambda: count_points(influxdb, db, "fine") == 1, 15, "the good point")
    assert count_points(influxdb, db, "legacy") == 1  # only the old integer point
    assert any("partial write" in line and "field type conflict" in line for line in logged), logged
