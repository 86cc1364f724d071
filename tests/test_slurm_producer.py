"""`hpcbus produce slurm` against the REAL single-node Slurm of tests/services (munge, MariaDB, slurmdbd,
slurmctld, slurmd) and a real nats-server.

One module-scoped scenario submits the jobs once and polls at two moments, the tests then look at what each
poll published:

* poll A: a running job (L, later cancelled), a job that will hit its time limit (T), a held het job (H);
  poll A2 right after it must publish nothing new about them;
* then L is cancelled, an array job (`--array=1-3`), a two-step job (`srun true; srun sleep 1`), a failing
  job (`exit 3`) run, H is cancelled, and T runs into its one-minute limit; poll B sees all of that.

Slurm's time limit is at least one minute and slurmctld checks limits every ~30 s, so T ends 60-90 s after it
starts; everything else runs beside it, and the module takes ~90-100 s, almost all of it waiting for T.

Het jobs: 22.05 accepts them (`sbatch ... : ...`), but on a single node a het job never starts: the backfill
scheduler (the only one that schedules het jobs) reserves the *whole node* for the first component's planned
run and so plans the second component after it, while all components must start together (seen in
slurmctld's `DebugFlags=Backfill,BackfillMap` log: "JobId=9+0 to start at T0 ... JobId=9+1 to start at T0+2
min", forever). A pending het job would also block the queue. So H is submitted `--hold`, which is what can be
tested: sacct never lists a held job (it is never eligible, so it is in no sacct window), squeue does, and the
records must carry `het_job_id`/`het_job_offset`; once cancelled, sacct lists it, without start/stop events.

Jobs use `--mem=50M`: without it a job asks for the node's whole memory and the jobs could not run side by
side. The session's Slurm is shared with other test modules: everything is filtered by our job ids.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from hpcbus import cli
from hpcbus.producers.slurm.poller import Poll, Poller
from hpcbus.producers.slurm.producer import Outgoing, SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from hpcbus.schemas.sonar.types import JobsEnvelope, SlurmJob
from hpcbus.schemas.sonar.validate import decode_envelope
from hpcbus.schemas.translate import msg_id
from tests.consumer_helpers import ProducerProcess, wait_for
from tests.services import NatsServer, SlurmCluster, free_port
from tests.test_slurm_producer_state import decode

pytestmark = pytest.mark.services

CLUSTER = "hpcbustest"
COMMAND = ("produce", "slurm")


# --- helpers ----------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One poll: the Poll (what Slurm said), the Outgoing (what was published) and that decoded."""

    poll: Poll
    out: Outgoing
    decoded: dict[str, list[Any]]

    def records(self, *job_ids: int) -> list[SlurmJob]:
        return [r for r in self.decoded["records"] if r.job_id in job_ids]

    def record(self, job_id: int, step: str = "") -> SlurmJob:
        found = [r for r in self.records(job_id) if r.job_step == step]
        assert len(found) == 1, (job_id, step, found)
        return found[0]

    def events(self, function: str, *job_ids: int) -> list[dict[str, Any]]:
        return [e for e in self.decoded[function] if e["jobId"] in job_ids]


class Run:
    """Poller + producer + state against the fixture's Slurm, built the way the service builds them."""

    def __init__(self, slurm: SlurmCluster, state: SlurmState | None = None) -> None:
        self.settings = SlurmSettings()
        self.state = state if state is not None else SlurmState(CLUSTER)
        self.producer = SlurmProducer(self.settings, CLUSTER, self.state)
        self.poller = Poller(self.settings, CLUSTER, UTC, "UTC0", env=slurm.env())

    def poll(self) -> Seen:
        now = datetime.now(UTC)
        poll = asyncio.run(self.poller.poll(self.producer.window_start(now), now))
        assert poll.failures == [] and poll.problems == []
        out = self.producer.build(poll)
        assert out.problems == []
        return Seen(poll, out, decode(out, CLUSTER))


def states(slurm: SlurmCluster, job: int) -> dict[int, str]:
    """JobIDRaw -> state word of every allocation row of `job` (array tasks and het components too)."""
    rows = slurm.sacct("-X", "-j", str(job), fields=("JobID", "JobIDRaw", "State"))
    return {int(r["JobIDRaw"]): r["State"].split(" ")[0] for r in rows if r.get("JobIDRaw", "").isdigit()}


