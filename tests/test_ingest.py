"""Forgery protection: a node's credentials cannot put data on the bus that claims another node.

The checks of `hpcbus consume ingest` on their own (subjects, lines, envelopes), then the whole path on a
nats-server that loads `hpcbus deploy nats-auth`'s authorization: n001 publishes, with its own seed, a
message holding its own line and one that claims `hostname=n002`; the worker forwards n001's line to
`<cluster>.metrics` (where a plain subscriber and InfluxDB get it) and refuses the other: reported on the log
subject with who and what, dead-lettered with the original, never in the telemetry stream nor InfluxDB."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from hpcbus.outlet import PROBLEMS_PER_MINUTE
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import event, format_line, parse_payload
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.nodejob import NodeJob, node_job_line
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.trust import Sender, check_envelope, check_lines, nodejob_host_problem, subject_problem
from hpcbus.streams import deadletter_stream, ingest_stream, telemetry_stream
from tests.consumer_helpers import Process, Worker, count_points, wait_for
from tests.node_fixtures import FIX, agent_messages
from tests.services import InfluxDB
from tests.test_nats_auth import Secured, secured  # noqa: F401  (the module's fixture)

NOW = int(time.time())
N001 = Sender.node("n001", "fox")


def lines_of(payload: bytes, category: str, detail: str = "") -> tuple[list[str], list[Problem], bool]:
    """`check_lines` of what n001 sends on fox's `category.detail`."""
    place = f"fox.ingest.n001.{category}" + (f".{detail}" if detail else "")
    return check_lines(payload, place, N001, category, detail, now=NOW, max_future=DEFAULT_MAX_FUTURE)


def test_ingest_subjects_read_from_the_right() -> None:
    assert (
        subjects.ingest("fox.educloud.no", "n001", "fox.educloud.no.metrics")
        == "fox.educloud.no.ingest.n001.metrics"
    )
    parsed = subjects.parse_ingest("cc.fox.educloud.no.ingest.n001.events.nodejob", "cc")
    assert parsed.host == "n001" and str(parsed.target) == "cc.fox.educloud.no.events.nodejob"
    for bad in ("fox.metrics", "fox.ingest.metrics", "fox.ingest.n001.control.get", "fox.ingest.n1.sonar.x"):
        with pytest.raises(subjects.SubjectError):
            subjects.parse_ingest(bad)
    with pytest.raises(subjects.SubjectError, match="host name"):
        subjects.ingest_node_wildcard("fox", "n001.fox.org")
    with pytest.raises(subjects.SubjectError, match="not a subject of cluster"):
        subjects.ingest("fox", "n001", "other.metrics")


def test_lines_must_name_the_credentials_host() -> None:
    payload = (
        f"mem_used,cluster=fox,hostname=n001,type=node value=1 {NOW}\n"
        f"mem_used,cluster=fox,hostname=n002,type=node value=2 {NOW}\n"
        f"mem_used,cluster=fox,host=n001,type=node value=3 {NOW}\n"  # cc-metric-store's tag name
        f"mem_used,cluster=bar,hostname=n001,type=node value=4 {NOW}\n"
        f'nodejob,cluster=fox event="{{}}" {NOW}\n'
        "garbage\n"
    ).encode()
    good, problems, reformed = lines_of(payload, "metrics")
    assert [g.split(" ")[1] for g in good] == ["value=1", "value=3.0"]  # as sent; host= rewritten
    assert reformed  # the host= line was formatted
    assert "hostname=n001" in good[1]  # host= read as hostname=
    reasons = [p.reason for p in problems]
    assert "claims hostname=n002 but was published with the credentials of n001" in reasons
    assert any("claims cluster=bar" in r for r in reasons)
    assert any("no hostname tag" in r for r in reasons)
    assert len(problems) == 4  # and the garbage line, with its line number
    assert any(p.line == 6 for p in problems)


def test_envelopes_must_name_the_credentials_host() -> None:
    own = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": {"node": "n001"}}}).encode()
    other = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": {"node": "n002"}}}).encode()
    errors = json.dumps({"meta": {}, "errors": [{"detail": "x", "node": "n002"}]}).encode()
    assert check_envelope(own, "s", N001) == []
    assert [p.path for p in check_envelope(other, "s", N001)] == ["data.attributes.node"]
    assert [p.path for p in check_envelope(errors, "s", N001)] == ["errors[0].node"]
    assert "not a Sonar envelope" in check_envelope(b"{", "s", N001)[0].reason


