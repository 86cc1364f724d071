"""Jobs and cluster envelopes: the cc-backend events derived from them, and assembling Sonar envelopes from
ClusterCockpit's job and node-state events."""

from __future__ import annotations

import json

import msgspec

from hpcbus.schemas.ccbackend import StartJob, StopJob
from hpcbus.schemas.lineprotocol import Line, format_lines, parse_payload
from hpcbus.schemas.noderange import expand_all
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import iter_envelopes, validate_envelope
from hpcbus.schemas.sonar.types import ClusterEnvelope, JobsEnvelope
from hpcbus.schemas.translate import (
    ClusterAssembler,
    JobsAssembler,
    LpToSonar,
    envelope_to_lines,
    lines_to_envelopes,
)
from hpcbus.schemas.translate.jobs import cc_state
from tests.corpus import CORPUS

LP = CORPUS / "clustercockpit" / "lineprotocol"


def _envelopes(name: str) -> list:
    return [e for _, e in iter_envelopes((CORPUS / "sonar" / name).read_text())]


def _cc(lines: list[Line], function: str) -> list[dict]:
    return [json.loads(str(ln.fields["event"])) for ln in lines if ln.tags.get("function") == function]


# --- Sonar jobs -> cc-backend -------------------------------------------------------------------------------


def test_derived_start_and_stop_events_are_what_cc_backend_accepts() -> None:
    [env] = _envelopes("sonar__fox_jobs_v0.18.1_trimmed.json")
    lines = envelope_to_lines(env)
    assert all(ln.tags.get("origin") == "sonar" for ln in lines if ln.measurement == "job")
    starts = _cc(lines, "start_job")
    stops = _cc(lines, "stop_job")
    for payload in starts:  # cc-backend decodes with DisallowUnknownFields and sanity checks
        job = msgspec.json.decode(json.dumps(payload), type=StartJob)
        assert job.user and job.num_nodes == len(job.resources) >= 1 and job.cluster == "fox.educloud.no"
    for payload in stops:
        job = msgspec.json.decode(json.dumps(payload), type=StopJob)
        assert job.stop_time >= job.start_time
    by_id = {p["jobId"]: p for p in starts}
    running = by_id[1879824]
    assert running["walltime"] == 1209600  # time_limit 1209602 = seconds + 2
    assert running["resources"] == [{"hostname": "gpu-2"}] and running["numHwthreads"] == 32
    assert running["numAcc"] == 1 and running["requestedMemory"] == 131072
    assert running["metaData"] == {"jobName": "siamE3F1"} and running["project"] == "ac10000"
    assert 1903070 not in by_id  # PENDING: not started, no start_job
    states = {p["jobId"]: p["jobState"] for p in stops}
    assert states[1955319] == "timeout"
    assert states == {1955319: "timeout", 1956882: "failed", 1956889: "completed"}
    # 1956890 is "CANCELLED by 2101037" without a start (cancelled while pending): nothing to start or stop
    assert 1956890 not in by_id and 1956890 not in states
    assert cc_state("CANCELLED by 2101037") == "cancelled" and cc_state("REQUEUED") == ""


def test_none_assigned_is_not_a_host() -> None:
    [env] = _envelopes("jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl")
    starts = _cc(envelope_to_lines(env), "start_job")
    assert all("None" not in r["hostname"] for p in starts for r in p["resources"])


def test_cc_events_can_be_turned_off() -> None:
    [env] = _envelopes("sonar__fox_jobs_v0.18.1_trimmed.json")
    assert [ln.measurement for ln in envelope_to_lines(env, cc_events=False)] == ["slurm"]


def test_sonar_derived_events_are_not_read_back_twice() -> None:
    [env] = _envelopes("sonar__fox_jobs_v0.18.1_trimmed.json")
    unmade: list[Problem] = []
    out = lines_to_envelopes(
        parse_payload(format_lines(envelope_to_lines(env)), now=0).lines, problems=unmade
    )
    assert [a.envelope for a in out] == [env] and unmade == []


# --- cc-backend events -> Sonar jobs ------------------------------------------------------------------------


def test_cc_backend_start_job_becomes_a_running_slurm_record() -> None:
    parsed = parse_payload((LP / "cc-backend-nats-job-events.lp").read_text(), now=0)
    asm = JobsAssembler(grace=10)
    assert asm.add_lines(parsed.lines, cluster="fallback", now=0) == []
    assert asm.flush(now=9) == []
    [result] = asm.flush(now=10)
    env = result.envelope
    assert isinstance(env, JobsEnvelope) and validate_envelope(env) == []
    assert env.data.type == "job" and env.data.attributes.cluster == "testcluster"
    [rec] = env.data.attributes.slurm_jobs
    assert (rec.job_id, rec.job_state, rec.user_name, rec.account) == (
        4001,
        "RUNNING",
        "testuser",
        "testproj",
    )
    assert (rec.partition, rec.nodes, rec.requested_cpus) == ("main", ["host123"], 8)
    assert rec.time_limit == 3602  # walltime 3600 s in real Sonar's encoding
    # The start_job carries no submitTime: submit_time stays absent (issue 10: never invented).
    assert rec.start_time == "2009-02-13T23:31:30+00:00" and rec.submit_time == ""
    assert env.meta.producer == "hpcbus" and env.meta.attrs[0].value == "clustercockpit"