def steps_ended(slurm: SlurmCluster, jobs: list[int]) -> bool:
    """Every row (allocations and steps) of `jobs` is in an end state with an end time in sacct."""
    rows = slurm.sacct("-j", ",".join(map(str, jobs)), fields=("JobID", "State", "End"))
    return bool(rows) and all(
        r["State"].split(" ")[0] in TERMINAL_STATES and r["End"] not in ("", "Unknown") for r in rows
    )


def settled(slurm: SlurmCluster, jobs: list[int], quiet: float = 3.0) -> Callable[[], bool]:
    """A check: every row of `jobs` ended (`steps_ended`) and every field the producer reads
    (`SACCT_FIELDS`) unchanged for `quiet` seconds. slurmdbd takes a step's usage after its end: a timed-out
    job's batch step was read CANCELLED with its end time, then changed (its usage arrived), and a later poll
    rightly sent the change where the tests expect nothing new."""
    seen: list[tuple[float, list[dict[str, str]]]] = []

    def check() -> bool:
        if not steps_ended(slurm, jobs):
            seen.clear()
            return False
        rows = slurm.sacct("-j", ",".join(map(str, jobs)), fields=SACCT_FIELDS)
        now = time.monotonic()
        if not seen or seen[0][1] != rows:
            seen[:] = [(now, rows)]
            return False
        return now - seen[0][0] >= quiet

    return check


def wait_slurm(what: str, check: Callable[[], Any], timeout: float, slurm: SlurmCluster) -> Any:
    return wait_for(check, timeout, lambda: f"{what}\n{slurm.log_tail(10)}", interval=0.25)


def wait_states(
    slurm: SlurmCluster, job: int, want: set[str], count: int = 1, timeout: float = 60
) -> dict[int, str]:
    def check() -> dict[int, str] | None:
        got = states(slurm, job)
        return got if len(got) == count and set(got.values()) <= want else None

    return wait_slurm(f"job {job} in {sorted(want)} ({count} rows)", check, timeout, slurm)


def queued(slurm: SlurmCluster) -> set[int]:
    return {int(j["job_id"]) for j in slurm.squeue_json().get("jobs", [])}


# --- the scenario -----------------------------------------------------------------------------------------


@dataclass
class Scenario:
    slurm: SlurmCluster
    running: int = 0
    """L: running at poll A, cancelled before poll B."""
    timeout: int = 0
    """T: `--time=1`, `sleep 300`."""
    het: list[int] = field(default_factory=list)
    """H's component job ids (held, cancelled before poll B)."""
    array: int = 0
    array_tasks: dict[int, int] = field(default_factory=dict)
    """Array task id -> the task's own job id."""
    steps: int = 0
    failing: int = 0
    run: Run | None = None
    a: Seen | None = None
    a2: Seen | None = None
    b: Seen | None = None
    seconds: float = 0.0

    @property
    def all_ids(self) -> list[int]:
        return [self.running, self.timeout, *self.het, *self.array_tasks.values(), self.steps, self.failing]