def test_envelopes_must_name_the_subjects_cluster() -> None:
    """The translation tags a sample's lines with its `cluster`: a node of fox must not write bar's series."""
    attributes = {"node": "n001", "cluster": "fox"}
    own = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": attributes}}).encode()
    attributes = {"node": "n001", "cluster": "bar"}
    other = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": attributes}}).encode()
    errors = json.dumps({"meta": {}, "errors": [{"detail": "x", "node": "n001", "cluster": "bar"}]}).encode()
    assert check_envelope(own, "s", N001) == []
    refused = check_envelope(other, "s", N001)
    assert [p.path for p in refused] == ["data.attributes.cluster"]
    assert "claims cluster=bar" in refused[0].reason and "fox" in refused[0].reason
    assert [p.path for p in check_envelope(errors, "s", N001)] == ["errors[0].cluster"]


@pytest.mark.services
def test_a_forged_line_is_refused_reported_and_never_stored(
    secured: Secured,  # noqa: F811
    influxdb: InfluxDB,
    tmp_path: Path,
    workers: list[Process],
) -> None:
    c, url = secured.cluster, secured.url
    db = f"ingest_{uuid.uuid4().hex[:8]}"
    bus = ["--nats", url, "--cluster", c]
    for name, argv in (
        ("worker-ingest", ["consume", "ingest", *bus]),
        ("worker-influx", ["consume", "influx", *bus, "--influx-url", influxdb.url, "--db", db]),
    ):
        w = Worker(argv, tmp_path / f"{name}.log", secured.env(name))
        workers.append(w)
        w.start(timeout=60)
    marker = uuid.uuid4().hex[:8]
    own = f"forgery_test,cluster={c},hostname=n001,type=node,run={marker} value=1.0 {NOW}"
    forged = f"forgery_test,cluster={c},hostname=n002,type=node,run={marker} value=2.0 {NOW}"

    async def publish_and_watch() -> tuple[list[bytes], list[Msg]]:
        seen: list[bytes] = []
        reader = await secured.connect("reader")
        node = await secured.connect("node-n001")
        try:

            async def on(msg: Msg) -> None:
                if marker.encode() in msg.data:
                    seen.append(msg.data)

            await reader.subscribe(subjects.metrics(c), cb=on)
            logs: list[Msg] = []

            async def on_log(msg: Msg) -> None:
                if b"n002" in msg.data:
                    logs.append(msg)

            await reader.subscribe(subjects.log(c, "hpcbus"), cb=on_log)
            await reader.flush()
            ack = await node.jetstream().publish(
                subjects.ingest(c, "n001", subjects.metrics(c)), f"{own}\n{forged}\n".encode(), timeout=10
            )
            assert ack.stream == ingest_stream(c).name
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not (seen and logs) and loop.time() < deadline:
                await asyncio.sleep(0.05)
            return seen, logs
        finally:
            await reader.close()
            await node.close()

    seen, logs = asyncio.run(publish_and_watch())
    # the plain ClusterCockpit subscriber gets n001's line only (in its canonical form: type-id added)
    assert len(seen) == 1 and seen[0].count(b"\n") == 1, seen
    assert b"hostname=n001" in seen[0] and b"value=1.0" in seen[0] and b"n002" not in seen[0]
    report = logs[0].data.decode()
    assert "loglevel=error" in report and "claims hostname=n002" in report and "credentials of n001" in report
    assert f"{c}.ingest.n001.metrics" in report  # where it came from

    where = f"WHERE run = '{marker}'"
    wait_for(lambda: count_points(influxdb, db, "forgery_test", where) == 1, 60, "n001's line in InfluxDB")

    async def stored() -> tuple[list[bytes], dict[str, str]]:
        nc = await secured.connect("admin")
        try:
            js = nc.jetstream()
            dead = await js.get_last_msg(deadletter_stream(c).name, subjects.deadletter(c, "metrics"))
            info = await js.stream_info(telemetry_stream(c).name)
            bodies = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(telemetry_stream(c).name, seq)
                if msg.data and marker.encode() in msg.data:
                    bodies.append(msg.data)
            return bodies, {**(dead.headers or {}), "data": (dead.data or b"").decode()}
        finally:
            await nc.close()

    bodies, dead = asyncio.run(stored())
    assert bodies == seen  # the telemetry stream holds n001's line, never the forged one
    assert dead["Hpcbus-Subject"] == f"{c}.ingest.n001.metrics" and forged in dead["data"]
    assert "claims hostname=n002" in dead["Hpcbus-Problems"]
    assert count_points(influxdb, db, "forgery_test", f"{where} AND hostname = 'n002'") == 0


