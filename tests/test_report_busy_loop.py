"""One single-threaded busy loop, end to end, with CPU ticks and start times known exactly (issue 32 item 5):
the real node agent reads a fake /proc tree (a copy of a real node's, with the loop's `stat` written by the
test) every 10 s, its messages go through the real nats-server to the real `consume influx` and `consume
jobs`, and the real `hpcbus report` reads InfluxDB. A busy thread cannot keep more than one core busy: the
report says 0.9 to 1.0 cores in text, JSON and HTML, with and without the summary, and the summary's nodes
add up to it. (A real loop on the shared test machine gets what the machine gives it; this one gets 95 %.)

Before issue 32 the summary counted the 6 s the loop ran before its first sample but its elapsed time from
that sample: 34 s in 30 s, 1.13 cores busy, beside 38 s for the node from the series.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions, sonar_epoch
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from tests.consumer_helpers import Process, js_publish, settled, wait_for
from tests.node_fixtures import tree
from tests.pipeline_helpers import influx_sink, jobs_worker
from tests.services import InfluxDB, NatsServer
from tests.test_report_html import CHROMIUM

pytestmark = pytest.mark.services

BTIME = 1795305053
"""The fixture node's boot time (`btime` of its /proc/stat)."""
PID = 31337
TCK = 100
STEP = 10
LEAD = 6
"""Seconds the loop ran before the sample that first saw it."""
SHARE = 0.95
"""Of a core, what the loop gets."""


def write_loop(root: Path, now: float, start: float) -> None:
    """/proc/<PID> of the loop at `now`: started at `start`, `SHARE` of a core since, its own process group."""
    template = root / "proc" / "2030"
    target = root / "proc" / str(PID)
    if not target.exists():
        target.mkdir()
        for name in ("cgroup", "cmdline", "io", "statm"):
            (target / name).write_bytes((template / name).read_bytes())
        (target / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    tail = (template / "stat").read_text().rpartition(") ")[2]
    f = tail.split(" ")
    f[0] = "R"
    f[1], f[2], f[3] = "1", str(PID), str(PID)  # ppid, pgid, sid
    f[11], f[12], f[13], f[14] = str(round(SHARE * (now - start) * TCK)), "0", "0", "0"
    f[19] = str(round((start - BTIME) * TCK))
    (target / "stat").write_text(f"{PID} (busy) " + " ".join(f))


def messages(tmp_path: Path, cluster: str, t0: int) -> list[tuple[str, bytes]]:
    """What `produce node` publishes at t0 (no loop yet), t0+10 .. t0+40 (the loop, started 6 s before
    t0+10) and t0+50 (the loop gone)."""
    root = tree(tmp_path, "slurm-cgroup-v2")
    collector = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    pipeline = Pipeline(cluster, "c1-10", AgentConfig())
    start = t0 + STEP - LEAD
    out = []
    for i in range(6):
        now = t0 + STEP * i
        if 1 <= i <= 4:
            write_loop(root, now, start)
        elif i == 5:
            for f in (root / "proc" / str(PID)).iterdir():
                f.unlink()
            (root / "proc" / str(PID)).rmdir()
        sample = collector.collect(now=float(now))
        out += [
            (m.subject, m.payload) for m in pipeline.sample_messages(sample, 1 << 20, queued=0, dropped=0)
        ]
    return out


def report(influx: InfluxDB, db: str, job: str, *args: str) -> str:
    argv = [sys.executable, "-m", "hpcbus", "report", "--influx-url", influx.url, "--db", db, "--job", job]
    done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def cores_busy(text: str) -> float:
    found = re.findall(r"(\d+\.\d) cores busy on average", text)
    assert found, text[-3000:]
    return float(found[0])


def test_one_busy_thread_is_at_most_one_core_busy_everywhere(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str
) -> None:
    db = f"busy_{uuid.uuid4().hex[:8]}"
    summary_db = f"{db}_summary"
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    sinks = [
        influx_sink(bus, influxdb, db, tmp_path / "influx.log"),
        influx_sink(bus, influxdb, summary_db, tmp_path / "sum.log", "--durable", "hpcbus-influx-summary"),
    ]
    jobs = jobs_worker(bus, influxdb, summary_db, tmp_path, "--process-quiet", "2")
    for w in (*sinks, jobs):
        workers.append(w.start())
    t0 = int(time.time()) - 600
    js_publish(nats_server.url, messages(tmp_path, cluster, t0))
    job = f"{PID}@{sonar_epoch(BTIME)}"

    def summarised() -> bool:
        try:
            return bool(influxdb.points(f'SELECT * FROM "job_summary" WHERE "job" = \'{job}\'', summary_db))
        except Exception:  # no database or measurement yet
            return False

    wait_for(summarised, 60, lambda: jobs.log()[-3000:])
    durables = ("hpcbus-influx", "hpcbus-influx-summary")
    wait_for(functools.partial(settled, nats_server.url, cluster, *durables), 60, "the sinks settled")

    # The copy `consume jobs` does not write holds the same summary (`consume influx` derives it from the
    # `jobsummary` event); taken out here so that the report of `db` is worked out from the series.
    query = f'SELECT * FROM "job_summary" WHERE "job" = \'{job}\''
    wait_for(
        lambda: influxdb.points(query, db) == influxdb.points(query, summary_db), 60, "the summary in db"
    )
    influxdb.query('DROP MEASUREMENT "job_summary"', db)
    for name in (db, summary_db):
        data = json.loads(report(influxdb, name, job, "--format", "json"))
        assert data["from_summary"] is (name == summary_db)
        assert 0.9 <= data["cores_busy"] <= 1.0, (
            name,
            data["cores_busy"],
            data["cpu_seconds"],
            data["elapsed"],
        )
        # The node's CPU seconds are the job's (one node), whichever way they were worked out.
        assert [n["cpu_seconds"] for n in data["per_node"]] == [pytest.approx(data["cpu_seconds"])], name
        text = report(influxdb, name, job)
        (tmp_path / f"{name}.txt").write_text(text)  # (docs/report.md's example)
        assert 0.9 <= cores_busy(text) <= 1.0, text
        page = tmp_path / f"{name}.html"
        report(influxdb, name, job, "--format", "html", "--output", str(page))
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()]
        dom = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True).stdout
        assert 0.9 <= cores_busy(dom) <= 1.0, dom[-3000:]
    # `consume jobs`'s own summary agrees: 34 - 6 s (Sonar's whole seconds) in the 30 s from the first sample.
    row = influxdb.points(f'SELECT * FROM "job_summary" WHERE "job" = \'{job}\'', summary_db)[-1]
    assert (row["elapsed"], row["cpu_seconds"]) == (30.0, 28.0)
    assert 0.9 <= float(row["cpu_seconds"]) / float(row["elapsed"]) <= 1.0


