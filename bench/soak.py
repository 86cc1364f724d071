"""A year in an hour (issue 31): the job churn of a 2,000-node site through the real pipeline, then what it
left behind: refused points, stuck summaries, series per measurement, memory, disk and query times.

`make soak SOAK_JOBS=N` (or `python -m bench.soak N`); not part of `make bench`, which must stay short.

Why a soak and not a benchmark: InfluxDB's limits (`max-values-per-tag`, series per database) and a worker's
state only bite after weeks of distinct jobs, so the harness pushes `N` distinct jobs whose timestamps are
spread over the raw retention window (`deploy influx-retention`'s `raw_duration`) and measures the end
state, not a rate.

What runs, all private and in a temporary directory: a nats-server with JetStream, InfluxDB 1.6 (Debian's
`influxd`) with the `[data]` settings `hpcbus deploy influxdb` prints (tsi1, no `max-values-per-tag`, no
`max-series-per-database`) and its retention and continuous-query services on, the retention policies and
continuous queries of `hpcbus deploy influx-retention`, and the real `hpcbus consume influx` and
`hpcbus consume jobs` processes.

What is published, built with the project's own builders (nothing hand-written, no sacct run):
- per job and node, three samples of the node agent (`producers.node.pipeline.Pipeline.sample_messages`,
  the bytes `produce node` publishes): two with the job's processes (`process_*`, `job_processes`, the
  `nodejob` start in the first), a third without them (the `nodejob` end);
- for the Slurm jobs, the `slurm` events and cc-backend start/stop events `produce slurm` publishes for
  completed sacct rows (`producers.slurm.producer.SlurmProducer.build` on `SacctRow`s);
- a third of the jobs are process groups (job id = process group id, key `<pgid>@<epoch>`), a tenth of the
  Slurm jobs are array tasks (`A_T`), a seventh run on 2 to 4 nodes.

Samples of many nodes are joined per subject into messages of at most `MESSAGE_BYTES` (as many node agents
would fill the stream); a chunk is published only when both durables have less than `BACKLOG` messages to
go (so the rate is what the pipeline sustains), and the end is waited for on state: the durables' pending
at 0 and the jobs worker's counters (no open job, no pending summary), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from hpcbus.commands.deploy.dashboards.boards import dashboards
from hpcbus.commands.deploy.dashboards.settings import RetentionSettings, duration_seconds
from hpcbus.commands.deploy.influxdb import data_settings
from hpcbus.local.daemon import http_request
from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.jobs import JobEnded, JobReading, JobStarted, sonar_epoch
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.node.processes import ProcessReading
from hpcbus.producers.slurm.poller import Poll
from hpcbus.producers.slurm.producer import SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas import subjects
from hpcbus.schemas.noderange import compress
from hpcbus.schemas.slurm.sacct import SacctRow
from hpcbus.schemas.slurm.values import JobId
from hpcbus.schemas.translate import split_payloads
from hpcbus.streams import stream_name
from tests.consumer_helpers import Worker
from tests.services import InfluxDB, NatsServer, PeakRss
from tests.test_grafana import Var, interpolate, interval

DEFAULT_JOBS = 1_000_000
CLUSTER = "soak"
DB = "soak"
NODES = 2000
INTERVAL = 30
"""Seconds between a node's samples."""
MESSAGE_BYTES = 256 * 1024
CHUNK_JOBS = 250
"""Jobs built and published together (their Slurm records travel as one poll's envelope)."""
BACKLOG = 200
"""Messages a durable may have to go before the next chunk is published."""
DURABLES = {"influx": "soak-influx", "jobs": "soak-jobs"}
STALL_SECONDS = 180
STALL_SHARE = 0.01
"""Once everything is published, the wait for the last summaries ends when the jobs not yet summarised (open
or pending) did not fall by `STALL_SHARE` in `STALL_SECONDS`: a worker that summarises a job every few
seconds would otherwise hold the table back for days, and the table is what shows it."""