def test_a_node_may_send_only_what_the_allow_list_names() -> None:
    """Issue 29 item 1: the list of what a node may send is an allow-list (a class it does not name is
    refused), so a node cannot put Slurm records (`events.slurm`) or anything else of the master's on the bus."""
    for category, detail in (("metrics", ""), ("log", "hpcbus"), ("log", "agent"), ("events", "nodejob")):
        assert subject_problem(category, detail, "n001") is None
    for detail in ("sample", "sysinfo", "errors"):
        assert subject_problem("events", detail, "n001") is None
    for category, detail in (
        ("events", "slurm"),
        ("events", "job"),
        ("events", "cluster"),
        ("events", "nodestate"),
        ("events", "jobsummary"),
        ("events", "anything_new"),
        ("sonar", "job"),
        ("sonar", "cluster"),
    ):
        reason = subject_problem(category, detail, "n001")
        assert reason is not None and reason.startswith("n001 may not send"), (category, detail)
        assert "a node may send metrics, logs" in reason


def test_a_line_must_be_what_its_subject_carries() -> None:
    """An event line on `metrics` (InfluxDB stores it under its measurement: a `slurm` record from a node),
    a metric named like another role's measurement, a log line of another component: refused."""
    envelope = json.dumps({"meta": {}, "data": {"type": "job", "attributes": {"slurm_jobs": []}}})
    forged_record = format_line(
        event("slurm", envelope, time=NOW, function="sonar", cluster="fox", hostname="n001")
    )
    payload = (
        f"{forged_record}\n"
        f"job_summary,cluster=fox,hostname=n001,type=node,job=1 value=1 {NOW}\n"
        f"slurm,cluster=fox,hostname=n001,type=node value=1 {NOW}\n"
        f"mem_used,cluster=fox,hostname=n001,type=node value=1 {NOW}\n"
    ).encode()
    good, problems, _ = lines_of(payload, "metrics")
    assert len(good) == 1 and good[0].startswith("mem_used,")
    reasons = [p.reason for p in problems]
    assert any("one `value` field, not event" in r for r in reasons), reasons
    assert sum("written by the batch-system producers or the workers" in r for r in reasons) == 2
    logs = f'agent,hostname=n001 log="x" {NOW}\nother,hostname=n001 log="x" {NOW}\n'.encode()
    good, problems, _ = lines_of(logs, "log", "agent")
    assert len(good) == 1 and "carries log lines of measurement agent, not log other" in problems[0].reason


@pytest.mark.parametrize("measurement", ["job_summary", "jobsummary", "job", "slurm", "nodejob", "nodestate"])
def test_a_log_line_may_not_pose_as_another_roles_measurement(measurement: str) -> None:
    """Review of issue 34: a log line is stored under its measurement with every field it has, so a node's
    `<c>.ingest.<host>.log.job_summary` line with summary fields was a `job_summary` point `hpcbus report`
    read as the jobs worker's (later than the real one: it won), and the same for Slurm records, job events
    and node states. Refused; the node agent's own `hpcbus` log still passes."""
    forged = (
        f"{measurement},hostname=n001,cluster=fox,job=4242,user=mallory "
        f'log="x",cpu_eff=99.0,elapsed=3600.0 {NOW}\n'
    ).encode()
    good, problems, _ = lines_of(forged, "log", measurement)
    assert good == [] and "written by the batch-system producers or the workers" in problems[0].reason
    own = f'hpcbus,hostname=n001,loglevel=warning log="ok" {NOW}\n'.encode()
    good, problems, _ = lines_of(own, "log", "hpcbus")
    assert len(good) == 1 and problems == []


def nodejob_line(tag_host: str, json_host: str, cluster: str = "fox") -> bytes:
    seen = NodeJob(job_id=7770001, cluster=cluster, hostname=json_host, start_time=NOW, user="victim")
    line = node_job_line(seen, "start", NOW)
    line.tags["hostname"], line.tags["cluster"] = tag_host, "fox"
    return (format_line(line) + "\n").encode()


