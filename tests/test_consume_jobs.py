"""`hpcbus consume jobs` on a real nats-server and InfluxDB 1.6, fed with synthetic lines whose arithmetic is
known exactly: the summary event on `<cluster>.events.jobsummary`, the `job_summary` point, a message
stored twice counted once, a job whose stop never comes, the `max_jobs` bound, and bad input.

The real pipeline (node producer, Slurm, restart with kill -9) is in `test_consume_jobs_slurm.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus.schemas.ccbackend import Resource, StartJob, StopJob, job_event_line
from hpcbus.schemas.jobsummary import decode_state
from hpcbus.schemas.lineprotocol import format_line, format_lines
from hpcbus.schemas.nodejob import NodeJob, node_job_line
from tests.consumer_helpers import ROOT, Process, Worker, bus_messages, js_publish, settled, wait_for
from tests.services import InfluxDB, NatsServer

pytestmark = pytest.mark.services

MIB = 1024 * 1024


@pytest.fixture
def db() -> str:
    return f"db_{uuid.uuid4().hex[:8]}"


def jobs_worker(
    workers: list[Process],
    tmp_path: Path,
    nats: NatsServer,
    influx: InfluxDB,
    cluster: str,
    db: str,
    *extra: str,
) -> Worker:
    args = [
        "consume",
        "jobs",
        "--nats",
        nats.url,
        "--cluster",
        cluster,
        "--influx-url",
        influx.url,
        "--db",
        db,
        "--state-file",
        str(tmp_path / "jobs.state"),
        "--grace",
        "0",
        "--ack-wait",
        "2",
        "--window",
        "5",
        *extra,
    ]
    w = Worker(args, tmp_path / "jobs.log")
    workers.append(w)
    return w.start()


def summaries(nats: NatsServer, cluster: str) -> dict[str, dict[str, Any]]:
    """job key -> the JSON of its `jobsummary` event (the last one)."""
    out: dict[str, dict[str, Any]] = {}
    for msg in bus_messages(nats.url, cluster, f"{cluster}.events.jobsummary"):
        for text in (msg.data or b"").decode().splitlines():
            head, _, rest = text.partition(' event="')
            assert head.startswith(f"jobsummary,cluster={cluster},job=")
            body = rest.rsplit('" ', 1)[0].replace('\\"', '"').replace("\\\\", "\\")
            event = json.loads(body)
            out[event["job"]] = event
    return out


def proc_lines(cluster: str, host: str, job: str, t: int, pid: int, **values: float | int) -> list[str]:
    tags = f"cluster={cluster},hostname={host},job={job},pid={pid},ppid=1,stype=process,stype-id={job}/{pid}"
    out = [
        f"job_processes,cluster={cluster},hostname={host},job={job},stype=job,stype-id={job},type=node,type-id=0,user=alice value=1i {t}"
    ]
    for name, value in values.items():
        if name.startswith("gpu_"):
            card = "GPU-" + host
            metric = {"gpu_util": "process_acc_utilization", "gpu_mem": "process_acc_mem_used"}[name]
            gpu_tags = (
                f"cluster={cluster},hostname={host},job={job},pid={pid},stype=process,stype-id={job}/{pid}"
            )
            out.append(
                f"{metric},{gpu_tags},type=accelerator,type-id={card},user=alice value={float(value)} {t}"
            )
        elif name == "energy":
            out.append(
                f"nv_energy_abs,cluster={cluster},hostname={host},type=accelerator,type-id=GPU-{host} value={value}i {t}"
            )
        else:
            out.append(f"process_{name},{tags},type=node,type-id=0,user=alice value={int(value)}i {t}")
    return out


def test_summary_event_and_point_have_the_exact_arithmetic(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str, db: str
) -> None:
    """Two nodes, 4 cores, 10 samples 10 s apart: n1 burns 1 core and uses its GPU at 50 %, n2 idles with
    an idle GPU; each message is stored twice (different ids: JetStream keeps both) and counted once."""
    jobs_worker(workers, tmp_path, nats_server, influxdb, cluster, db)
    t0 = int(time.time()) - 600
    start = StartJob(
        job_id=4242,
        cluster=cluster,
        user="alice",
        project="proj",
        partition="gpu",
        resources=[Resource(hostname="n1"), Resource(hostname="n2")],
        num_nodes=2,
        num_hwthreads=4,
        num_acc=2,
        requested_memory=1024,  # MB (MiB): 1 GiB
        start_time=t0,
    )
    messages = [
        (f"{cluster}.events.job", (format_line(job_event_line(start, t0, cluster=cluster)) + "\n").encode())
    ]
    for i in range(10):
        t = t0 + 10 * i
        n1 = proc_lines(
            cluster,
            "n1",
            "4242",
            t,
            100,
            cpu_time=10 * i,
            rss=1024 * (i + 1),
            read=10 * i,
            written=5 * i,
            gpu_util=50,
            gpu_mem=100 * (i + 1),
            energy=1000 + 200 * i,
        )
        n2 = proc_lines(cluster, "n2", "4242", t, 200, cpu_time=1, rss=2048, gpu_util=0)
        messages.append((f"{cluster}.metrics", ("\n".join(n1 + n2) + "\n").encode()))
    stop = StopJob(job_id=4242, cluster=cluster, start_time=t0, stop_time=t0 + 100, job_state="completed")
    messages.append(
        (
            f"{cluster}.events.job",
            (format_line(job_event_line(stop, t0 + 100, cluster=cluster)) + "\n").encode(),
        )
    )
    js_publish(nats_server.url, messages + messages[1:-1])  # every sample twice, after the stop even

    event = wait_for(lambda: summaries(nats_server, cluster).get("4242"), 60, "the summary of job 4242")
    assert event["scheduler"] == "slurm" and event["user"] == "alice" and event["account"] == "proj"
    assert (event["state"], event["start"], event["end"], event["elapsed"]) == (
        "completed",
        t0,
        t0 + 100,
        100.0,
    )
    assert (event["nodes"], event["cores"], event["gpus"], event["samples"]) == (2, 4, 2, 20)
    # CPU: n1 counts 90 s (its first cpu_time 0 .. 90), n2 1 s: 91 s of 4 cores x 100 s
    assert event["cpu_seconds"] == 91.0 and event["cpu_eff"] == pytest.approx(22.75)
    # memory: peaks 10 MiB (n1) + 2 MiB (n2) of 1 GiB; Slurm's MaxRSS = the larger node's, AveRSS = total / 2
    assert event["mem_peak"] == 12 * MIB and event["mem_requested"] == 1024 * MIB
    assert event["mem_eff"] == pytest.approx(100 * 12 / 1024, abs=1e-3)
    assert (event["max_rss"], event["max_rss_node"], event["ave_rss"]) == (10 * MIB, "n1", 6 * MIB)
    assert event["mem_avg"] == pytest.approx(5.5 * MIB + 2 * MIB)
    # GPUs: n1's card at 50 %, n2's at 0 %: mean 25 %, and n2's card is idle
    assert event["gpu_util"] == 25.0 and event["gpu_mem_peak"] == 1000 * MIB
    per_gpu = {g["card"]: g for g in event["per_gpu"]}
    assert per_gpu["GPU-n1"]["util"] == 50.0 and per_gpu["GPU-n2"]["util"] == 0.0
    assert per_gpu["GPU-n1"]["energy"] == 1800.0 and event["energy"] == 1800.0
    assert (event["read_bytes"], event["write_bytes"]) == (90 * 1024, 45 * 1024)
    assert event["coverage"] == 100.0  # 10 samples x 10 s on each node of a 100 s job
    assert event["flags"] == ["idle_gpu", "mem_overrequested", "cpu_underused"]
    assert event["thresholds"] == {"idle_gpu": 5.0, "mem_overrequested": 25.0, "cpu_underused": 25.0}
    per_node = {n["hostname"]: n for n in event["per_node"]}
    assert per_node["n1"]["cpu_seconds"] == 90.0 and per_node["n2"]["samples"] == 10

    def point() -> list[dict[str, Any]]:
        return influxdb.points(
            f"SELECT * FROM job_summary WHERE job = '4242' AND \"cluster\" = '{cluster}'", db, epoch="ns"
        )

    (row,) = wait_for(point, 30, "the job_summary point")
    assert row["time"] == (t0 + 100) * 10**9
    assert (row["user"], row["account"], row["partition"], row["scheduler"]) == (
        "alice",
        "proj",
        "gpu",
        "slurm",
    )
    assert (row["cpu_eff"], row["samples"], row["cores"], row["mem_peak"]) == (22.75, 20, 4, 12 * MIB)
    assert row["flags"] == "idle_gpu,mem_overrequested,cpu_underused"
    assert (row["flag_idle_gpu"], row["flag_no_samples"], row["flag_stop_missing"]) == (True, False, False)
    assert row["state"] == "completed" and row["coverage"] == 100.0


def test_a_job_whose_stop_never_comes_is_closed_and_flagged(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str, db: str
) -> None:
    w = jobs_worker(workers, tmp_path, nats_server, influxdb, cluster, db, "--stop-timeout", "2")
    t0 = int(time.time()) - 60
    start = StartJob(
        job_id=77,
        cluster=cluster,
        user="bob",
        resources=[Resource(hostname="n9")],
        num_nodes=1,
        start_time=t0,
    )
    line = format_line(job_event_line(start, t0, cluster=cluster))
    # the way an operator injects it: `hpcbus pub` (nats pub's arguments)
    subprocess.run(
        [sys.executable, "-m", "hpcbus", "pub", "-s", nats_server.url, f"{cluster}.events.job", line],
        check=True,
        cwd=ROOT,
    )
    event = wait_for(lambda: summaries(nats_server, cluster).get("77"), 30, "the summary of job 77")
    assert event["flags"] == ["no_samples", "stop_missing"] and event["closed"] == "stop_missing"
    assert event["samples"] == 0 and "cpu_eff" not in event and "end" not in event
    (row,) = wait_for(
        lambda: influxdb.points("SELECT * FROM job_summary WHERE job = '77'", db), 30, "its point"
    )
    assert row["flag_stop_missing"] is True and row["flag_no_samples"] is True and row["user"] == "bob"
    assert "cpu_eff" not in row or row["cpu_eff"] is None  # unknown: absent, never made up
    # the same start again (a redelivery, a replay) does not open the job again
    js_publish(nats_server.url, [(f"{cluster}.events.job", (line + "\n").encode())])
    wait_for(lambda: settled(nats_server.url, cluster, "hpcbus-jobs"), 20, "the worker to take it")
    state = decode_state((tmp_path / "jobs.state").read_bytes())  # saved before the ack
    assert state.jobs == {} and f"{cluster}\t77" in state.closed
    assert w.running()


def test_process_groups_end_when_their_samples_stop_and_memory_stays_bounded(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str, db: str
) -> None:
    """60 process-group jobs with `max_jobs` 10: never more than 10 open (the least recently active are
    summarised early, `closed: evicted`), and every job gets exactly one summary. The log counts them in its
    periodic line instead of one INFO line per job (100,000 jobs in a burst were 100,000 lines)."""
    w = jobs_worker(
        workers, tmp_path, nats_server, influxdb, cluster, db, "--max-jobs", "10", "--process-quiet", "2"
    )
    t0 = int(time.time()) - 300
    messages = []
    for k in range(60):
        job = f"{1000 + k}@190553940"
        lines = [
            f"job_processes,cluster={cluster},epoch=190553940,hostname=n1,job={1000 + k},stype=job,stype-id={job},type=node,type-id=0,user=carol value=1i {t0 + s}"
            for s in range(3)
        ]
        messages.append((f"{cluster}.metrics", ("\n".join(lines) + "\n").encode()))
    js_publish(nats_server.url, messages)
    found = wait_for(lambda: len(s := summaries(nats_server, cluster)) == 60 and s, 60, "60 summaries")
    assert {e["scheduler"] for e in found.values()} == {"process"}
    closed = [e["closed"] for e in found.values()]
    assert closed.count("evicted") >= 50 and closed.count("end") >= 1
    assert all(e["samples"] == 3 for e in found.values())
    # a process group whose samples stopped has ended; one evicted early may still run: state unknown
    assert all(e.get("state") == ("ended" if e["closed"] == "end" else None) for e in found.values())

    def state_is_empty() -> bool:  # written at most every save_seconds: after the sends, the next save
        state = decode_state((tmp_path / "jobs.state").read_bytes())
        return len(state.jobs) == 0 and len(state.outbox) == 0

    wait_for(state_is_empty, 10, "a saved state without open jobs or summaries")
    rows = wait_for(
        lambda: len(r := influxdb.points("SELECT samples FROM job_summary", db)) == 60 and r, 30, "60 points"
    )
    assert {r["samples"] for r in rows} == {3}
    assert w.terminate() == 0
    assert " closed (" not in w.log()  # no line per job at INFO
    assert re.search(r"open jobs 0, closed jobs 60, evicted jobs 50, summaries 60,", w.log()), w.log()[-2000:]


def test_nodejob_ends_close_a_job_without_a_batch_system(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str, db: str
) -> None:
    """No `produce slurm` (`record_wait` 0): the node's `nodejob` start/end are the job's life; the cpuset
    gives the cores."""
    jobs_worker(workers, tmp_path, nats_server, influxdb, cluster, db, "--record-wait", "0")
    t0 = int(time.time()) - 120
    seen = NodeJob(job_id=55, cluster=cluster, hostname="n1", start_time=t0, user="dan", hwthreads=[0, 1])
    lines = [format_line(node_job_line(seen, "start", t0))]
    metrics = [x for i in range(5) for x in proc_lines(cluster, "n1", "55", t0 + 5 * i, 300, cpu_time=5 * i)]
    ended = msgspec.structs.replace(seen, stop_time=t0 + 20)
    end = format_line(node_job_line(ended, "end", t0 + 20))
    js_publish(
        nats_server.url,
        [
            (f"{cluster}.events.nodejob", (lines[0] + "\n").encode()),
            (f"{cluster}.metrics", ("\n".join(metrics) + "\n").encode()),
            (f"{cluster}.events.nodejob", (end + "\n").encode()),
        ],
    )
    event = wait_for(lambda: summaries(nats_server, cluster).get("55"), 30, "the summary of job 55")
    assert (event["state"], event["elapsed"], event["cores"], event["cpu_seconds"]) == (
        "ended",
        20.0,
        2,
        20.0,
    )
    assert event["cpu_eff"] == 50.0 and event["flags"] == [] and event["closed"] == "end"


def test_bad_settings_and_bad_state_file_are_one_line_errors(tmp_path: Path, nats_server: NatsServer) -> None:
    base = [sys.executable, "-m", "hpcbus", "consume", "jobs", "--nats", nats_server.url, "--cluster", "x"]
    bad = subprocess.run(
        [*base, "--window", "10", "--ack-wait", "30"], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and "window" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "s").write_bytes(b"not a state")
    broken = subprocess.run(
        [*base, "--state-file", str(tmp_path / "s")], capture_output=True, text=True, cwd=ROOT
    )
    assert broken.returncode == 1 and f"{tmp_path / 's'}: not a jobs state file" in broken.stderr
    assert "Traceback" not in broken.stderr


def test_format_lines_of_the_helpers_are_valid() -> None:
    """The synthetic lines above are what the node producer writes (parseable, one field each)."""
    from hpcbus.schemas.lineprotocol import parse_payload

    text = "\n".join(proc_lines("c", "n1", "1", 1_700_000_000, 5, cpu_time=1, rss=2, gpu_util=3, energy=4))
    parsed = parse_payload(text.encode(), now=1_700_000_100)
    assert not parsed.errors and len(parsed.lines) == 5
    assert format_lines(parsed.lines)
