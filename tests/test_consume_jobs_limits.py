"""`hpcbus consume jobs` against the limits a year of a busy site meets (issue 31), on a real nats-server and
InfluxDB 1.6: a summary InfluxDB refuses for good (`max-values-per-tag`) is dead-lettered with InfluxDB's
reason and never wedges the worker, a state file belongs to one cluster and durable and is not kept in the
current directory, and `max_jobs` holds through a burst of 100,000 jobs with the worker's memory bounded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbus.schemas.jobsummary import JobState, State, decode_state, encode_state, state_key
from tests.consumer_helpers import ROOT, Process, bus_messages, js_publish, settled, wait_for
from tests.services import InfluxDB, NatsServer
from tests.services.rss import PeakRss
from tests.test_consume_jobs import jobs_worker

pytestmark = pytest.mark.services

EPOCH = 190553940
MAX_VALUES_PER_TAG = 20


class SmallInfluxDB(InfluxDB):
    """The test InfluxDB with `max-values-per-tag` 20 (the default is 100,000: a busy site reaches it in
    weeks): the 21st distinct `job` of `job_summary` is refused once 20 are stored."""

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_path.read_text()
        anchor = "  query-log-enabled = false\n"
        assert anchor in text
        limit = f"{anchor}  max-values-per-tag = {MAX_VALUES_PER_TAG}\n"
        self.config_path.write_text(text.replace(anchor, limit))


@pytest.fixture(scope="module")
def small_influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallInfluxDB]:
    with SmallInfluxDB(tmp_path_factory.mktemp("influx-small")) as server:
        yield server


def group_messages(cluster: str, jobs: range | list[int], t0: int) -> list[tuple[str, bytes]]:
    """One message per process-group job `<k>@EPOCH`: three samples of its anchor line on n1."""
    out = []
    for k in jobs:
        lines = [
            f"job_processes,cluster={cluster},epoch={EPOCH},hostname=n1,job={k},stype=job,"
            f"stype-id={k}@{EPOCH},type=node,type-id=0,user=carol value=1i {t0 + s}"
            for s in range(3)
        ]
        out.append((f"{cluster}.metrics", ("\n".join(lines) + "\n").encode()))
    return out


def published(nats: NatsServer, cluster: str) -> set[str]:
    """The job keys of the cluster's `jobsummary` events on the bus."""
    found = set()
    for msg in bus_messages(nats.url, cluster, f"{cluster}.events.jobsummary"):
        m = re.match(rb"jobsummary,cluster=[^,]+,job=(\S+) ", msg.data or b"")
        assert m, msg.data
        found.add(m.group(1).decode())
    return found


def stored(influx: InfluxDB, db: str, cluster: str) -> set[str]:
    """The `job` values of the cluster's `job_summary` points in InfluxDB."""
    rows = influx.points(f"SELECT samples, job FROM job_summary WHERE \"cluster\" = '{cluster}'", db)
    return {str(r["job"]) for r in rows}