def test_a_nodejob_must_name_its_sender_inside_its_json_too() -> None:
    """Issue 29 item 2: `consume jobs` takes the host of a `nodejob` from its JSON, so the JSON must be the
    sender's host (and cluster) as well as the tag."""
    good, problems, _ = lines_of(nodejob_line("n001", "n001"), "events", "nodejob")
    assert len(good) == 1 and problems == []
    good, problems, _ = lines_of(nodejob_line("n001", "n002"), "events", "nodejob")
    assert good == [] and [p.path for p in problems] == ["event.hostname"]
    assert problems[0].reason == "claims hostname=n002 but was published with the credentials of n001"
    good, problems, _ = lines_of(nodejob_line("n001", "n001", cluster="bar"), "events", "nodejob")
    assert good == [] and [p.path for p in problems] == ["event.cluster"]
    good, problems, _ = lines_of(f'nodejob,hostname=n001 event="[1" {NOW}\n'.encode(), "events", "nodejob")
    assert good == [] and "not a nodejob event" in problems[0].reason
    # the worker's own check, for a bus without ingest: the JSON must agree with the line's tags
    line = parse_payload(nodejob_line("n001", "n002"), now=NOW).lines[0]
    assert (
        nodejob_host_problem(line, "fox") == "event.hostname names hostname 'n002', but the line says 'n001'"
    )
    assert nodejob_host_problem(parse_payload(nodejob_line("n001", "n001"), now=NOW).lines[0], "fox") is None


def test_sonar_events_of_a_node_must_name_it_inside_their_json() -> None:
    """The Sonar translation of a node's envelopes travels as `sample` (skeleton), `sysinfo` and `errors`
    events: the node and cluster inside must be the sender's, as for a raw envelope on `sonar.sample`."""

    def env(node: str, cluster: str = "fox") -> dict[str, object]:
        return {"meta": {}, "data": {"type": "sysinfo", "attributes": {"node": node, "cluster": cluster}}}

    own = json.dumps(env("n001"))
    for detail, payload, path in (
        ("sysinfo", json.dumps(env("n002")), "event.data.attributes.node"),
        ("sample", json.dumps({"lines": 0, "skeleton": env("n002")}), "event.skeleton.data.attributes.node"),
        (
            "sample",
            json.dumps({"lines": 0, "skeleton": env("n001", "bar")}),
            "event.skeleton.data.attributes.cluster",
        ),
        (
            "errors",
            json.dumps({"meta": {}, "errors": [{"detail": "x", "node": "n009"}]}),
            "event.errors[0].node",
        ),
    ):
        text = format_line(event(detail, payload, time=NOW, hostname="n001", cluster="fox"))
        good, problems, _ = lines_of(f"{text}\n".encode(), "events", detail)
        assert good == [] and [p.path for p in problems] == [path], (detail, problems)
    text = format_line(event("sysinfo", own, time=NOW, hostname="n001", cluster="fox"))
    assert lines_of(f"{text}\n".encode(), "events", "sysinfo")[1] == []


