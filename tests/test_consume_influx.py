"""`hpcbus consume influx` against a real nats-server and a real InfluxDB 1.6 (VictoriaMetrics for v2).

Every test runs the real worker process, with its own cluster name (so its own stream and durable).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from hpcbus.localservices import InfluxDB, NatsServer, VictoriaMetrics
from tests.consumer_helpers import Worker, count_points, raw_pub, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def cluster() -> str:
    return f"t{uuid.uuid4().hex[:8]}.example.org"  # dotted, like fox.educloud.no


@pytest.fixture
def db() -> str:
    return f"db_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def consumer(
    workers: list[Worker], tmp_path: Path, nats_url: str, url: str, cluster: str, *extra: str, name: str = "w"
) -> Worker:
    args = ["consume", "influx", "--nats", nats_url, "--cluster", cluster, "--influx-url", url, *extra]
    w = Worker(args, tmp_path / f"{name}.log")
    workers.append(w)
    return w.start()


async def js_publish(url: str, subject: str, payloads: list[bytes]) -> None:
    """JetStream publish with a unique Nats-Msg-Id per call (a repeated id would be dropped as a duplicate)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    call = uuid.uuid4().hex[:8]
    for i, payload in enumerate(payloads):
        await js.publish(subject, payload, headers={"Nats-Msg-Id": f"{subject}:{call}:{i}"})
    await nc.close()


def test_nats_pub_forms_are_stored_right(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
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
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    logged: list[str] = []

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)

        async def on_log(msg: nats.aio.msg.Msg) -> None:
            logged.append(msg.data.decode())

        await nc.subscribe(f"{cluster}.log.hpcbus", cb=on_log)
        payload = (
            b"good,hostname=n1,type=node value=1 1700000000\n"
            b"garbage here\n"
            b"good,hostname=n2,type=node value=2 1700000000\n"
            b'good,hostname=n3,type=node value="text" 1700000000\n'
        )
        await nc.jetstream().publish(f"{cluster}.metrics", payload)
        for _ in range(100):
            if len(logged) >= 2:
                break
            await asyncio.sleep(0.1)
        await nc.close()

    asyncio.run(scenario())
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
    w.start(ready="seq")
    assert w.wait(10) == 0
    (record,) = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    assert record["subject"] == f"{cluster}.metrics"
    assert [p["line"] for p in record["problems"]] == [2, 4]


def test_killed_consumer_loses_nothing(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    w = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
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
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, name="w2")
    wait_for(
        lambda: count_points(influxdb, db, "kill") == n_msgs * per_msg, 60, "every point after the restart"
    )


def test_influxdb_down_for_30s_loses_nothing(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    w = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    before = [b"outage,hostname=a,type=node value=1 1700000000\n"]
    asyncio.run(js_publish(nats_server.url, f"{cluster}.metrics", before))
    wait_for(lambda: count_points(influxdb, db, "outage") == 1, 15, "the first point")
    influxdb.stop()
    try:
        during = [f"outage,hostname=b{i},type=node value={i} 1700000000\n".encode() for i in range(100)]
        asyncio.run(js_publish(nats_server.url, f"{cluster}.metrics", during))
        time.sleep(30)
        assert w.proc is not None and w.proc.poll() is None, (
            "the worker must keep running while InfluxDB is down"
        )
    finally:
        influxdb.start()
    wait_for(lambda: count_points(influxdb, db, "outage") == 101, 60, "every point after InfluxDB came back")
    assert "InfluxDB write failed" in w.log()


def test_sigterm_finishes_the_batch_and_exits_cleanly(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    w = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    asyncio.run(
        js_publish(nats_server.url, f"{cluster}.metrics", [b"term,hostname=a,type=node value=1 1700000000\n"])
    )
    time.sleep(0.3)
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    assert "stopped cleanly" in w.log()
    assert count_points(influxdb, db, "term") == 1


def test_two_workers_share_one_durable(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    a = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, name="a")
    b = consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db, name="b")
    payloads = [f"shared,hostname=h{i},type=node value={i} 1700000000\n".encode() for i in range(400)]
    asyncio.run(js_publish(nats_server.url, f"{cluster}.metrics", payloads))
    wait_for(lambda: count_points(influxdb, db, "shared") == 400, 30, "all 400 points")
    for w in (a, b):
        w.signal(signal.SIGTERM)
        assert w.wait(15) == 0
    received = [int(w.log().split("received ")[-1].split(" messages")[0]) for w in (a, b)]
    assert sum(received) >= 400 and min(received) > 0, received  # both took a share (+ their own log/stats)


def test_process_lines_are_aggregated_per_job_by_default(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    lines = "".join(
        f"process_rss,cmd=python,hostname=n1,job=42,pid={pid},stype=process,stype-id=42/{pid},type=node,type-id=0,"
        f"user=alice value={rss}i 1700000000\n"
        for pid, rss in ((100, 1000), (101, 2000), (102, 500))
    )
    asyncio.run(js_publish(nats_server.url, f"{cluster}.metrics", [lines.encode()]))
    rows = wait_for(lambda: influxdb.points('SELECT * FROM "process_rss"', db), 15, "process_rss")
    assert len(rows) == 1
    assert rows[0]["value"] == 3500 and rows[0]["stype-id"] == "42" and rows[0]["stype"] == "job"
    assert "pid" not in rows[0] or rows[0]["pid"] is None


def test_v2_api_through_influxdb_client_into_victoriametrics(
    nats_server: NatsServer,
    victoriametrics: VictoriaMetrics,
    tmp_path: Path,
    cluster: str,
    workers: list[Worker],
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
    asyncio.run(js_publish(nats_server.url, f"{cluster}.metrics", [lines]))
    series = victoriametrics.wait_for_series(f'{{__name__="vmcheck_value",cluster="{cluster}"}}', timeout=20)
    assert series[0]["values"] == [7.5]
    assert series[0]["metric"]["hostname"] == "n1"


def test_partial_write_keeps_the_good_points_and_reports_the_conflict(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, db: str, workers: list[Worker]
) -> None:
    """Someone else created `legacy.value` as an integer; our float for it is refused, the rest is stored."""
    influxdb.create_db(db)
    influxdb.write("legacy,hostname=old,type=node,type-id=0 value=1i 1699999000", db)  # same shard
    consumer(workers, tmp_path, nats_server.url, influxdb.url, cluster, "--db", db)
    logged: list[str] = []

    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)

        async def on_log(msg: nats.aio.msg.Msg) -> None:
            logged.append(msg.data.decode())

        await nc.subscribe(f"{cluster}.log.hpcbus", cb=on_log)
        body = b"legacy,hostname=new,type=node value=2 1700000000\nfine,hostname=new,type=node value=3 1700000000\n"
        await nc.jetstream().publish(f"{cluster}.metrics", body)
        for _ in range(100):
            if logged:
                break
            await asyncio.sleep(0.1)
        await nc.close()

    asyncio.run(scenario())
    wait_for(lambda: count_points(influxdb, db, "fine") == 1, 15, "the good point")
    assert count_points(influxdb, db, "legacy") == 1  # only the old integer point
    assert any("partial write" in line and "field type conflict" in line for line in logged), logged