@pytest.fixture(scope="module")
def scenario(slurm_session: SlurmCluster) -> Iterator[Scenario]:
    slurm = slurm_session.ensure_running()
    started = time.monotonic()
    sc = Scenario(slurm)
    sc.run = Run(slurm)
    sc.running = slurm.sbatch(None, "--mem=50M", "-J", "hb-cancel", wrap="sleep 300")
    wait_states(slurm, sc.running, {"RUNNING"})
    sc.timeout = slurm.sbatch(None, "--time=1", "--mem=50M", "-J", "hb-timeout", wrap="sleep 300")
    # running before poll A: a job the scheduler starts between polls A and A2 changed, and A2 rightly sends
    # it (issue 33 item 8: seen under load on a clean clone)
    wait_states(slurm, sc.timeout, {"RUNNING"})
    leader = slurm.sbatch(None, "--hold", "--mem=50M", "-J", "hb-het", ":", "--mem=50M", wrap="true")
    sc.het = [leader, leader + 1]
    wait_slurm("the het job in squeue", lambda: set(sc.het) <= queued(slurm), 30, slurm)
    sc.a = sc.run.poll()
    sc.a2 = sc.run.poll()

    slurm.run("scancel", str(sc.running))
    wait_states(slurm, sc.running, {"CANCELLED"})
    sc.array = slurm.sbatch(None, "--array=1-3", "--mem=50M", "-J", "hb-array", wrap="sleep 1")
    sc.steps = slurm.sbatch(None, "--mem=50M", "-J", "hb-steps", wrap="srun true; srun sleep 1")
    sc.failing = slurm.sbatch(None, "--mem=50M", "-J", "hb-fail", wrap="exit 3")
    slurm.run("scancel", str(leader))
    wait_states(slurm, leader, {"CANCELLED"}, count=2)
    wait_states(slurm, sc.steps, {"COMPLETED"})
    wait_states(slurm, sc.failing, {"FAILED"})
    tasks = wait_states(slurm, sc.array, {"COMPLETED"}, count=3)
    rows = slurm.sacct("-X", "-j", str(sc.array), fields=("JobID", "JobIDRaw"))
    sc.array_tasks = {int(r["JobID"].split("_")[1]): int(r["JobIDRaw"]) for r in rows}
    assert sorted(sc.array_tasks.values()) == sorted(tasks)
    wait_states(slurm, sc.timeout, {"TIMEOUT"}, timeout=180)
    # slurmdbd gets a step's end after its job's (the batch step of a timed-out job ends as CANCELLED a
    # moment later): poll B must see the final records, or a later poll rightly sends the change.
    wait_slurm("every step of the scenario ended and settled", settled(slurm, sc.all_ids), 90, slurm)
    sc.b = sc.run.poll()
    sc.seconds = time.monotonic() - started
    print(f"\nslurm producer scenario: {sc.seconds:.0f} s")
    yield sc


# --- what the polls published -----------------------------------------------------------------------------


def test_running_job_gets_start_job_and_a_whole_record(scenario: Scenario) -> None:
    a = scenario.a
    assert a is not None
    node = scenario.slurm.node_name
    (start,) = a.events("start_job", scenario.running)
    assert (
        start["cluster"] == CLUSTER and start["numNodes"] == 1 and start["resources"] == [{"hostname": node}]
    )
    assert (
        start["user"] == "root"
        and start["partition"] == "debug"
        and start["metaData"]["jobName"] == "hb-cancel"
    )
    assert a.events("stop_job", scenario.running) == []
    record = a.record(scenario.running)
    assert record.job_state == "RUNNING" and record.nodes == [node] and record.user_name == "root"
    assert record.start_time and not record.end_time
    # UNLIMITED (Sonar's ExtendedUint 1), or a year of minutes + 2: Slurm records an infinite limit as
    # YEAR_MINUTES when its backfill scheduler, not the main one, started the job (seen once in a clean run)
    assert record.time_limit in (1, 365 * 24 * 60 * 60 + 2), record.time_limit
    assert a.record(scenario.running, "batch").job_state == "RUNNING"


def test_second_poll_sends_nothing_that_did_not_change(scenario: Scenario) -> None:
    a2 = scenario.a2
    assert a2 is not None
    mine = [scenario.running, scenario.timeout, *scenario.het]
    assert a2.records(*mine) == []
    assert a2.events("start_job", *mine) == [] and a2.events("stop_job", *mine) == []


def test_cancelled_job_changed_fields_only_and_stop_job(scenario: Scenario) -> None:
    b = scenario.b
    assert b is not None
    (stop,) = b.events("stop_job", scenario.running)
    assert stop["jobState"] == "cancelled" and stop["stopTime"] >= stop["startTime"] > 0
    assert b.events("start_job", scenario.running) == []  # sent at poll A, not again
    record = b.record(scenario.running)
    assert record.job_state == "CANCELLED" and record.end_time
    assert record.job_name == "hb-cancel" and record.submit_time  # always there
    # Unchanged since poll A, so not sent again:
    assert (
        record.nodes == [] and record.user_name == "" and record.start_time == "" and record.partition == ""
    )


