"""InfluxDB's `max-values-per-tag` against the per-job schema (issue 31, items 2 and 5), on real services.

- A real InfluxDB 1.6 with the in-memory index and `max-values-per-tag` 50 (Debian's default is 100,000,
  the same check): `consume influx`'s sink writes one job's `job_processes` point per message. At 41 jobs
  `hpcbus status --influx --max-values-per-tag 50 --json` warns (82 %, exit unchanged by it); every job past
  the limit is dead-lettered with InfluxDB's own reason, counted, and the points behind them (a node metric,
  a known job) are written; status then calls the limit a problem.
- `hpcbus deploy influxdb`'s output, loaded into a real influxd, lets the per-job data pass 100 values per
  tag (150 jobs in three writes, each job queried back), where an influxd limited to 100 refuses the third.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import nats
import pytest

from hpcbus.bus import deadletter_stream, ensure_stream, telemetry_stream
from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import make_writer
from hpcbus.local.daemon import ServiceError
from hpcbus.retry import Stopping
from hpcbus.runner import Runner, RunnerSettings
from hpcbus.schemas import subjects
from tests.consumer_helpers import ROOT, stream_messages, wait_for_async
from tests.services import InfluxDB, NatsServer

pytestmark = pytest.mark.services

T = 1_700_000_000
LIMIT = 50


def job_line(job: int, at: int = T) -> bytes:
    """A job's process count on node n1, as the node agent sends it (the job id a tag: `job`, `stype-id`)."""
    return f"job_processes,hostname=n1,job={job},stype=job,stype-id={job},type=node value=1i {at}\n".encode()