def dead_letters(nats: NatsServer, cluster: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(original subject, problems) of each dead letter of the cluster."""
    out = []
    for msg in bus_messages(nats.url, cluster, kind="HPCBUS_DLQ"):
        headers = msg.headers or {}
        out.append((headers.get("Hpcbus-Subject", ""), json.loads(headers.get("Hpcbus-Problems", "[]"))))
    return out


def test_summaries_influxdb_refuses_are_dead_lettered_and_never_wedge_the_worker(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, small_influx: SmallInfluxDB
) -> None:
    """With InfluxDB at `max-values-per-tag` 20: 25 jobs of cluster A fill the limit, the next 35 new jobs
    of A are refused by InfluxDB (each dead-lettered once with InfluxDB's reason, its event still on the
    bus), a restart resumes none of them, and the jobs of cluster B that come after (whose `job` values
    InfluxDB holds already) are written: nothing waits behind a refused summary. `hpcbus status` shows the
    dead letters with the reason and the worker's counters."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"a{tag}.example.org", f"b{tag}.example.org"
    db = f"limits_{tag}"
    w = jobs_worker(
        workers,
        tmp_path,
        nats_server,
        small_influx,
        f"{a},{b}",
        db,
        "--process-quiet",
        "1",
        "--stats-seconds",
        "0.5",
    )
    t0 = int(time.time()) - 300
    js_publish(nats_server.url, group_messages(a, range(25), t0))
    first = {f"{k}@{EPOCH}" for k in range(25)}
    wait_for(lambda: published(nats_server, a) == first, 60, "the summaries of the first 25 jobs")
    wait_for(lambda: len(stored(small_influx, db, a)) >= MAX_VALUES_PER_TAG, 30, "InfluxDB at its limit")
    wait_for(lambda: settled(nats_server.url, a, "hpcbus-jobs"), 30, "the first jobs acknowledged")
    before = len(dead_letters(nats_server, a))  # a last batch of the 25 may pass the limit already

    js_publish(nats_server.url, group_messages(a, range(25, 60), t0))
    every = {f"{k}@{EPOCH}" for k in range(60)}
    wait_for(lambda: published(nats_server, a) == every, 60, "every summary's event on the bus")
    kept = stored(small_influx, db, a)
    refused = every - kept
    assert {
        f"{k}@{EPOCH}" for k in range(25, 60)
    } <= refused  # InfluxDB holds 20 or more: each new one refused
    letters = wait_for(
        lambda: len(found := dead_letters(nats_server, a)) == len(refused) and found,
        60,
        lambda: f"{len(refused)} dead letters: {dead_letters(nats_server, a)}\n{w.log()[-3000:]}",
    )
    assert len(refused) - before == 35
    for subject, problems in letters:
        assert subject == f"{a}.events.jobsummary"
        (problem,) = problems
        assert "given up: its job_summary point was not written" in problem["reason"], problem
        assert "max-values-per-tag limit exceeded" in problem["reason"], problem  # InfluxDB's own words
    jobs_named = {re.search(r"summary of job (\S+) given up", p[0]["reason"]).group(1) for _, p in letters}  # type: ignore[union-attr]
    assert jobs_named == refused

    def saved_outbox() -> int:
        return len(decode_state((tmp_path / f"jobs-{a}.state").read_bytes()).outbox)

    wait_for(lambda: saved_outbox() == 0, 30, "no given-up summary in the saved outbox")
    counted = rf"retried 0, .*refused summaries {len(refused)}, pending summaries 0"
    wait_for(lambda: re.search(counted, w.log()), 10, lambda: f"the counters: {w.log()[-3000:]}")
    log = w.log()
    assert "Traceback" not in log
    assert log.count("max-values-per-tag") <= 2 * len(refused)  # said once per summary, never per retry

    # a restart resumes none of them, and what comes after flows: B's jobs reuse `job` values InfluxDB holds
    assert w.terminate() == 0
    w.start()
    reused = sorted(kept)[:10]
    js_publish(nats_server.url, group_messages(b, [int(k.split("@")[0]) for k in reused], t0))
    wait_for(lambda: stored(small_influx, db, b) == set(reused), 60, lambda: f"B's points\n{w.log()[-3000:]}")
    assert len(dead_letters(nats_server, a)) == len(refused)  # nothing given up twice
    assert dead_letters(nats_server, b) == []
    status = subprocess.run(
        [sys.executable, "-m", "hpcbus", "status", "--nats", nats_server.url, "--cluster", a, "--no-influx"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert f"dead letters: {len(refused)}, newest" in status.stdout, status.stdout
    assert "max-values-per-tag limit exceeded" in status.stdout, status.stdout
    assert w.terminate() == 0
    assert "Traceback" not in w.log()


def test_a_state_file_of_another_cluster_is_refused_and_none_is_written_into_the_current_directory(
    tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB
) -> None:
    """Run by hand without `state_file`: the state goes to the user's state directory, named by cluster
    and durable, and the current directory stays empty. A file of another cluster is refused at start: one
    line naming both, exit 2."""
    here = tmp_path / "cwd"
    here.mkdir()
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg), "STATE_DIRECTORY": ""}
    cluster = f"r{uuid.uuid4().hex[:6]}.example.org"
    base = [sys.executable, "-m", "hpcbus", "consume", "jobs", "--nats", nats_server.url, "--cluster"]
    influx = ["--influx-url", influxdb.url, "--db", f"cwd_{uuid.uuid4().hex[:6]}"]
    w = Process([*base, cluster, *influx], tmp_path / "jobs.log", env=env, cwd=here)
    w.start("consuming")
    assert w.terminate() == 0
    path = xdg / "hpcbus" / f"jobs-{cluster}-hpcbus-jobs.state"
    state = decode_state(path.read_bytes())
    assert (state.cluster, state.durable) == (cluster, "hpcbus-jobs")
    assert list(here.iterdir()) == []

    # systemd's StateDirectory wins over the user's; the older release's file there is adopted
    unit = tmp_path / "unit-state"
    unit.mkdir()
    older = State(jobs={state_key(cluster, "7"): JobState(cluster=cluster, job="7")})
    (unit / "hpcbus-jobs.state").write_bytes(encode_state(older))
    unit_env = {**env, "STATE_DIRECTORY": str(unit)}
    w = Process([*base, cluster, *influx], tmp_path / "jobs2.log", env=unit_env, cwd=here)
    w.start("consuming")
    assert w.terminate() == 0
    adopted = decode_state((unit / f"jobs-{cluster}-hpcbus-jobs.state").read_bytes())
    assert list(adopted.jobs) == [state_key(cluster, "7")] and adopted.cluster == cluster
    assert not (unit / "hpcbus-jobs.state").exists() and "1 open jobs" in w.log()
    assert list(here.iterdir()) == []

    # the file of cluster hbar, started for rbar
    other = "hbar.example.org"
    mine = f"rbar{uuid.uuid4().hex[:4]}.example.org"
    (xdg / "hpcbus" / f"jobs-{mine}-hpcbus-jobs.state").write_bytes(
        encode_state(State(cluster=other, durable="hpcbus-jobs"))
    )
    refused = subprocess.run(
        [*base, mine, *influx],
        capture_output=True,
        text=True,
        cwd=here,
        env={**os.environ, **env},
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert other in line and mine in line and "Traceback" not in refused.stderr
    # an old file without owner fields is judged by its jobs' cluster
    legacy = tmp_path / "legacy.state"
    old = decode_state(path.read_bytes())
    old.cluster = old.durable = ""
    old.jobs[state_key(other, "7")] = JobState(cluster=other, job="7")
    legacy.write_bytes(encode_state(old))
    refused = subprocess.run(
        [*base, mine, *influx, "--state-file", str(legacy)],
        capture_output=True,
        text=True,
        cwd=here,
        env={**os.environ, **env},
        timeout=60,
    )
    assert refused.returncode == 2 and other in refused.stderr and mine in refused.stderr, refused.stderr
    assert list(here.iterdir()) == []


def running_reports(log: str, pattern: str) -> list[int]:
    """The values `pattern` finds in the worker's report lines while it runs (from "consuming" to the
    SIGTERM: at the stop the runner still takes what it has fetched, and nothing is sent any more)."""
    out, running = [], False
    for line in log.splitlines():
        if "consuming" in line:
            running = True
        elif "SIGTERM" in line:
            running = False
        elif running and (m := re.search(pattern, line)):
            out.append(int(m.group(1)))
    return out


class FileSizes:
    """The largest size a file reached and how often it was replaced, polled in a thread."""

    def __init__(self, path: Path, interval: float = 0.05) -> None:
        self.path = path
        self.largest = 0
        self.writes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True)
        self._thread.start()

    def _watch(self, interval: float) -> None:
        last = None
        while not self._stop.wait(interval):
            try:
                st = self.path.stat()
            except OSError:
                continue
            self.largest = max(self.largest, st.st_size)
            if st.st_ino != last:  # replaced by a rename: one write
                last = st.st_ino
                self.writes.append(time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_burst_of_100000_jobs_never_holds_more_than_max_jobs(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, influxdb: InfluxDB, cluster: str
) -> None:
    """100,000 distinct process groups in 100 messages with `max_jobs` 20,000 (the issue's burst gave 85,000
    open jobs, 307 MB and a 48 MB state file rewritten every second): at no report more than 20,000 open
    jobs, the summaries waiting stay near `max_summaries`, the worker's peak RSS and the state file stay
    bounded, the file is written at most every `save_seconds`, and every job gets its summary."""
    db = f"burst_{uuid.uuid4().hex[:6]}"
    state = tmp_path / "jobs.state"  # jobs_worker's
    extra = ["--ack-wait", "10", "--window", "20", "--max-jobs", "20000", "--save-seconds", "1"]
    w = jobs_worker(workers, tmp_path, nats_server, influxdb, cluster, db, *extra, "--stats-seconds", "0.5")
    peak = PeakRss(w.pid)
    sizes = FileSizes(state)
    t0 = int(time.time()) - 60
    messages = []
    for m in range(100):
        lines = [
            f"job_processes,cluster={cluster},epoch={EPOCH},hostname=n{k % 500},job={1_000_000 + k},stype=job,"
            f"stype-id={1_000_000 + k}@{EPOCH},type=node,type-id=0,user=u{k % 50} value=1i {t0}"
            for k in range(m * 1000, (m + 1) * 1000)
        ]
        messages.append((f"{cluster}.metrics", ("\n".join(lines) + "\n").encode()))
    started = time.monotonic()
    js_publish(nats_server.url, messages)
    wait_for(lambda: re.search(r"evicted jobs [4-8]\d{4},", w.log()), 300, lambda: w.log()[-2000:])
    sizes.stop()
    rss = peak.bytes  # while it runs: at the stop it still takes what it fetched (docs/jobs.md section 8)
    stopped = time.monotonic()
    assert w.terminate() == 0  # in the middle of the burst: sending, saving, taking
    exit_s = time.monotonic() - stopped
    rss_stop = peak.wait()
    log = w.log()
    open_jobs = [int(n) for n in re.findall(r"open jobs (\d+),", log)]
    waiting = running_reports(log, r"pending summaries (\d+),")
    saves = [int(n) for n in re.findall(r"saves (\d+)", log)]
    stop_writes = saves[-1] - running_reports(log, r"saves (\d+)")[-1]
    gaps = [b - a for a, b in zip(sizes.writes, sizes.writes[1:], strict=False)]
    w.start()  # the rest after a restart: every job summarised once, none stuck

    def points() -> int:
        rows = influxdb.points("SELECT count(samples) FROM job_summary", db)
        return int(rows[0]["count"]) if rows else 0

    # what the first process had in hand at the stop comes again after ack_wait
    wait_for(lambda: points() == 80000, 300, lambda: f"{points()} points\n{w.log()[-2000:]}")
    wait_for(lambda: re.search(r"open jobs 20000, .*pending summaries 0,", w.log()[len(log) :]), 30, "idle")
    took = time.monotonic() - started
    assert w.terminate() == 0
    log = w.log()
    open_jobs += [int(n) for n in re.findall(r"open jobs (\d+),", log)]
    print(
        f"burst: {took:.1f} s, open jobs max {max(open_jobs)}, summaries waiting max {max(waiting)}, "
        f"peak RSS {rss / 2**20:.0f} MiB ({rss_stop / 2**20:.0f} with the stop), state file max {sizes.largest / 2**20:.1f} MiB, "
        f"{len(sizes.writes)} writes, shortest gap {min(gaps, default=0):.2f} s, SIGTERM to exit {exit_s:.1f} s with {stop_writes} writes"
    )
    assert max(open_jobs) == 20000  # reached, never passed
    # max_summaries + what the runner takes while a delivery sends: (in_flight + 1) batches of 1,000
    # evictions (flush_lines / SUMMARY_ITEMS) and one message each (docs/jobs.md section 8)
    assert max(waiting) <= 5000 + 4 * (1000 + 1000)
    assert rss < 256 * 2**20, rss
    assert sizes.largest < 32 * 2**20, sizes.largest  # 20,000 jobs of one sample and 20,000 summaries
    assert min(gaps, default=1.0) >= 0.75  # save_seconds, less the grain of a poll on a busy machine
    assert exit_s < 5.0
    assert "Traceback" not in log
    assert points() == 80000  # each job once: 20,000 still open