SERVICES: dict[str, dict[str, str]] = {
    "retention": {"enabled": "true"},
    "continuous_queries": {"enabled": "true"},
}
"""influxd's services as they run at a site (the tests' InfluxDB turns them off to stay quiet): retention
drops expired shards, the continuous queries of `deploy influx-retention` fill the `5m` policy. The `[data]`
settings the schema needs come from `hpcbus deploy influxdb` (`data_settings()`)."""


class SoakInfluxDB(InfluxDB):
    """The tests' private InfluxDB with `hpcbus deploy influxdb`'s `[data]` settings and `SERVICES` on."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__(base_dir, data=data_settings())

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_path.read_text()
        for section, values in SERVICES.items():
            for key, value in values.items():
                text, found = re.subn(
                    rf"(\[{section}\]\n(?:  .*\n)*?)  {re.escape(key)} = .*\n",
                    rf"\1  {key} = {value}\n",
                    text,
                )
                assert found == 1, f"no {key} in [{section}] of the InfluxDB configuration"
        self.config_path.write_text(text)


class Job(msgspec.Struct, frozen=True):
    """One synthetic job: what the node agents and Slurm say about it."""

    index: int
    job: int
    """Slurm job id (the task's own id for an array task), or the process group id."""
    epoch: int
    """0 for Slurm jobs; the nodes' Sonar epoch for a process group."""
    hosts: tuple[str, ...]
    start: int
    user: str
    array: tuple[int, int] | None = None
    """(array job id, task id) of an array task."""

    @property
    def key(self) -> str:
        """The bus's job key (docs/jobs.md): `<job>` or `<job>@<epoch>`."""
        return f"{self.job}@{self.epoch}" if self.epoch else str(self.job)

    @property
    def end(self) -> int:
        return self.start + 2 * INTERVAL


def host(i: int) -> str:
    return f"n{i % NODES + 1:04d}"


def plan(n: int, now: int, window: int) -> Iterator[Job]:
    """`n` jobs, start times spread evenly over `window` seconds ending an hour before `now` (inside the raw
    retention policy with a margin), hosts taken round-robin so that no node runs two jobs at once."""
    first = now - window + 3600
    span = max(1, window - 2 * 3600)
    boot = first - 86400  # every node booted a day before the window: one Sonar epoch per node
    cursor = 0
    for i in range(n):
        start = first + span * i // n // INTERVAL * INTERVAL
        user = f"user{i % 47:03d}"
        if i % 3 == 0:  # a process group outside Slurm: one node
            yield Job(i, 10_000 + i, sonar_epoch(boot), (host(cursor),), start, user)
            cursor += 1
            continue
        width = 2 + i % 3 if i % 7 == 2 else 1
        hosts = tuple(host(cursor + k) for k in range(width))
        cursor += width
        own = 2_000_000 + i
        array = (own - i % 4, i % 4) if i % 10 == 1 else None
        yield Job(i, own, 0, hosts, start, user, array)


def _process(job: Job, pid: int, t: int, k: int) -> ProcessReading:
    cpu = float((t - job.start + INTERVAL) * (k + 1) // 2)
    return ProcessReading(
        pid=pid,
        ppid=pid - 1 if k else 1,
        pgid=job.job if job.epoch else pid - k,
        sid=pid - k,
        uid=10_000 + job.index % 47,
        user=job.user,
        state="R",
        cmd="solver" if k else "run.sh",
        start_time=float(job.start),
        user_time=cpu * 0.9,
        system_time=cpu * 0.1,
        children_time=0.0,
        cpu_time=cpu,
        cpu_avg=50.0 * (k + 1),
        cpu_util=50.0 * (k + 1),
        num_threads=1 + k,
        resident_kib=100_000 * (k + 1),
        rss_kib=120_000 * (k + 1),
        virtual_kib=400_000,
        vsize_kib=800_000,
        read_bytes=4096 * (t - job.start),
        write_bytes=1024 * (t - job.start),
        job=0 if job.epoch else job.job,
    )


def node_samples(job: Job, boot: int) -> Iterator[NodeSample]:
    """What each node of `job` samples of it: two samples with its two processes, then one without."""
    slurm = job.epoch == 0
    for h in job.hosts:
        pid = job.job if job.epoch else 100_000 + job.index % 3_000_000
        for n, t in enumerate((job.start, job.start + INTERVAL, job.end)):
            events: list[JobStarted | JobEnded] = []
            readings = []
            if n < 2:
                procs = [_process(job, pid + k, t, k) for k in range(2)]
                readings = [
                    JobReading(
                        job=job.job, epoch=job.epoch, user=job.user, uid=0, slurm=slurm, processes=procs
                    )
                ]
            if n == 0:
                events.append(
                    JobStarted(job=job.job, epoch=job.epoch, user=job.user, slurm=slurm, time=t, start_time=t)
                )
            if n == 2:
                events.append(
                    JobEnded(
                        job=job.job,
                        epoch=job.epoch,
                        user=job.user,
                        slurm=slurm,
                        time=t,
                        last_seen=t - INTERVAL,
                        start_time=job.start,
                    )
                )
            yield NodeSample(
                time=float(t),
                hostname=h,
                interval_s=INTERVAL,
                boot_time=boot,
                jobs=readings,
                job_events=events,
            )


def sacct_row(job: Job) -> SacctRow:
    """The completed job row sacct would print for a Slurm job of the plan."""

    def at(t: int) -> datetime:
        return datetime.fromtimestamp(t, UTC)

    cpus = 4 * len(job.hosts)
    shown = JobId(base=job.array[0], array_task_id=job.array[1]) if job.array else JobId(base=job.job)
    return SacctRow(
        job=shown,
        job_id_raw=job.job,
        job_name="soak",
        user=job.user,
        account=f"proj{job.index % 11}",
        partition="gpu" if job.index % 5 == 0 else "cpu",
        state="COMPLETED",
        submit=at(job.start - 60),
        start=at(job.start),
        end=at(job.end),
        elapsed_raw=job.end - job.start,
        alloc_cpus=cpus,
        nnodes=len(job.hosts),
        req_mem_kib=4 * 1024 * 1024 * len(job.hosts),
        time_limit=60,
        node_list=",".join(compress(list(job.hosts))),
        alloc_tres=f"billing={cpus},cpu={cpus},mem={4 * len(job.hosts)}G,node={len(job.hosts)}",
    )


class Builder:
    """Messages of a chunk of jobs: the node agents' (one `Pipeline` per node, as each node runs one), then
    the Slurm producer's for the chunk's Slurm jobs, as one poll after the last of them ended."""

    def __init__(self, boot: int) -> None:
        self.boot = boot
        self.pipelines: dict[str, Pipeline] = {}
        self.config = AgentConfig(cc_lines=False)
        self.slurm = SlurmSettings()

    def messages(self, jobs: list[Job]) -> list[tuple[str, bytes]]:
        texts: dict[str, list[bytes]] = {}
        for job in jobs:
            for sample in node_samples(job, self.boot):
                pipeline = self.pipelines.get(sample.hostname)
                if pipeline is None:
                    pipeline = self.pipelines[sample.hostname] = Pipeline(
                        CLUSTER, sample.hostname, self.config
                    )
                for m in pipeline.sample_messages(sample, MESSAGE_BYTES):
                    texts.setdefault(m.subject, []).append(m.payload)
        rows = [sacct_row(j) for j in jobs if j.epoch == 0]
        if rows:
            polled = datetime.fromtimestamp(max(j.end for j in jobs) + INTERVAL, UTC)
            out = SlurmProducer(self.slurm, CLUSTER, SlurmState()).build(
                Poll(time=polled, sacct_ok=True, rows=rows)
            )
            for subject, payload, _ in out.messages():
                texts.setdefault(subject, []).append(payload)
        order = sorted(texts, key=lambda s: ("slurm" in s or s.endswith(".job"), "nodejob" in s))
        return [(s, p) for s in order for p in split_payloads(b"".join(texts[s]), MESSAGE_BYTES)]


class Telemetry:
    """The workers' `hpcbus_*` self-telemetry, read from the bus: the last value of each counter per worker."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, float]] = {}
        self.seen: dict[str, float] = {}

    async def on(self, msg: Msg) -> None:
        for line in msg.data.decode(errors="replace").splitlines():
            m = re.match(r"hpcbus_(\w+),.*?stype-id=([^, ]+)[^ ]* value=([-0-9.e]+)i?", line)
            if m:
                self.values.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
                self.seen[m.group(2)] = time.monotonic()

    def get(self, worker: str, counter: str) -> int:
        """The counter's last value; `Missing` when the worker never said it (a renamed counter must not
        read as 0 refused)."""
        try:
            return int(self.values[worker][counter])
        except KeyError:
            raise Missing(f"hpcbus_{counter} of {worker}") from None

    def total(self, counter: str) -> int:
        """The counter summed over both workers."""
        return sum(self.get(worker, counter) for worker in DURABLES.values())


class Missing(KeyError):
    """A counter the workers' telemetry did not carry."""


def counted(what: Callable[[], int]) -> str:
    """A table value from counters: the number, or `missing: <counter>` (which the test refuses)."""
    try:
        return f"{what():,}"
    except Missing as exc:
        return f"missing: {exc.args[0]}"


def rss(pid: int) -> int:
    """VmRSS of `pid`, bytes (0 once it exited)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) * 1024 if found else 0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


async def backlog(js: Any, durable: str) -> int:
    """Messages the durable has still to take or acknowledge."""
    try:
        info = await js.consumer_info(stream_name("HPCBUS", CLUSTER), durable)
    except NotFoundError:
        return 1 << 30
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


async def wait_state(what: str, check: Any, timeout: float, interval: float = 0.2) -> float:
    """Await `check()` until true; the seconds it took. Raises naming `what` after `timeout`."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"soak: timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - started


async def drive(
    url: str, jobs: list[Job], builder: Builder, telemetry: Telemetry, settle_timeout: float
) -> dict[str, float]:
    """Publish every chunk at the rate the durables drain, then wait until everything is written and every
    job summarised; the seconds of each phase and the messages published."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await nc.subscribe(subjects.telemetry(CLUSTER), cb=telemetry.on)
    published = 0
    lines = 0
    started = time.monotonic()
    try:
        for i in range(0, len(jobs), CHUNK_JOBS):
            messages = builder.messages(jobs[i : i + CHUNK_JOBS])
            for d in DURABLES.values():
                await wait_state(f"durable {d} to drain", lambda d=d: _below(js, d, BACKLOG), settle_timeout)
            acks = [js.publish(s, p) for s, p in messages]
            for k in range(0, len(acks), 64):
                await asyncio.gather(*acks[k : k + 64])
            published += len(messages)
            lines += sum(p.count(b"\n") for _, p in messages)
            done = min(len(jobs), i + CHUNK_JOBS)
            if done * 10 // len(jobs) > i * 10 // len(jobs):  # progress on stderr, every tenth of the jobs
                print(
                    f"soak: {done:,} jobs published after {time.monotonic() - started:,.0f} s",
                    file=sys.stderr,
                )
        publish_s = time.monotonic() - started

        async def drained() -> bool:
            return all([await backlog(js, d) == 0 for d in DURABLES.values()])

        best = (time.monotonic(), float("inf"))  # (when, fewest jobs not yet summarised)

        async def summarised() -> bool:
            nonlocal best
            jobs_worker = telemetry.values.get(DURABLES["jobs"], {})
            left = jobs_worker.get("open_jobs", 1) + jobs_worker.get("pending_summaries", 1)
            if left == 0 and jobs_worker and await drained():
                return True
            now = time.monotonic()
            if left < best[1] * (1 - STALL_SHARE):
                best = (now, left)
            elif now - best[0] > STALL_SECONDS:
                raise RuntimeError(
                    f"soak: the jobs worker stalled: {left:,.0f} jobs open or pending, fewer by less than "
                    f"{STALL_SHARE:.0%} in {STALL_SECONDS} s; the table shows where it stopped"
                )
            return False

        await wait_state("the durables to drain", drained, settle_timeout)
        try:
            await wait_state("every job summarised", summarised, settle_timeout)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
        mark = time.monotonic()  # counters said after everything settled
        await wait_state(
            "the workers' telemetry after the end",
            lambda: _async(all(telemetry.seen.get(d, 0) > mark for d in DURABLES.values())),
            60,
        )
        return {
            "publish_s": publish_s,
            "total_s": time.monotonic() - started,
            "messages": published,
            "lines": lines,
        }
    finally:
        await nc.close()


async def _below(js: Any, durable: str, limit: int) -> bool:
    return await backlog(js, durable) < limit


async def _async(value: bool) -> bool:
    return value


async def dead_letters(url: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(stream_name("HPCBUS_DLQ", CLUSTER))
        return int(info.state.messages)
    except NotFoundError:
        return 0
    finally:
        await nc.close()


QUERY_TIMEOUT = 300.0
"""Seconds a dashboard query may take here; Grafana gives up after 30 s by default, and the table says so."""


def timed_query(influx: InfluxDB, text: str) -> tuple[float, int]:
    """Seconds InfluxDB took to answer `text` against the soak's database, and the rows it returned (-1 when it
    did not answer within `QUERY_TIMEOUT`: the job-list queries grow with the jobs of the window)."""
    started = time.perf_counter()
    body = urllib.parse.urlencode({"q": text, "db": DB}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    try:
        status, raw = http_request(
            "POST", f"{influx.url}/query", data=body, headers=form, timeout=QUERY_TIMEOUT
        )
    except TimeoutError:
        return time.perf_counter() - started, -1
    seconds = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"InfluxDB query {text!r}: HTTP {status}: {raw[:300]!r}")
    answer = json.loads(raw)
    rows = sum(len(s.get("values", [])) for r in answer.get("results", []) for s in r.get("series", []))
    return seconds, rows


def query_time(seconds: float, rows: int) -> str:
    """A query's table value: milliseconds, and whether Grafana (30 s by default) would have waited."""
    if rows < 0:
        return f"failed: no answer in {QUERY_TIMEOUT:.0f} s"
    return f"{seconds * 1000:,.0f} ms" + (" (over Grafana's 30 s)" if seconds > 30 else "")


