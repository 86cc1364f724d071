"""`hpcbus report` on what the real pipeline stored: `produce node` (this machine's processes: a process
group the test starts, and the steps of Slurm jobs), `produce slurm` on the test Slurm, `produce ocs` on a
corpus accounting file, `consume influx` into the test InfluxDB. Nothing is written by hand except one
`job_summary` point in the form the brief of issue 11 defines (what `consume jobs` writes), to show that a
summary's flags are reported in plain words.

The pipeline runs once for the module (two Slurm jobs, one process group, one OCS job); each test reports
on it. The HTML test opens the file in headless Chromium and reads the DOM it drew.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcbus.schemas import subjects
from tests.consumer_helpers import Worker, settled, wait_for
from tests.corpus import CORPUS
from tests.pipeline_helpers import (
    Services,
    influx_sink,
    jobs_worker,
    node_producer,
    pipeline_services,  # noqa: F401  (the fixture)
    slurm_producer,
)
from tests.services import InfluxDB, NatsServer, free_port

pytestmark = pytest.mark.services

OCS_ACCOUNTING = CORPUS / "gridengine" / "ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl"
OCS_JOB = "900010"
"""The one job of that accounting file (owner root, account sge, queue all.q, host master), renumbered from
its 10: the pipeline's `produce slurm` publishes every job of the session's real Slurm cluster, whose job 10
(another module's) made the report of "job 10" a Slurm job's, depending on which tests ran before."""

CHROMIUM = "/usr/bin/chromium"

BURN = """
import sys, time
block = bytearray(b"x" * (64 << 20))  # 64 MiB, touched, so resident
end = time.time() + {seconds}
while time.time() < end:
    pass
with open(sys.argv[1], "w") as out:
    out.write(str(time.process_time()))
"""
"""A job that keeps one core as busy as the shared machine lets it and holds 64 MiB; it writes the CPU
seconds it got to the file named by its argument, the truth the report's estimate is held against."""


@dataclass
class Pipeline:
    influx: InfluxDB
    db: str
    cluster: str
    other_cluster: str
    busy_job: str
    """Slurm job: one core busy for 8 s, --mem=200M."""
    idle_job: str
    """Slurm job: `sleep 4` with --mem=400M (what `consume jobs` flags)."""
    group_job: str
    """Process-group job key `<pgid>@<epoch>`."""
    tmp: Path
    summary_db: str = ""
    """The same lines plus the `job_summary` points of the real `consume jobs` (`db` has none)."""
    ambiguous_with_summary: subprocess.CompletedProcess[str] | None = None
    """`report --job <the OCS job>` while `db` still held the summaries of `cluster`."""

    def report(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "hpcbus",
            "report",
            "--influx-url",
            self.influx.url,
            "--db",
            self.db,
            *args,
        ]  # a later --db wins
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, check=False
        )

    def summarised(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.report("--db", self.summary_db, *args)

    def json(self, *args: str) -> dict[str, object]:
        done = self.report("--format", "json", *args)
        assert done.returncode == 0, done.stderr
        value = json.loads(done.stdout)
        assert isinstance(value, dict)
        return value


def _events(influx: InfluxDB, db: str, measurement: str, function: str, job: str) -> list[dict[str, object]]:
    rows = influx.points(f'SELECT * FROM "{measurement}" WHERE "function" = \'{function}\'', db)
    return [json.loads(str(r["event"])) for r in rows if str(json.loads(str(r["event"])).get("jobId")) == job]


def _stopped(influx: InfluxDB, db: str, job: str) -> bool:
    try:
        return bool(_events(influx, db, "job", "stop_job", job))
    except Exception:  # the measurement does not exist yet
        return False


@pytest.fixture(scope="module")
def pipeline(pipeline_services: Services) -> Iterator[Pipeline]:  # noqa: F811
    nats, influx, slurm = pipeline_services.nats, pipeline_services.influx, pipeline_services.slurm
    tmp = pipeline_services.tmp
    cluster = f"r{uuid.uuid4().hex[:8]}.example.org"
    other = f"o{uuid.uuid4().hex[:8]}.example.org"
    db = f"report_{uuid.uuid4().hex[:8]}"
    summary_db = f"{db}_summary"
    started: list[Worker] = []
    try:
        for c in (cluster, other):
            bus = ["--nats", nats.url, "--cluster", c]
            started.append(influx_sink(bus, influx, db, tmp / f"influx-{c}.log").start())
            accounting = tmp / f"accounting-{c}.jsonl"
            record = json.loads(OCS_ACCOUNTING.read_text())
            record["job_number"] = int(OCS_JOB)
            accounting.write_text(json.dumps(record) + "\n")
            ocs = ["produce", "ocs", *bus, "--accounting", str(accounting), "--interval", "1"]
            started.append(
                Worker([*ocs, "--state-file", str(tmp / f"ocs-{c}.state")], tmp / f"ocs-{c}.log").start(None)
            )
        bus = ["--nats", nats.url, "--cluster", cluster]
        # A second database with everything plus the summaries of the real `consume jobs`: `db` keeps the
        # report's other way, computing from the series alone.
        sum_sink = influx_sink(
            bus, influx, summary_db, tmp / "influx-summary.log", "--durable", "hpcbus-influx-summary"
        )
        started.append(sum_sink.start())
        started.append(jobs_worker(bus, influx, summary_db, tmp).start())
        node = node_producer(bus, tmp, tmp / "node.log", "--job-events", "all", env=slurm.env())
        started.append(node.start(None))
        started.append(slurm_producer(bus, slurm, tmp, "--tz", "UTC").start(None))

        def sampling() -> bool:
            try:
                return bool(influx.points('SELECT count("value") FROM "job_processes"', db))
            except Exception:  # no database or measurement yet
                return False

        wait_for(sampling, 60, lambda: "the node producer's first job samples in InfluxDB")
        script = tmp / "burn.py"
        script.write_text(BURN.format(seconds=8))
        busy = slurm.sbatch(
            None, "--mem=200M", "-J", "report-busy", wrap=f"srun {sys.executable} {script} {tmp / 'busy.cpu'}"
        )
        idle = slurm.sbatch(None, "--mem=400M", "-J", "report-idle", wrap="srun sleep 4")
        group = subprocess.Popen(
            [sys.executable, script, str(tmp / "group.cpu")],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )
        pgid = str(group.pid)
        assert group.wait(60) == 0
        for job_id in (busy, idle):
            slurm.wait_job(job_id, timeout=120)

        def logs() -> str:
            return "\n".join(p.log()[-2000:] for p in started)

        for job in (str(busy), str(idle), OCS_JOB):
            wait_for(functools.partial(_stopped, influx, db, job), 120, logs)

        def group_ended() -> bool:
            try:
                return bool(_events(influx, db, "nodejob", "end", pgid))
            except Exception:
                return False

        wait_for(group_ended, 60, lambda: f"the end of process group {pgid}\n{logs()}")

        def summarised(job: str) -> bool:
            try:
                return bool(influx.points(f'SELECT * FROM "job_summary" WHERE "job" = \'{job}\'', summary_db))
            except Exception:  # no summary yet
                return False

        for job in (str(busy), str(idle)):
            wait_for(functools.partial(summarised, job), 120, logs)
        sinks = [p for p in started if "influx" in p.args]
        for p in started:
            assert p.running(), p.log()
            if p not in sinks:
                p.terminate()
        for c in (cluster, other):
            wait_for(functools.partial(settled, nats.url, c, "hpcbus-influx"), 60, logs)
        wait_for(functools.partial(settled, nats.url, cluster, "hpcbus-influx-summary"), 60, logs)
        for p in sinks:
            p.terminate()
        # `db`'s sink derived the summaries of `cluster` from the `jobsummary` events (the copy `consume
        # jobs` does not write has them too, issue 34): the same points as `summary_db`'s. A bare number
        # with a summary in one cluster and only events in the other is still ambiguous; then the points are
        # taken out, so that `db` keeps the report's other way, from the series alone.
        for job in (str(busy), str(idle)):
            query = f'SELECT * FROM "job_summary" WHERE "job" = \'{job}\''
            assert influx.points(query, db) == influx.points(query, summary_db) != []
        ambiguous = Pipeline(influx, db, cluster, other, "", "", "", tmp).report("--job", OCS_JOB)
        influx.query('DROP MEASUREMENT "job_summary"', db)
        epoch = influx.points(
            f'SHOW TAG VALUES FROM "job_processes" WITH KEY = "epoch" WHERE "job" = \'{pgid}\'', db
        )
        assert len(epoch) == 1, epoch
        group_key = f"{pgid}@{epoch[0]['value']}"
        yield Pipeline(
            influx, db, cluster, other, str(busy), str(idle), group_key, tmp, summary_db, ambiguous
        )
    finally:
        for p in started:
            p.stop()


def test_slurm_job_text_report_like_jobstats(pipeline: Pipeline) -> None:
    done = pipeline.report("--job", pipeline.busy_job, "--cluster", pipeline.cluster)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    (pipeline.tmp / "slurm-report.txt").write_text(text)
    assert "Slurm Job Statistics" in text
    for fact in ("User: root", "Account: root", "Partition: debug", "State: COMPLETED", "Cores: 1"):
        assert fact in text, text
    assert f"Job: {pipeline.busy_job} (report-busy)" in text
    assert "CPU utilization" in text and "CPU memory usage" in text
    assert "of 200.0 MiB" in text  # the request, from the Slurm job record
    assert "reading" not in done.stderr  # no progress without a terminal or -v


def test_slurm_job_json_numbers_come_from_the_series(pipeline: Pipeline) -> None:
    report = pipeline.json("--job", pipeline.busy_job, "--cluster", pipeline.cluster)
    assert report["scheduler"] == "slurm" and report["from_summary"] is False
    assert report["mem_requested"] == 200 * 1024 * 1024
    # The CPU time the job really got (the machine is shared), within what 1-s sampling can tell.
    got = float((pipeline.tmp / "busy.cpu").read_text())
    assert 0.5 * got <= float(report["cpu_seconds"]) <= 1.5 * got + 1.0, (report["cpu_seconds"], got)  # type: ignore[arg-type]
    assert report["cpu_eff"] == pytest.approx(100.0 * report["cpu_seconds"] / report["elapsed"])  # type: ignore[operator]
    # The 64 MiB the job holds, plus what the job's other processes (slurmstepd, srun, the shell) hold.
    assert 64 * 2**20 < int(report["mem_peak"]) < int(report["per_node"][0]["mem_total"]), report["mem_peak"]  # type: ignore[index, call-overload]
    assert int(report["samples"]) >= 3  # type: ignore[call-overload]
    metrics = {t["metric"] for t in report["series"]}  # type: ignore[attr-defined]
    assert metrics == {"cpu", "mem"}
    assert [n["hostname"] for n in report["per_node"]] == report["nodes"]  # type: ignore[attr-defined]


def test_summary_of_consume_jobs_wins_and_its_flags_read_in_plain_words(pipeline: Pipeline) -> None:
    args = ("--job", pipeline.idle_job, "--cluster", pipeline.cluster)
    done = pipeline.summarised(*args)
    assert done.returncode == 0, done.stderr
    (pipeline.tmp / "summarised-report.txt").write_text(done.stdout)
    # `sleep 4` with 400M: little CPU, a few MiB of the request.
    assert "CPU cores were under-used" in done.stdout
    assert "less than 25 % of the memory it requested" in done.stdout
    assert "No job summary" not in done.stdout
    report = json.loads(pipeline.summarised(*args, "--format", "json").stdout)
    stored = pipeline.influx.points(
        f'SELECT * FROM "job_summary" WHERE "job" = \'{pipeline.idle_job}\'', pipeline.summary_db
    )[-1]
    assert report["from_summary"] is True
    assert [f["name"] for f in report["flags"]] == str(stored["flags"]).split(",")
    assert {"cpu_underused", "mem_overrequested"} <= {f["name"] for f in report["flags"]}
    for name in ("cpu_eff", "cpu_seconds", "mem_peak", "mem_requested", "samples"):
        assert report[name] == stored[name], name
    assert report["state"] == str(stored["state"]).upper()
    # The busy job's summary: its CPU seconds are the job's, as the series tell them too.
    busy = json.loads(pipeline.summarised("--job", pipeline.busy_job, "--format", "json").stdout)
    raw = pipeline.json("--job", pipeline.busy_job, "--cluster", pipeline.cluster)
    assert busy["from_summary"] is True and raw["from_summary"] is False
    got = float((pipeline.tmp / "busy.cpu").read_text())
    assert 0.5 * got <= busy["cpu_seconds"] <= 1.5 * got + 1.0, (busy["cpu_seconds"], got)


def test_process_group_by_bare_number(pipeline: Pipeline) -> None:
    pgid = pipeline.group_job.split("@")[0]
    report = pipeline.json("--job", pgid)  # no cluster, no epoch: one job matches
    assert report["job"] == pipeline.group_job and report["cluster"] == pipeline.cluster
    assert report["scheduler"] == "process" and report["user"] == "root"
    assert report["state"] == "ENDED"
    assert 64 * 2**20 < int(report["mem_peak"]) < 128 * 2**20, report["mem_peak"]  # type: ignore[call-overload]
    got = float((pipeline.tmp / "group.cpu").read_text())
    assert 0.5 * got <= float(report["cpu_seconds"]) <= 1.5 * got + 1.0, (report["cpu_seconds"], got)  # type: ignore[arg-type]
    cpu = [t for t in report["series"] if t["metric"] == "cpu"]  # type: ignore[attr-defined]
    assert len(cpu) == 1 and len(cpu[0]["values"]) >= 3 and max(cpu[0]["values"]) > 0
    text = pipeline.report("--job", pipeline.group_job).stdout
    assert "Process Group Statistics" in text and "Job Statistics" not in text and "of the node's" in text
    # No allocation to divide by: the cores it kept busy, about one (the shared machine gives less).
    busy = float(report["cores_busy"])  # type: ignore[arg-type]
    assert 0.1 < busy <= 1.2 and f"{busy:.1f} cores busy on average" in text, text


def test_ocs_job_without_samples_says_so(pipeline: Pipeline) -> None:
    done = pipeline.report("--job", OCS_JOB, "--cluster", pipeline.cluster)
    assert done.returncode == 0, done.stderr
    assert "OCS Job Statistics" in done.stdout
    for fact in ("User: root", "Account: sge", "Partition: all.q", "State: COMPLETED", "Nodes: 1 (master)"):
        assert fact in done.stdout, done.stdout
    assert "No samples were recorded for this job" in done.stdout


@pytest.mark.parametrize("summary", [False, True], ids=["events", "summary-in-one"])
def test_a_number_in_two_clusters_is_ambiguous(pipeline: Pipeline, summary: bool) -> None:
    """Known by its events in both clusters, or by its summary in one (before issue 34's review, the
    summary's cluster won without asking the events of the other)."""
    done = pipeline.ambiguous_with_summary if summary else pipeline.report("--job", OCS_JOB)
    assert done is not None
    assert done.returncode == 1, done.stdout
    assert "ambiguous" in done.stderr and "Traceback" not in done.stderr
    assert f"--cluster {pipeline.cluster} --job {OCS_JOB}" in done.stderr
    assert f"--cluster {pipeline.other_cluster} --job {OCS_JOB}" in done.stderr
    assert done.stdout == ""


def test_no_data_and_no_influxdb_are_one_line_and_exit_1(pipeline: Pipeline) -> None:
    missing = pipeline.report("--job", "987654321", "--cluster", pipeline.cluster)
    assert missing.returncode == 1 and missing.stdout == ""
    assert "no data for job '987654321'" in missing.stderr and "Traceback" not in missing.stderr
    away = pipeline.report("--job", "1", "--influx-url", f"http://127.0.0.1:{free_port()}")
    assert away.returncode == 1 and "is not reachable" in away.stderr and "Traceback" not in away.stderr
    no_db = pipeline.report("--job", "1", "--db", "no_such_db_here")
    assert no_db.returncode == 1 and "database not found" in no_db.stderr


def test_settings_from_the_environment_and_progress_with_v(pipeline: Pipeline) -> None:
    argv = [
        sys.executable,
        "-m",
        "hpcbus",
        "-v",
        "report",
        "--job",
        pipeline.busy_job,
        "--cluster",
        pipeline.cluster,
    ]
    env = {**os.environ, "INFLUX_URL": pipeline.influx.url, "INFLUX_DB": pipeline.db}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "hpcbus report: reading the job's series" in done.stderr
    assert "Slurm Job Statistics" in done.stdout


def _dom(path: Path) -> str:
    """The DOM after the page's scripts ran, as headless Chromium serialises it."""
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
        "--dump-dom", path.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("which", ["busy_job", "group_job"])
def test_html_plots_are_drawn_in_chromium(pipeline: Pipeline, which: str) -> None:
    job = getattr(pipeline, which)
    out = pipeline.tmp / f"{which}.html"
    done = pipeline.report(
        "--job", job, "--cluster", pipeline.cluster, "--format", "html", "--output", str(out)
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "<script" not in page and len(page) < 100_000  # plain inline SVG, no 4.8 MB of plotly.js
    dom = _dom(out)
    # One SVG per resource, with the series' names in the legend.
    assert dom.count('<svg class="plot"') >= 2, dom[:2000]
    host = json.loads(
        pipeline.report("--job", job, "--cluster", pipeline.cluster, "--format", "json").stdout
    )["nodes"][0]
    for name in (f"cpu {host}", f"memory {host}"):
        assert f">{name}<" in dom, name
    # The lines have points: a drawn path, not an empty one.
    assert '<path class="series"' in dom and 'd="M' in dom
    assert "cores busy" in dom and "time (UTC)" in dom


SONAR_GPU = CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
"""Two real Sonar samples of a node with 4 cards, 71 s apart; job 2703861 (epoch 168341194) uses them."""
GPU_JOB = "2703861@168341194"


@pytest.fixture(scope="module")
def gpu_pipeline(
    nats_server_session: NatsServer, influxdb_session: InfluxDB, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """Real Sonar GPU samples through `consume sonar --to lp` and `consume influx` (no GPU on this machine)."""
    nats = nats_server_session.ensure_running()
    influx = influxdb_session.ensure_running()
    tmp = tmp_path_factory.mktemp("report-gpu")
    cluster = f"g{uuid.uuid4().hex[:8]}.example.org"
    db = f"report_{uuid.uuid4().hex[:8]}"
    bus = ["--nats", nats.url, "--cluster", cluster]
    started = [
        influx_sink(bus, influx, db, tmp / "influx.log").start(),
        Worker(["consume", "sonar", *bus, "--to", "lp"], tmp / "sonar.log").start(),
    ]
    try:
        pub = [sys.executable, "-m", "hpcbus", "pub", *bus, "--jetstream", "--send-on", "newline"]
        with SONAR_GPU.open("rb") as envelopes:
            subprocess.run([*pub, subjects.sonar(cluster, "sample")], stdin=envelopes, check=True, timeout=60)

        def stored() -> bool:
            try:
                return len(influx.points('SELECT * FROM "process_acc_utilization"', db)) > 0
            except Exception:
                return False

        wait_for(stored, 60, lambda: "\n".join(p.log() for p in started))
        wait_for(
            functools.partial(settled, nats.url, cluster, "hpcbus-influx", "hpcbus-sonar-to-lp"),
            60,
            "settled",
        )
        yield Pipeline(influx, db, cluster, cluster, "", "", GPU_JOB, tmp)
    finally:
        for p in started:
            p.stop()


def test_gpu_job_per_card_from_sonar_samples(gpu_pipeline: Pipeline) -> None:
    report = gpu_pipeline.json("--job", GPU_JOB)
    assert report["scheduler"] == "process" and report["user"] == "u_10005"
    cards = [g for n in report["per_node"] for g in n["gpus"]]  # type: ignore[attr-defined]
    assert report["gpus"] == len(cards) >= 1
    assert all(g["hostname"] == "n1.cluster1.uio.no" for g in cards)
    # The first card of the corpus' first sample: this job's process used 59 % and 8838 MiB of it.
    first = next(g for g in cards if g["card"] == "GPU-85e5c974-926f-e54f-9828-ad1d8680469a")
    assert first["mem_peak"] >= 8838 * 2**20 and first["util"] > 0
    assert {t["metric"] for t in report["series"]} >= {"cpu", "mem", "gpu_util", "gpu_mem"}  # type: ignore[attr-defined]
    text = gpu_pipeline.report("--job", GPU_JOB).stdout
    (gpu_pipeline.tmp / "gpu-report.txt").write_text(text)
    assert (
        "GPU utilization" in text
        and "GPU memory usage" in text
        and "GPU GPU-85e5c974-926f-e54f-9828-ad1d8680469a" in text
    )
    out = gpu_pipeline.tmp / "gpu.html"
    assert gpu_pipeline.report("--job", GPU_JOB, "--format", "html", "--output", str(out)).returncode == 0
    dom = _dom(out)
    assert ">gpu n1.cluster1.uio.no GPU-85e5c974-926f-e54f-9828-ad1d8680469a<" in dom
    assert "utilisation (%)" in dom and "GPU memory (GiB)" in dom