def test_a_long_job_read_in_few_points_counts_what_each_measured(influxdb: InfluxDB, cluster: str) -> None:
    """Review of issue 32: with fewer points than samples, InfluxDB's bucket at t (`GROUP BY time(step,
    offset)`) holds the samples t .. t + step - 10, which measured (t - 10, t + step - 10]. A process group
    of 10,000 s sampled every 10 s, one core busy for its first 1000 s, read in 10 points (step 1000), read
    10 CPU seconds (the first bucket weighed nothing) and its plot lost the first CPU point. The points are
    what `consume influx` stores for the node agent's lines (docs/mapping.md)."""
    db = f"long_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    t0 = (int(time.time()) - 20_000) // 10 * 10
    tags = f"cluster={cluster},epoch=99,hostname=n1,job=5,user=alice"
    points = []
    for s in range(t0, t0 + 10_001, 10):
        points.append(f"job_processes,{tags},stype=job,stype-id=5@99,type=node,type-id=0 value=1i {s}")
        if s - 10 < t0 + 1000:  # busy in the 10 s before it (the first: its lifetime average)
            points.append(f"process_cpu_util,{tags},type=node,type-id=process value=100 {s}")
    influxdb.write(points, db)
    data = json.loads(report(influxdb, db, "5@99", "--max-points", "10", "--format", "json"))
    assert (data["step"], data["elapsed"]) == (1000, 10_000.0)
    assert data["cpu_seconds"] == pytest.approx(1000.0, abs=10), data["cpu_seconds"]
    cpu = next(t for t in data["series"] if t["metric"] == "cpu")
    assert cpu["times"][0] == t0 and cpu["values"][0] == pytest.approx(1.0)