def dashboard_rows(influx: InfluxDB, job: Job, window_ms: tuple[int, int]) -> list[tuple[str, str]]:
    """Every variable and panel query of the job-list (`users-accounts`) and job-detail dashboards, as Grafana
    sends it (the substitution of tests/test_grafana.py): job list over the whole raw window, all users and
    accounts; job detail for `job` over its own time plus 5 minutes either side."""
    boards, _ = dashboards()
    out: list[tuple[str, str]] = []
    for label, name in (("job-list", "users-accounts.json"), ("job-detail", "job-detail.json")):
        board = boards[name]
        if label == "job-list":
            from_ms, to_ms = window_ms
        else:
            from_ms, to_ms = (job.start - 300) * 1000, (job.end + 300) * 1000
        variables: dict[str, Var] = {}
        for v in board["templating"]["list"]:
            multi, include_all = bool(v.get("multi")), bool(v.get("includeAll"))
            if v["type"] == "custom":
                variables[v["name"]] = Var(v["name"], ["autogen"], multi, include_all)
                continue
            text = interpolate(v["query"], variables, from_ms, to_ms, "1s")
            seconds, n = timed_query(influx, text)
            out.append((f"{label} ${v['name']} (variable, {n:,} values)", query_time(seconds, n)))
            if v["name"] == "cluster":
                variables["cluster"] = Var("cluster", [CLUSTER], multi, include_all)
            elif v["name"] == "job":
                variables["job"] = Var("job", [job.key], multi, include_all)
            elif v.get("allValue"):
                variables[v["name"]] = Var(v["name"], [v["allValue"]], multi, include_all, custom_all=True)
            else:
                values = [r["value"] for r in influx.points(text, DB)]
                variables[v["name"]] = Var(v["name"], values, multi, include_all)
        step = interval(from_ms, to_ms, 1)
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                text = interpolate(target["query"], variables, from_ms, to_ms, step)
                seconds, n = timed_query(influx, text)
                title = f"{label} {panel['title']} {target['refId']} ({n:,} rows)"
                out.append((title, query_time(seconds, n)))
    return out