def test_later_records_override_earlier_ones_field_by_field() -> None:
    start = {
        "jobId": 7,
        "user": "alice",
        "cluster": "c",
        "numNodes": 2,
        "startTime": 1000,
        "submitTime": 900,
        "resources": [{"hostname": "n1"}, {"hostname": "n2"}],
        "metaData": {"jobName": "sim"},
    }
    stop = {"jobId": 7, "cluster": "c", "startTime": 1000, "stopTime": 5000, "jobState": "completed"}
    lines = [
        Line("job", {"function": "stop_job"}, {"event": json.dumps(stop)}, 5000),
        Line("job", {"function": "start_job"}, {"event": json.dumps(start)}, 1000),  # arrives late, is older
        Line(
            "slurm",
            {"function": "record", "cluster": "c"},
            {
                "event": json.dumps(
                    {
                        "job_id": 7,
                        "job_state": "COMPLETED",
                        "submit_time": "1970-01-01T00:15:00Z",
                        "exit_code": 3,
                    }
                )
            },
            6000,
        ),
    ]
    asm = JobsAssembler()
    asm.add_lines(lines, now=0)
    [result] = asm.flush_all()
    [rec] = result.envelope.data.attributes.slurm_jobs
    assert rec.job_state == "COMPLETED"  # the stop (newer) wins over the start's RUNNING
    assert rec.user_name == "alice" and rec.job_name == "sim" and rec.nodes == ["n[1-2]"]  # only in the start
    assert rec.end_time == "1970-01-01T01:23:20+00:00" and rec.exit_code == 3
    assert rec.submit_time == "1970-01-01T00:15:00Z"
    assert result.envelope.data.attributes.time == "1970-01-01T01:40:00+00:00"  # newest record
    assert validate_envelope(result.envelope) == []


def test_bad_job_events_are_reported_not_dropped() -> None:
    parsed = parse_payload((LP / "cc-backend-nats-multiline-message.lp").read_text(), now=0)
    assert len(parsed.lines) == 2  # start_job {} and stop_job {}
    out = JobsAssembler().add_lines(parsed.lines, cluster="x", now=0)
    assert len(out) == 2 and all(a.problems and not a.complete for a in out)
    assert "jobId" in str(out[0].problems[0])


# --- Sonar cluster <-> cc-backend nodestate ------------------------------------------------------------------


def test_cluster_envelope_gives_cc_backend_nodestate() -> None:
    [env] = _envelopes("slurmmonitor__fox_cluster_v0.18.json")
    lines = envelope_to_lines(env)
    assert [(ln.measurement, ln.tags.get("function") or ln.tags.get("origin")) for ln in lines] == [
        ("cluster", "sonar"),
        ("nodestate", "sonar"),
    ]
    payload = json.loads(str(lines[1].fields["event"]))
    hosts = {n["hostname"]: n["states"] for n in payload["nodes"]}
    assert hosts["dgx-1"] == ["down", "drain", "maintenance", "reserved", "not_responding"]
    assert hosts["c1-6"] == ["idle", "drain"]
    assert len(hosts) == len(expand_all(r for g in env.data.attributes.nodes for r in g.names))


def test_nodestate_events_become_a_cluster_envelope() -> None:
    parsed = parse_payload((LP / "cc-backend-nats-nodestate-events.lp").read_text(), now=0)
    asm = ClusterAssembler(grace=1)
    assert asm.add_lines(parsed.lines, now=0) == []  # the empty `nodes` list is fine
    [result] = asm.flush(now=5)
    env = result.envelope
    assert isinstance(env, ClusterEnvelope)
    attrs = env.data.attributes
    assert attrs.cluster == "testcluster" and attrs.slurm
    groups = {tuple(g.states): g.names for g in attrs.nodes}
    # later events win per host: host123 went allocated -> idle, host124 allocated
    assert groups == {("ALLOCATED",): ["host124"], ("IDLE",): ["host123", "node[1-3]"]}
    assert [str(p) for p in result.problems] == [
        "-: nodestate: warning: host name 'host-ñ123' cannot be written as a Sonar NodeRange; left out"
    ]
    assert validate_envelope(env) == []