@pytest.mark.services
def test_forged_slurm_records_and_job_observations_are_dead_lettered(
    secured: Secured,  # noqa: F811
    tmp_path: Path,
    workers: list[Process],
) -> None:
    """Issue 29 items 1 and 2 through the real broker and worker: a Sonar jobs envelope as a `slurm,function=
    sonar` event on n001's ingest subject (job 8880001 of user victim on n999), and a `nodejob` n001 publishes
    whose JSON puts job 7770001 on n002; both are dead-lettered with the reason and never reach the cluster's
    subjects, while n001's own observation behind them is forwarded."""
    c, url = secured.cluster, secured.url
    argv = ["consume", "ingest", "--nats", url, "--cluster", c, "--stats-seconds", "0.5"]
    w = Worker(argv, tmp_path / "ingest.log", secured.env("worker-ingest"))
    workers.append(w)
    w.start(timeout=60)
    record = {"job_id": 8880001, "user_name": "victim", "job_state": "RUNNING", "nodes": ["n999"]}
    envelope = {
        "meta": {"producer": "sonar", "version": "0.18.0", "format": 0},
        "data": {
            "type": "jobs",
            "attributes": {"time": "2026-11-29T00:00:00Z", "cluster": c, "slurm_jobs": [record]},
        },
    }
    slurm = format_line(
        event("slurm", json.dumps(envelope), time=NOW, function="sonar", cluster=c, hostname="n001")
    )
    forged_job = NodeJob(job_id=7770001, cluster=c, hostname="n002", start_time=NOW, user="victim")
    forged = node_job_line(forged_job, "start", NOW)
    forged.tags["hostname"] = "n001"
    own = node_job_line(NodeJob(job_id=7770002, cluster=c, hostname="n001", start_time=NOW), "start", NOW)

    async def run() -> tuple[list[bytes], dict[str, dict[str, str]]]:
        seen: list[bytes] = []
        reader = await secured.connect("reader")
        node = await secured.connect("node-n001")
        admin = await secured.connect("admin")
        try:

            async def on(msg: Msg) -> None:
                seen.append(msg.data)

            await reader.subscribe(subjects.wildcard(c, "events"), cb=on)
            await reader.flush()
            # the broker refuses `events.slurm` from node-n001 now (its allow-list); an older auth.conf did
            # not, so the record goes on n001's ingest subject with the admin's rights: the worker must hold
            await admin.jetstream().publish(
                subjects.ingest(c, "n001", subjects.events(c, "slurm")), f"{slurm}\n".encode(), timeout=10
            )
            js = node.jetstream()
            flood = "".join(f"mem_used,hostname=n002,type=node value={i} {NOW}\n" for i in range(5000))
            await js.publish(subjects.ingest(c, "n001", subjects.metrics(c)), flood.encode(), timeout=10)
            for i in range(150):  # a broken node: one forged line a message, message after message
                line = f"mem_used,hostname=n002,type=node value={i} {NOW + i}\n"
                await js.publish(subjects.ingest(c, "n001", subjects.metrics(c)), line.encode(), timeout=10)
            for text in (format_line(forged), format_line(own)):
                await js.publish(
                    subjects.ingest(c, "n001", subjects.events(c, "nodejob")),
                    f"{text}\n".encode(),
                    timeout=10,
                )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not any(b"7770002" in s for s in seen) and loop.time() < deadline:
                await asyncio.sleep(0.05)
            ajs = admin.jetstream()
            dead: dict[str, dict[str, str]] = {}
            wanted = {subjects.ingest(c, "n001", subjects.events(c, k)) for k in ("slurm", "nodejob")}
            read = 0
            # dead letters are stored after the batch's forwards: wait for them, not for the forward
            while not wanted <= dead.keys() and loop.time() < deadline:
                info = await ajs.stream_info(deadletter_stream(c).name)
                first, read = max(read + 1, info.state.first_seq), info.state.last_seq
                for seq in range(first, read + 1):
                    msg = await ajs.get_msg(deadletter_stream(c).name, seq)
                    headers = msg.headers or {}
                    dead[headers.get("Hpcbus-Subject", "")] = {**headers, "data": (msg.data or b"").decode()}
                await asyncio.sleep(0.05)
            return seen, dead
        finally:
            for nc in (reader, node, admin):
                await nc.close()

    seen, dead = asyncio.run(run())
    assert any(b"7770002" in s for s in seen), "n001's own observation was not forwarded"
    assert not any(b"8880001" in s or b"7770001" in s for s in seen), seen
    slurm_dead = dead[f"{c}.ingest.n001.events.slurm"]
    assert (
        "n001 may not send slurm events" in slurm_dead["Hpcbus-Problems"] and "8880001" in slurm_dead["data"]
    )
    nodejob_dead = dead[f"{c}.ingest.n001.events.nodejob"]
    assert "claims hostname=n002" in nodejob_dead["Hpcbus-Problems"] and "7770001" in nodejob_dead["data"]
    # item 9: once all were dead-lettered, nothing is pending (it said `pending 2` for ever); 5,000 forged
    # lines in one message, then 150 messages of one, are not 5,150 WARNINGs (the dead letters keep them all)
    w.wait_log("dead-lettered 153, pending 0", timeout=60)
    warnings = [line for line in w.log().splitlines() if "WARNING" in line]
    assert 100 <= len(warnings) <= PROBLEMS_PER_MINUTE + 5, len(warnings)  # 5,171 problems: at most 100 lines
    assert any("and 4980 more" in line for line in warnings)


@pytest.mark.parametrize("case", sorted(p.name for p in FIX.iterdir() if p.is_dir()))
def test_everything_the_node_agent_sends_is_on_the_allow_list(tmp_path: Path, case: str) -> None:
    """The allow-list refuses nothing the real node agent publishes (two samples of each fixture tree: node,
    device, job and process metrics, `nodejob` and skeleton events, its own telemetry), except cc-backend's
    `job` events of `cc_job_events = true`, which only a site without a batch-system producer turns on and
    which never went through ingest."""
    sent = 0
    for subject, payload in agent_messages(tmp_path, case):
        target = subjects.parse(subject)
        if (target.category, target.detail) == ("events", "job"):
            assert subject_problem("events", "job", "c1-10") is not None
            continue
        assert subject_problem(target.category, target.detail, "c1-10") is None, subject
        sender = Sender.node("c1-10", target.cluster)
        good, problems, _ = check_lines(
            payload, subject, sender, target.category, target.detail, now=NOW, max_future=DEFAULT_MAX_FUTURE
        )
        assert problems == [], (subject, problems[:3])
        sent += len(good)
    assert sent > 50