def report_seconds(influx: InfluxDB, job: Job, tmp: Path) -> str:
    """`hpcbus report --job` wall time (process start included, as an admin runs it)."""
    target = tmp / f"report-{job.index}.json"
    argv = [sys.executable, "-m", "hpcbus", "report", "--job", job.key, "--cluster", CLUSTER]
    argv += ["--influx-url", influx.url, "--db", DB, "--format", "json", "--output", str(target)]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or not target.stat().st_size:
        return f"failed ({done.returncode}): {done.stderr.strip()[-200:]}"
    return f"{seconds:,.2f} s"


def _number(rows: list[dict[str, Any]]) -> int:
    """The sum of the one numeric column of a cardinality answer (1.6 names it `count` or
    `cardinality estimation` depending on the statement)."""
    return sum(
        int(v) for r in rows for k, v in r.items() if k not in ("_measurement", "time") and isinstance(v, int)
    )


def series_rows(influx: InfluxDB) -> list[tuple[str, str]]:
    """Series of the database (InfluxDB's estimate) and exactly per measurement."""
    out = [("series (SHOW SERIES CARDINALITY)", f"{_number(influx.points('SHOW SERIES CARDINALITY', DB)):,}")]
    for row in influx.points("SHOW MEASUREMENTS", DB):
        m = row["name"]
        exact = influx.points(f'SHOW SERIES EXACT CARDINALITY FROM "{m}"', DB)
        out.append((f"series {m}", f"{_number(exact):,}"))
    return out