def test_array_job_tasks(scenario: Scenario) -> None:
    b = scenario.b
    assert b is not None
    tasks = scenario.array_tasks
    assert sorted(tasks) == [1, 2, 3]
    for task, job_id in tasks.items():
        record = b.record(job_id)
        assert (record.array_job_id, record.array_task_id) == (scenario.array, task)
        assert record.job_state == "COMPLETED" and record.job_name == "hb-array"
        assert b.record(job_id, "batch").array_job_id == scenario.array
    starts = b.events("start_job", *tasks.values())
    assert sorted(e["jobId"] for e in starts) == sorted(tasks.values())
    assert {e["arrayJobId"] for e in starts} == {scenario.array}
    assert {e["jobState"] for e in b.events("stop_job", *tasks.values())} == {"completed"}
    assert len(b.events("stop_job", *tasks.values())) == 3


def test_multi_step_job(scenario: Scenario) -> None:
    b = scenario.b
    assert b is not None
    records = b.records(scenario.steps)
    assert sorted(r.job_step for r in records) == ["", "0", "1", "batch"]
    assert {r.job_state for r in records} == {"COMPLETED"}
    assert (
        b.record(scenario.steps, "0").job_name == "true" and b.record(scenario.steps, "1").job_name == "sleep"
    )
    ((start,), (stop,)) = b.events("start_job", scenario.steps), b.events("stop_job", scenario.steps)
    assert start["numNodes"] == 1 and stop["jobState"] == "completed"


def test_failing_job(scenario: Scenario) -> None:
    b = scenario.b
    assert b is not None
    record = b.record(scenario.failing)
    assert record.job_state == "FAILED" and record.exit_code == 3
    assert b.record(scenario.failing, "batch").exit_code == 3
    (stop,) = b.events("stop_job", scenario.failing)
    assert stop["jobState"] == "failed"
    assert len(b.events("start_job", scenario.failing)) == 1  # first seen ended: start, then stop


def test_timeout_job(scenario: Scenario) -> None:
    a, b = scenario.a, scenario.b
    assert a is not None and b is not None
    record = b.record(scenario.timeout)
    assert record.job_state == "TIMEOUT"
    (stop,) = b.events("stop_job", scenario.timeout)
    assert stop["jobState"] == "timeout" and 60 <= stop["stopTime"] - stop["startTime"] <= 150
    starts = a.events("start_job", scenario.timeout) + b.events("start_job", scenario.timeout)
    assert len(starts) == 1 and starts[0]["walltime"] == 60


def test_held_het_job_from_squeue_then_cancelled_from_sacct(scenario: Scenario) -> None:
    a, b = scenario.a, scenario.b
    assert a is not None and b is not None
    leader, second = scenario.het
    assert leader not in {r.job_id for r in a.poll.rows}  # sacct never lists a held job
    first, other = a.record(leader), a.record(second)
    assert (first.job_state, first.het_job_id, first.het_job_offset) == ("PENDING", leader, 0)
    assert (other.job_state, other.het_job_id, other.het_job_offset) == ("PENDING", leader, 1)
    for job_id in scenario.het:
        assert b.record(job_id).job_state == "CANCELLED"
    assert b.events("start_job", *scenario.het) == [] and b.events("stop_job", *scenario.het) == []


def test_cluster_envelope_and_nodestate(scenario: Scenario) -> None:
    a, a2 = scenario.a, scenario.a2
    assert a is not None and a2 is not None
    node = scenario.slurm.node_name
    (envelope,) = a.decoded["cluster"]
    attributes = envelope["data"]["attributes"]
    assert attributes["cluster"] == CLUSTER and attributes["slurm"] is True
    assert {"name": "debug", "nodes": [node]} in attributes["partitions"]
    (group,) = [g for g in attributes["nodes"] if node in g["names"]]
    assert group["states"] and all(s == s.upper() for s in group["states"])
    (nodestate,) = a.decoded["nodestate"]
    assert nodestate["nodes"] == [{"hostname": node, "states": [s.lower() for s in group["states"]]}]
    assert a2.poll.cluster is not None and a.poll.cluster is not None
    if (a2.poll.cluster.partitions, a2.poll.cluster.nodes) == (
        a.poll.cluster.partitions,
        a.poll.cluster.nodes,
    ):
        assert a2.out.cluster == "unchanged" and a2.decoded["cluster"] == []


def test_restart_with_the_state_file_resends_nothing(scenario: Scenario, tmp_path: Path) -> None:
    assert scenario.run is not None
    path = tmp_path / "slurm.state"
    scenario.run.state.save(path)
    again = Run(scenario.slurm, SlurmState.load(path, CLUSTER)).poll()
    assert again.records(*scenario.all_ids) == []
    assert (
        again.events("start_job", *scenario.all_ids) == []
        and again.events("stop_job", *scenario.all_ids) == []
    )