def test_partition_events_and_round_trip_through_the_front_door() -> None:
    part = Line(
        "partition", {"cluster": "fox"}, {"event": json.dumps({"name": "gpu", "nodes": ["g[1-3]"]})}, 10
    )
    state = Line(
        "nodestate",
        {},
        {"event": json.dumps({"cluster": "fox", "nodes": [{"hostname": "g2", "states": ["mixed"]}]})},
        12,
    )
    translator = LpToSonar(grace=0)
    unmade: list[Problem] = []
    assert translator.add_lines([part, state], now=0, problems=unmade) == [] and unmade == []
    [result] = translator.flush(now=0)
    attrs = result.envelope.data.attributes
    assert [(p.name, p.nodes) for p in attrs.partitions] == [("gpu", ["g[1-3]"])]
    assert [(n.names, n.states) for n in attrs.nodes] == [(["g2"], ["MIXED"])]
    assert attrs.time == "1970-01-01T00:00:12+00:00"


# --- Issue 10: records with only the mandatory fields ----------------------------------------------------------


def _minimal(records: list[dict]) -> JobsEnvelope:
    from tests.test_sonar_jsonschema import minimal_jobs

    [(_, env)] = list(iter_envelopes(json.dumps(minimal_jobs(records))))
    assert isinstance(env, JobsEnvelope), env
    return env


def test_minimal_and_mixed_records_round_trip_unchanged() -> None:
    from tests.test_sonar_jsonschema import FOUR, MIXED

    for records in (FOUR, MIXED):
        env = _minimal(records)
        assert validate_envelope(env) == []
        text = format_lines(envelope_to_lines(env))
        back = LpToSonar()
        unmade: list[Problem] = []
        out = back.add_lines(parse_payload(text, now=0).lines, now=0, problems=unmade) + back.flush_all()
        [result] = [a for a in out if a.kind == "job"]
        assert unmade == []
        assert result.envelope == env and result.complete and not result.problems
        # absent fields come back absent, byte for byte
        got = json.loads(msgspec.json.encode(result.envelope))["data"]["attributes"]["slurm_jobs"]
        assert got == [{k: v for k, v in r.items() if v != ""} for r in records]


def test_cc_events_are_not_made_up_from_partial_records() -> None:
    """cc-backend's start_job needs user, resources and numNodes: a started record without them gets none."""
    from hpcbus.schemas.translate import jobs_to_lines

    started = "2026-03-03T15:00:00+02:00"
    env = _minimal(
        [
            {"job_id": 1, "job_state": "RUNNING", "start_time": started},  # no user, no nodes
            {"job_id": 2, "job_state": "RUNNING", "start_time": started, "nodes": ["c1-[1-2]"]},
            {"job_id": 3, "job_state": "RUNNING", "start_time": started, "user_name": "bob"},
            {"job_id": 4, "job_state": "RUNNING", "start_time": started, "user_name": "al", "nodes": ["c1"]},
            {"job_id": 5, "job_state": "PENDING"},
            {"job_id": 6, "job_state": "COMPLETED", "end_time": started},  # never started: no stop_job
        ]
    )
    problems: list[Problem] = []
    lines = jobs_to_lines(env, problems=problems)
    starts = _cc(lines, "start_job")
    assert [p["jobId"] for p in starts] == [4]
    assert "submitTime" not in starts[0]  # absent submit_time is not replaced by anything
    assert _cc(lines, "stop_job") == []
    assert [(p.severity, p.reason.split(": ", 2)[2]) for p in problems] == [
        (
            "warning",
            "user_name and nodes absent (cc-backend needs user, resources and numNodes; nothing is made up)",
        ),
        ("warning", "user_name absent (cc-backend needs user, resources and numNodes; nothing is made up)"),
        ("warning", "nodes absent (cc-backend needs user, resources and numNodes; nothing is made up)"),
    ]
    assert jobs_to_lines(env) == lines  # without a list to report to, the same lines


def test_loose_records_get_no_invented_submit_time_or_state() -> None:
    stop = {"jobId": 11, "cluster": "c", "startTime": 1000, "stopTime": 5000}  # no jobState
    record = {"job_id": 12, "job_state": "PENDING", "job_name": "x"}
    lines = [
        Line("job", {"function": "stop_job"}, {"event": json.dumps(stop)}, 5000),
        Line("slurm", {"function": "record", "cluster": "c"}, {"event": json.dumps(record)}, 6000),
    ]
    asm = JobsAssembler()
    asm.add_lines(lines, now=0)
    [result] = asm.flush_all()
    [rec] = result.envelope.data.attributes.slurm_jobs
    assert json.loads(msgspec.json.encode(rec)) == record  # no submit_time made up
    assert [str(p) for p in result.problems] == [
        "-: slurm record: job 11: no job_state known (a Sonar record must carry one); left out"
    ]
    assert validate_envelope(result.envelope) == []