def soak(n: int, tmp: Path) -> list[tuple[str, str]]:
    """Run the soak with `n` jobs in `tmp`; the table's rows (name, value)."""
    now = int(time.time())
    window = int(duration_seconds(RetentionSettings().raw_duration))
    jobs = list(plan(n, now, window))
    boot = now - window + 3600 - 86400
    settle = 600.0 + n / 50
    workers: list[Worker] = []
    with NatsServer(tmp / "nats") as ns, SoakInfluxDB(tmp / "influx") as influx:
        influx.create_db(DB)
        retention = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpcbus",
                "deploy",
                "influx-retention",
                "--influx-url",
                influx.url,
                "--db",
                DB,
            ],
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        if retention.returncode != 0:
            raise RuntimeError(f"deploy influx-retention failed: {retention.stderr}")
        bus = [
            "--nats",
            ns.url,
            "--cluster",
            CLUSTER,
            "--influx-url",
            influx.url,
            "--db",
            DB,
            "--stats-seconds",
            "2",
        ]
        state_file = tmp / "jobs.state"
        jobs_args = ["consume", "jobs", *bus, "--durable", DURABLES["jobs"], "--state-file", str(state_file)]
        jobs_args += ["--grace", "0", "--record-wait", "2", "--process-quiet", "5", "--window", "31"]
        jobs_args += ["--ack-wait", "30", "--interval", str(INTERVAL)]
        try:
            influx_worker = Worker(
                ["consume", "influx", *bus, "--durable", DURABLES["influx"]], tmp / "influx.log"
            )
            workers.append(influx_worker.start(timeout=60))
            jobs_worker = Worker(jobs_args, tmp / "jobs.log")
            workers.append(jobs_worker.start(timeout=60))
            jobs_peak = PeakRss(jobs_worker.pid)
            telemetry = Telemetry()
            phases = asyncio.run(drive(ns.url, jobs, Builder(boot), telemetry, settle))
            dlq = asyncio.run(dead_letters(ns.url))
            rows: list[tuple[str, str]] = [
                (
                    "jobs",
                    f"{n:,} ({sum(j.epoch > 0 for j in jobs):,} process groups, "
                    f"{sum(j.array is not None for j in jobs):,} array tasks, "
                    f"{sum(len(j.hosts) > 1 for j in jobs):,} multi-node)",
                ),
                (
                    "published",
                    f"{int(phases['messages']):,} messages, {int(phases['lines']):,} lines "
                    f"in {phases['publish_s']:,.0f} s",
                ),
                ("settled after", f"{phases['total_s']:,.0f} s"),
            ]
            t, jw = telemetry, DURABLES["jobs"]

            # refused: lines refused as invalid, and dead letters: the messages and the summaries InfluxDB
            # refused (`refused_summaries`, dead-lettered as merged output), or the stream if it holds more
            def refused() -> int:
                letters = t.total("deadlettered") + t.get(jw, "refused_summaries")
                return t.total("rejected") + max(letters, dlq)

            rows.append(("refused", counted(refused)))
            rows.append(("dead letters", f"{dlq:,}"))
            rows.append(("stuck", counted(lambda: t.get(jw, "pending_summaries"))))
            rows.append(("open jobs at the end", counted(lambda: t.get(jw, "open_jobs"))))
            rows.append(("summaries", counted(lambda: t.get(jw, "summaries"))))
            rows.append(("jobs not summarised", counted(lambda: n - t.get(jw, "summaries"))))
            rows.append(("jobs worker state saves", counted(lambda: t.get(jw, "saves"))))
            rows.append(("retried", counted(lambda: t.total("retried"))))
            rows.append(("late lines", counted(lambda: t.get(jw, "late_lines"))))
            summary_points = influx.points('SELECT count("elapsed") FROM "job_summary"', DB)
            rows.append(
                ("job_summary points", f"{int(summary_points[0]['count']) if summary_points else 0:,}")
            )
            rows += series_rows(influx)
            assert influx.pid is not None
            rows.append(("influxd RSS", mib(rss(influx.pid))))
            rows.append(("influxd disk (data + wal)", mib(du(influx.data_dir) + du(tmp / "influx" / "wal"))))
            rows.append(
                ("jobs worker RSS (now / peak)", f"{mib(rss(jobs_worker.pid))} / {mib(jobs_peak.bytes)}")
            )
            rows.append(
                ("jobs worker state file", mib(state_file.stat().st_size if state_file.exists() else 0))
            )
            rows.append(("consume influx RSS", mib(rss(influx_worker.pid))))
            recent, old = jobs[-1], jobs[0]
            rows.append((f"report --job {recent.key} (recent)", report_seconds(influx, recent, tmp)))
            rows.append((f"report --job {old.key} (old)", report_seconds(influx, old, tmp)))
            window_ms = ((now - window) * 1000, now * 1000)
            rows += dashboard_rows(influx, recent, window_ms)
            rows += [
                (f"{k} (old job)", v) for k, v in dashboard_rows(influx, old, window_ms) if "job-detail" in k
            ]
            return rows
        finally:
            for w in workers:
                w.stop()


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "jobs",
        nargs="?",
        type=int,
        default=int(os.environ.get("SOAK_JOBS") or DEFAULT_JOBS),
        help="distinct jobs to push (default: $SOAK_JOBS, else %(default)s)",
    )
    n = parser.parse_args(argv).jobs
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpcbus-soak-") as tmp:
        rows = soak(n, Path(tmp))
    rows.append(("soak wall time", f"{time.monotonic() - started:,.0f} s"))
    print(f"hpcbus soak: {n:,} jobs on {NODES:,} nodes, {os.cpu_count()} CPUs")
    print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