def status_json(nats_url: str, cluster: str, influx: InfluxDB, db: str) -> tuple[int, dict[str, Any]]:
    p = subprocess.run(
        [
            *(sys.executable, "-m", "hpcbus", "status", "--nats", nats_url, "--cluster", cluster, "--json"),
            *("--influx", "--influx-url", influx.url, "--db", db, "--max-values-per-tag", str(LIMIT)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def distinct_jobs(influx: InfluxDB, db: str) -> int:
    rows = influx.points('SHOW TAG VALUES EXACT CARDINALITY FROM "job_processes" WITH KEY = "job"', db)
    return int(rows[0]["count"]) if rows else 0


async def test_jobs_past_max_values_per_tag_are_dead_lettered_and_status_warns_before(
    nats_server: NatsServer, tmp_path: Path, cluster: str
) -> None:
    db = "limited"
    with InfluxDB(tmp_path / "influxdb", data={"max-values-per-tag": LIMIT}) as influx:
        influx.start()
        influx.create_db(db)
        settings = InfluxSettings(url=influx.url, db=db, max_retry_wait=0.05)
        writer = make_writer(settings)
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        stream = telemetry_stream(cluster)
        await ensure_stream(js, stream)
        await ensure_stream(js, deadletter_stream(cluster))
        metrics = subjects.metrics(cluster)
        sink = InfluxSink(nc, writer, settings, cluster, "influx")
        # one message per batch, one batch at a time: InfluxDB checks the limit against what it holds before
        # a write, so a large batch may carry a measurement past the limit at once, and so may two writes in
        # flight together (measured: 51 stored with 3 in flight)
        delivery = RunnerSettings(
            durable="influx", flush_lines=1, flush_seconds=0.05, in_flight=1, stats_seconds=3600.0
        )
        stopping = Stopping(2.0)
        runner = Runner(nc, delivery, stream.name, [metrics], sink, stopping)
        task = asyncio.create_task(runner.run())
        try:
            for job in range(41):
                await js.publish(metrics, job_line(job))
            await wait_for_async(lambda: sink.counters.delivered >= 41, 60, lambda: f"{sink.counters}")
            assert distinct_jobs(influx, db) == 41
            code, report = await asyncio.to_thread(status_json, nats_server.url, cluster, influx, db)
            # `job` and `stype-id` both carry the job id: both are warned about
            warned = [w for w in report["warnings"] if "job_processes" in w["where"]]
            assert sorted(w["what"].split()[1] for w in warned) == ["job", "stype-id"], warned
            warned = [w for w in warned if w["what"].startswith("tag job ")]
            assert (
                len(warned) == 1
                and "tag job holds 41 distinct values of max-values-per-tag 50" in (warned[0]["what"])
            ), report["warnings"]
            assert not any("max-values-per-tag" in p["what"] for p in report["problems"]), report["problems"]
            assert code == 0  # a warning leaves the exit code as it is

            for job in range(41, 70):
                await js.publish(metrics, job_line(job))
            later = b"cpu_load,hostname=n1,type=node value=0.5 %d\n" % (T + 60) + job_line(7, T + 60)
            await js.publish(metrics, later)
            await wait_for_async(
                lambda: sink.counters.delivered + sink.counters.deadlettered >= 71,
                60,
                lambda: f"{sink.counters}",
            )
        finally:
            stopping.set()
            await task
            await nc.close()
            await writer.close()
        c = sink.counters
        stored = distinct_jobs(influx, db)
        assert stored == LIMIT  # InfluxDB stored jobs up to its limit, refused every later one
        assert (c.deadlettered, c.undeliverable_messages, c.delivered) == (
            70 - LIMIT,
            70 - LIMIT,
            LIMIT + 1,
        ), c
        dead = await stream_messages(nats_server.url, deadletter_stream(cluster).name)
        assert len(dead) == 70 - LIMIT
        for msg in dead:
            (problem,) = json.loads((msg.headers or {})["Hpcbus-Problems"])
            assert "max-values-per-tag limit exceeded" in problem["reason"], problem
            assert 'tag=\\"job\\"' in problem["reason"] or 'tag="job"' in problem["reason"], problem
        refused = {int(m.data.split(b"job=")[1].split(b",")[0]) for m in dead}
        assert len(refused) == 70 - LIMIT and refused <= set(range(41, 70)), (
            refused
        )  # batches run 3 at a time
        shown = influx.points('SHOW TAG VALUES FROM "job_processes" WITH KEY = "job"', db)
        assert {int(r["value"]) for r in shown} == set(
            range(70)
        ) - refused  # each job stored or dead-lettered
        # what followed the refused jobs flowed: the node metric and the known job's later point
        assert influx.points(f'SELECT "value" FROM "cpu_load" WHERE time = {T + 60}s', db)
        assert influx.points(
            f'SELECT "value" FROM "job_processes" WHERE "job" = \'7\' AND time = {T + 60}s', db
        )
        code, report = await asyncio.to_thread(status_json, nats_server.url, cluster, influx, db)
        assert code == 1
        at_limit = [p for p in report["problems"] if p["what"].startswith("tag job ")]
        assert (
            len(at_limit) == 1 and "holds 50 distinct values of max-values-per-tag 50" in at_limit[0]["what"]
        )
        assert report["clusters"][0]["deadletters"]["count"] == 70 - LIMIT


def test_deploy_influxdb_settings_let_per_job_data_pass_100_values_per_tag(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hpcbus", "deploy", "influxdb"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    data = tomllib.loads(out)["data"]
    assert data["index-version"] == "tsi1" and data["max-values-per-tag"] == 0
    batches = [b"".join(job_line(job, T + job) for job in range(start, start + 50)) for start in (0, 50, 100)]
    with InfluxDB(tmp_path / "deployed", data=data) as influx:
        influx.start()
        influx.create_db("year")
        for body in batches:
            influx.write(body.decode(), "year")  # raises unless InfluxDB answers 204
        assert distinct_jobs(influx, "year") == 150
        for job in (0, 99, 100, 149):
            rows = influx.points(f'SELECT "value" FROM "job_processes" WHERE "job" = \'{job}\'', "year")
            assert [r["value"] for r in rows] == [1], job
        assert list((tmp_path / "deployed" / "data" / "year").glob("*/*/index"))  # tsi1's index on disk
    with InfluxDB(tmp_path / "limited", data={"max-values-per-tag": 100}) as limited:  # the default's check
        limited.start()
        limited.create_db("year")
        limited.write(batches[0].decode(), "year")
        limited.write(batches[1].decode(), "year")
        with pytest.raises(ServiceError, match="max-values-per-tag limit exceeded"):
            limited.write(batches[2].decode(), "year")