# --- the CLI: --once ---------------------------------------------------------------------------------------


def once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], slurm_conf: str, *args: str
) -> tuple[int, list[tuple[str, str]], str]:
    monkeypatch.setitem(cli.COMMANDS, COMMAND, "hpcbus.producers.slurm.command")
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    rc = cli.main([*COMMAND, "--cluster", CLUSTER, "--once", *args])
    captured = capsys.readouterr()
    lines = [tuple(line.split("\t", 1)) for line in captured.out.splitlines()]
    assert all(len(pair) == 2 for pair in lines)
    return rc, lines, captured.err  # type: ignore[return-value]


def parse_once(lines: list[tuple[str, str]]) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {"records": [], "start_job": [], "stop_job": [], "subjects": []}
    for subject, text in lines:
        parsed = parse_payload(text, now=0, place=subject)
        assert not parsed.problems, parsed.problems
        (line,) = parsed.lines
        seen["subjects"].append(subject)
        if subject == f"{CLUSTER}.events.slurm":
            env = decode_envelope(str(line.payload))
            assert isinstance(env, JobsEnvelope) and env.data is not None
            seen["records"].extend(env.data.attributes.slurm_jobs)
        elif subject == f"{CLUSTER}.events.job":
            seen[line.tags["function"]].append(json.loads(str(line.payload)))
    return seen


