"""Two InfluxDBs behind one bus (issue 34): two `consume influx` worker groups, each with its own durable and
its own InfluxDB, each write a full copy, against a real nats-server and two real influxd.

With `stream_discard = "new"` (`interest` retention) the stream keeps a message only for the durables that
exist when it is stored, so the group that starts second would never have what came before its first start:
`[delivery] peers` makes whichever group starts first create the other's durable too. The stream then holds
every message until both durables have it; `hpcbus status` lists both durables with their own pending counts
and names the one whose group is away. The fault suite (tests/faults/, "two InfluxDBs") takes one of the two
InfluxDBs down while producers publish.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest

from hpcbus.streams import stream_name
from tests.consumer_helpers import Process, Worker, count_points, js_publish, wait_for
from tests.services import InfluxDB, NatsServer

pytestmark = pytest.mark.services

A, B = "hpcbus-influx", "hpcbus-influx-b"
N = 200
"""Messages published while only group A runs, one distinct point each."""


def group(
    workers: list[Process],
    tmp_path: Path,
    nats_url: str,
    cluster: str,
    influx: InfluxDB,
    db: str,
    durable: str,
    peer: str,
    *extra: str,
) -> Worker:
    """One worker of the group reading durable `durable` into `influx`, naming the other group's durable."""
    args = ["consume", "influx", "--nats", nats_url, "--cluster", cluster, "--influx-url", influx.url]
    args += ["--db", db, "--durable", durable, "--peers", peer, "--stream-discard", "new", *extra]
    w = Worker(args, tmp_path / f"{durable}-{len(workers)}.log")
    workers.append(w)
    return w.start(timeout=60)


def consumers(url: str, stream: str) -> dict[str, tuple[int, int, float]]:
    """durable -> (pending, ack pending, ack_wait) of every consumer on `stream`."""

    async def ask() -> dict[str, tuple[int, int, float]]:
        nc = await nats.connect(url)
        try:
            infos = await nc.jetstream().consumers_info(stream)
            return {
                str(i.name): (
                    int(i.num_pending or 0),
                    int(i.num_ack_pending or 0),
                    float(i.config.ack_wait or 0),
                )
                for i in infos
            }
        finally:
            await nc.close()

    return asyncio.run(ask())


def metrics_held(url: str, stream: str, subject: str) -> int:
    """Messages of `subject` the stream holds now."""

    async def ask() -> int:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    return asyncio.run(ask())


def status(url: str, cluster: str) -> dict[str, object]:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcbus",
            "status",
            "--nats",
            url,
            "--cluster",
            cluster,
            "--json",
            "--no-influx",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report: dict[str, object] = json.loads(run.stdout)
    return report


def job_event(function: str, now: int) -> bytes:
    """A batch job's start or stop event, as `produce slurm` publishes them (cc-backend's shape)."""
    if function == "start_job":
        body = {
            "jobId": 4242,
            "user": "alice",
            "numNodes": 1,
            "resources": [{"hostname": "h1"}],
            "startTime": now,
        }
    else:
        body = {"jobId": 4242, "stopTime": now + 60, "jobState": "completed"}
    event = json.dumps(body, separators=(",", ":")).replace('"', '\\"')
    return f'job,hostname=master,type=node,type-id=0,function={function} event="{event}" {now}\n'.encode()


def job_report(cluster: str, influx: InfluxDB, db: str) -> dict[str, object]:
    """`hpcbus report --format json` of job 4242, read from `influx`."""
    argv = [
        sys.executable,
        "-m",
        "hpcbus",
        "report",
        "--job",
        "4242",
        "--cluster",
        cluster,
        "--format",
        "json",
    ]
    run = subprocess.run(
        [*argv, "--influx-url", influx.url, "--db", db], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    answer: dict[str, object] = json.loads(run.stdout)
    return answer


def test_two_groups_each_write_a_full_copy_and_the_stream_keeps_messages_until_both_have_them(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    db = f"two_{uuid.uuid4().hex[:8]}"
    stream = stream_name("HPCBUS", cluster)
    subject = f"{cluster}.metrics"
    with InfluxDB(tmp_path / "influxdb-b") as influx_b:
        # Group A starts alone, on a new cluster: it creates its durable and B's.
        first_a = group(workers, tmp_path, nats_server.url, cluster, influxdb, db, A, B)
        assert set(consumers(nats_server.url, stream)) == {A, B}
        assert f"created durable {B} on {stream}" in first_a.log()
        now = 1_700_000_000
        js_publish(
            nats_server.url,
            [(subject, f"twodb,hostname=h{i},type=node value={i} {now}\n".encode()) for i in range(N)]
            + [(f"{cluster}.events.job", job_event(fn, now)) for fn in ("start_job", "stop_job")],
        )
        wait_for(lambda: count_points(influxdb, db, "twodb") == N, 60, f"{N} points in InfluxDB A")
        # A acknowledged all of them; the stream keeps each for B, whose group has not run yet.
        wait_for(lambda: consumers(nats_server.url, stream)[A][:2] == (0, 0), 60, "durable A settled")
        assert metrics_held(nats_server.url, stream, subject) == N
        assert consumers(nats_server.url, stream)[B][0] >= N  # + A's own telemetry on <cluster>.telemetry

        # `hpcbus status`: both durables, each with its own pending count; B's is the stalled one.
        report = status(nats_server.url, cluster)
        (c,) = report["clusters"]  # type: ignore[attr-defined]
        pending = {d["name"]: d["pending"] for d in c["durables"]}
        assert set(pending) == {A, B} and pending[A] == 0 and pending[B] >= N, pending
        where = [p["where"] for p in report["problems"]]  # type: ignore[attr-defined]
        assert any(B in w for w in where) and not any(f"durable {A} " in w for w in where), report["problems"]

        # Group B starts (its own ack_wait): it writes the same N points into its own InfluxDB, and once
        # both durables have acknowledged them the stream lets them go.
        group(workers, tmp_path, nats_server.url, cluster, influx_b, db, B, A, "--ack-wait", "7")
        wait_for(lambda: count_points(influx_b, db, "twodb") == N, 60, f"{N} points in InfluxDB B")
        wait_for(lambda: metrics_held(nats_server.url, stream, subject) == 0, 60, "the stream emptied")
        rows_a = influxdb.points('SELECT "value" FROM "twodb"', db)
        rows_b = influx_b.points('SELECT "value" FROM "twodb"', db)
        assert sorted(r["value"] for r in rows_a) == sorted(r["value"] for r in rows_b) == list(range(N))

        # `hpcbus report` reads whichever InfluxDB its `[influx] url` names: the same job from either copy.
        reports = [job_report(cluster, influx, db) for influx in (influxdb, influx_b)]
        assert reports[0] == reports[1] and reports[0]["job"] == "4242", reports

        # A group that starts again leaves the other's durable as that group set it.
        assert consumers(nats_server.url, stream)[B][2] == 7.0
        assert first_a.terminate() == 0
        group(workers, tmp_path, nats_server.url, cluster, influxdb, db, A, B)
        assert consumers(nats_server.url, stream)[B][2] == 7.0
        for w in workers:
            assert "Traceback" not in w.log(), w.log()


def test_a_peer_name_nats_would_not_take_is_refused_at_start() -> None:
    """A peer's name goes into a JetStream API subject: one with a `.` (or `*`, `>`, a space) would name
    another subject, and nats-py refuses it with a ValueError that the bind retried for ever, so the group
    never consumed. The settings refuse it before anything starts, naming the setting."""
    import subprocess
    import sys

    check = [sys.executable, "-m", "hpcbus", "--check-config", "consume", "influx", "--cluster", "x.example"]
    for bad in ("hpcbus-influx.b", "b c", "b>"):
        p = subprocess.run(
            [*check, "--peers", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and "peers" in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)
    ok = subprocess.run(
        [*check, "--peers", "hpcbus-influx-b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr


def test_both_copies_hold_the_summaries_of_consume_jobs_and_report_reads_either(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    """Issue 34: `consume jobs` writes its `job_summary` points into its own InfluxDB (A) and publishes each
    summary on `<cluster>.events.jobsummary`; `consume influx` writes the point of each such event, so copy B
    holds the same points (compared field by field, timestamp in ns) and copy A holds each once (the jobs
    worker's point and the one derived from its event are the same point). `hpcbus report` on B then takes
    the job's numbers from the summary (`from_summary`), as on A, and the two reports are equal."""
    from tests.test_consume_jobs import jobs_worker, proc_lines

    db = f"sum_{uuid.uuid4().hex[:8]}"
    with InfluxDB(tmp_path / "influxdb-b") as influx_b:
        group(workers, tmp_path, nats_server.url, cluster, influxdb, db, A, B)
        group(workers, tmp_path, nats_server.url, cluster, influx_b, db, B, A)
        jobs = jobs_worker(workers, tmp_path, nats_server, influxdb, cluster, db, "--stream-discard", "new")
        now = int(time.time()) - 600
        messages = [(f"{cluster}.events.job", job_event("start_job", now))]
        for i in range(10):
            lines = proc_lines(cluster, "h1", "4242", now + 6 * i, 100, cpu_time=3 * i, rss=1024 * (i + 1))
            messages.append((f"{cluster}.metrics", ("\n".join(lines) + "\n").encode()))
        messages.append((f"{cluster}.events.job", job_event("stop_job", now)))
        js_publish(nats_server.url, messages)

        query = f'SELECT * FROM "job_summary" WHERE "cluster" = \'{cluster}\''

        def rows(influx: InfluxDB) -> list[dict[str, object]]:
            return influx.points(query, db, epoch="ns")

        (in_b,) = wait_for(lambda: rows(influx_b), 90, "the job_summary point in InfluxDB B")
        (in_a,) = rows(influxdb)
        assert in_a == in_b and in_b["job"] == "4242" and in_b["time"] == (now + 60) * 10**9, (in_a, in_b)
        assert in_b["samples"] == 10 and in_b["user"] == "alice" and in_b["state"] == "completed"
        events = [
            influx.points('SELECT count("event") FROM "jobsummary"', db) for influx in (influxdb, influx_b)
        ]
        assert events[0] == events[1] and events[0][0]["count"] == 1, events

        reports = [job_report(cluster, influx, db) for influx in (influxdb, influx_b)]
        assert reports[1]["from_summary"] is True, reports[1]
        assert reports[0] == reports[1]
        assert jobs.terminate() == 0
        for w in workers:
            assert "Traceback" not in w.log(), w.log()