def test_once_prints_subject_tab_line(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, err = once(monkeypatch, capsys, str(scenario.slurm.slurm_conf), "--tz", "UTC")
    assert rc == 0, err
    seen = parse_once(lines)
    assert set(seen["subjects"]) >= {
        f"{CLUSTER}.events.{k}" for k in ("slurm", "job", "cluster", "nodestate")
    }
    ids = {r.job_id for r in seen["records"]}
    assert set(scenario.all_ids) <= ids  # no state file: everything in the last hour
    assert {e["jobId"] for e in seen["stop_job"]} >= {
        *scenario.array_tasks.values(),
        scenario.failing,
        scenario.timeout,
    }
    assert "poll: " in err and "records sent" in err


def test_once_reads_the_state_file_but_never_writes_it(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scenario.run is not None
    path = tmp_path / "slurm.state"
    scenario.run.state.save(path)
    before = path.read_bytes()
    rc, lines, err = once(
        monkeypatch, capsys, str(scenario.slurm.slurm_conf), "--tz", "UTC", "--state-file", str(path)
    )
    assert rc == 0, err
    seen = parse_once(lines)
    assert [r for r in seen["records"] if r.job_id in scenario.all_ids] == []
    assert [e for e in seen["start_job"] + seen["stop_job"] if e["jobId"] in scenario.all_ids] == []
    assert path.read_bytes() == before


def test_once_tz_changes_the_spelling_not_the_instant(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = str(scenario.slurm.slurm_conf)
    utc = {
        (r.job_id, r.job_step): r
        for r in parse_once(once(monkeypatch, capsys, conf, "--tz", "UTC")[1])["records"]
    }
    oslo = {
        (r.job_id, r.job_step): r
        for r in parse_once(once(monkeypatch, capsys, conf, "--tz", "Europe/Oslo")[1])["records"]
    }
    record_utc, record_oslo = utc[(scenario.failing, "")], oslo[(scenario.failing, "")]
    for name in ("submit_time", "start_time", "end_time"):
        t_utc = datetime.fromisoformat(getattr(record_utc, name))
        t_oslo = datetime.fromisoformat(getattr(record_oslo, name))
        assert t_utc == t_oslo and t_utc.utcoffset() is not None and not t_utc.utcoffset()
        assert t_oslo.utcoffset() == t_oslo.astimezone(ZoneInfo("Europe/Oslo")).utcoffset()


def test_once_names_every_node_in_the_hostname_form(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hostname_form = "domain"` (docs/mapping.md section 3): the node is `<node>.site.org` in the job
    records, the start_jobs' `resources` (on `<cluster>.events.job` and cc-backend's job subject), the
    cluster envelope and the node states (on `<cluster>.events.nodestate` and cc-backend's subject)."""
    node = scenario.slurm.node_name
    fqdn = f"{node}.site.org"
    rc, lines, err = once(
        monkeypatch,
        capsys,
        str(scenario.slurm.slurm_conf),
        "--tz",
        "UTC",
        "--hostname-form",
        "domain",
        "--hostname-domain",
        "site.org",
        "--cc-job-subject",
        "cc.job",
        "--cc-node-state-subject",
        "cc.node",
    )
    assert rc == 0, err
    seen = parse_once([(s, t) for s, t in lines if not s.startswith("cc.")])
    running = [r for r in seen["records"] if r.job_id == scenario.running and not r.job_step]
    assert running and {n for r in running for n in r.nodes} == {fqdn}
    assert all(n == fqdn for r in seen["records"] if r.job_id in scenario.all_ids for n in r.nodes)
    events: dict[str, list[Any]] = {}
    for subject, text in lines:
        (line,) = parse_payload(text, now=0, place=subject).lines
        events.setdefault(subject, []).append(json.loads(str(line.payload)))
    for subject in (f"{CLUSTER}.events.job", "cc.job"):
        starts = [e for e in events[subject] if "resources" in e and e["jobId"] in scenario.all_ids]
        assert starts and all([r["hostname"] for r in e["resources"]] == [fqdn] for e in starts), subject
    (cluster,) = events[f"{CLUSTER}.events.cluster"]
    attributes = cluster["data"]["attributes"]
    assert {"name": scenario.slurm.partition, "nodes": [fqdn]} in attributes["partitions"]
    assert all(names == [fqdn] for names in (g["names"] for g in attributes["nodes"]))
    for subject in (f"{CLUSTER}.events.nodestate", "cc.node"):
        (nodestate,) = events[subject]
        assert [n["hostname"] for n in nodestate["nodes"]] == [fqdn], subject


def test_once_with_slurmdbd_down_reports_sacct_and_publishes_the_rest(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same cluster seen through a slurm.conf whose slurmdbd port has nobody listening: sacct fails at
    once (connection refused), squeue and sinfo (slurmctld) still answer and are published."""
    text = slurm.slurm_conf.read_text()
    conf = tmp_path / "slurm.conf"
    conf.write_text(re.sub(r"(?m)^AccountingStoragePort=.*$", f"AccountingStoragePort={free_port()}", text))
    for name in ("acct_gather.conf",):  # read from the directory of SLURM_CONF when configured
        if (slurm.slurm_conf.parent / name).exists():
            shutil.copy(slurm.slurm_conf.parent / name, tmp_path / name)
    held = slurm.sbatch(None, "--hold", "--mem=50M", "-J", "hb-dbd-down", wrap="true")
    try:
        rc, lines, err = once(monkeypatch, capsys, str(conf), "--tz", "UTC")
    finally:
        slurm.run("scancel", str(held))
    assert rc == 1
    failures = [line for line in err.splitlines() if " ERROR hpcbus.slurm: " in line]
    assert len(failures) == 1, err  # one line: the command and stderr's first line
    assert failures[0].split(" ERROR hpcbus.slurm: ")[1].startswith("sacct -aP -s CANCELLED,")
    reason = failures[0].split(": exit 1: ", 1)[1]  # stderr's first line names slurmdbd's address
    assert reason.startswith("sacct: error: ") and reason.endswith("Connection refused"), reason
    seen = parse_once(lines)
    assert [(r.job_id, r.job_state, r.job_name) for r in seen["records"] if r.job_id == held] == [
        (held, "PENDING", "hb-dbd-down")
    ]  # from squeue
    assert {f"{CLUSTER}.events.cluster", f"{CLUSTER}.events.nodestate"} <= set(seen["subjects"])  # from sinfo


# --- the service ------------------------------------------------------------------------------------------


def bus_view(messages: list[tuple[str, bytes, str]], cluster: str) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {
        "records": [],
        "start_job": [],
        "stop_job": [],
        "cluster": [],
        "nodestate": [],
    }
    for subject, payload, mid in messages:
        assert mid == msg_id(subject, payload)  # deterministic ids: JetStream can drop re-sent copies
        parsed = parse_payload(payload, now=0, place=subject)
        assert not parsed.problems, parsed.problems
        for line in parsed.lines:
            event = str(line.payload)
            kind = subject.rsplit(".", 1)[1]
            assert subject == f"{cluster}.events.{kind}"
            if kind == "slurm":
                env = decode_envelope(event)
                assert isinstance(env, JobsEnvelope) and env.data is not None
                seen["records"].extend(env.data.attributes.slurm_jobs)
            elif kind == "job":
                seen[line.tags["function"]].append(json.loads(event))
            else:
                seen[kind].append(json.loads(event))
    return seen


class SlurmService(ProducerProcess):
    """`hpcbus produce slurm` polling the fixture's Slurm every second, its state in `slurm.state`."""

    def __init__(self, tmp_path: Path, url: str, cluster: str, slurm: SlurmCluster) -> None:
        self.slurm = slurm
        self.state = tmp_path / "slurm.state"
        args = [*COMMAND, "--state-file", str(self.state), "--interval", "1", "--tz", "UTC"]
        args += ["--stream-max-bytes", str(64 << 20)]
        super().__init__(tmp_path, url, cluster, args, env=slurm.env())


@pytest.fixture
def service(tmp_path: Path, nats_server: NatsServer, slurm: SlurmCluster) -> Iterator[SlurmService]:
    svc = SlurmService(
        tmp_path, nats_server.url, f"slurmsvc{os.getpid()}x{time.monotonic_ns() % 10**6}", slurm
    )
    yield svc
    svc.kill()


def test_service_publishes_resumes_without_resending_and_stops_on_sigterm(
    scenario: Scenario, service: SlurmService
) -> None:
    ids = scenario.all_ids
    tasks = list(scenario.array_tasks.values())

    def everything(messages: list[tuple[str, bytes, str]]) -> bool:
        seen = bus_view(messages, service.cluster)
        return set(ids) <= {r.job_id for r in seen["records"]} and set(tasks) <= {
            e["jobId"] for e in seen["stop_job"]
        }

    service.start()
    service.wait("the scenario's jobs", everything)
    service.wait("the state file", lambda _: service.state.exists())
    assert service.stop() == 0
    assert "stopped cleanly" in service.log()
    first = service.messages()
    seen = bus_view(first, service.cluster)
    for job_id in ids:  # each step published once, each cc event once
        steps = [r.job_step for r in seen["records"] if r.job_id == job_id]
        assert len(steps) == len(set(steps)), (job_id, steps)
    stops = [e["jobId"] for e in seen["stop_job"] if e["jobId"] in ids]
    assert sorted(stops) == sorted(
        {*tasks, scenario.running, scenario.timeout, scenario.steps, scenario.failing}
    )
    assert len(seen["cluster"]) == 1 and len(seen["nodestate"]) == 1
    state = json.loads(service.state.read_text())
    assert state["cluster"] == service.cluster and state["window_end"] > 0

    service.start()
    new = scenario.slurm.sbatch(None, "--mem=50M", "-J", "hb-after-restart", wrap="sleep 1")
    later = service.wait(
        "the new job's stop_job",
        lambda m: new in {e["jobId"] for e in bus_view(m[len(first) :], service.cluster)["stop_job"]},
    )
    assert service.stop() == 0
    after = bus_view(later[len(first) :], service.cluster)
    assert [r for r in after["records"] if r.job_id in ids] == []  # nothing of before the restart again
    assert [e["jobId"] for e in after["start_job"] + after["stop_job"] if e["jobId"] in ids] == []
    assert {r.job_id for r in after["records"]} >= {new}
    assert [e["jobId"] for e in after["stop_job"] if e["jobId"] == new] == [new]


def test_sigterm_while_nats_is_unreachable_exits_0(slurm: SlurmCluster, tmp_path: Path) -> None:
    """connect() retries forever; a stop request must still end the process at once, cleanly."""
    svc = SlurmService(tmp_path, f"nats://127.0.0.1:{free_port()}", "slurmnobus", slurm)
    svc.start()
    try:
        assert svc.process is not None
        svc.process.wait_log(f"nats ({svc.url})", 30)  # a connection attempt failed: it is retrying
        assert svc.running()  # still trying to connect
        started = time.monotonic()
        assert svc.stop() == 0
        assert time.monotonic() - started < 5
    finally:
        svc.kill()
    assert "stopped before NATS was reached" in svc.log()
    assert not svc.state.exists()  # nothing was polled, nothing to save
