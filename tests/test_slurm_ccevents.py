"""cc-backend start_job/stop_job payloads: the structs accept cc-backend's own examples (unknown fields
forbidden, as cc-backend forbids them), and the builders turn the sacct corpus into payloads that pass
the checks cc-backend applies (importer.SanityChecks and the stop_job handler)."""

from __future__ import annotations

import json
from datetime import timedelta, timezone
from typing import Any

import msgspec
import pytest

from hpcbus.schemas.ccbackend import CC_JOB_STATES, StartJob, StopJob, cc_job_state, job_event_line
from hpcbus.schemas.lineprotocol import format_line, parse_payload
from hpcbus.schemas.noderange import expand
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.ccevents import start_job, stop_job
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, SacctRow, parse_sacct, parse_sacct_line
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from tests.corpus import CORPUS, HB_JOBINFO_FIELDS

CC = CORPUS / "clustercockpit"
CET_2 = timezone(timedelta(hours=2))

# cc-lib schema.Job's JSON names (json tags, `-` ones excluded) and cc-backend StopJobAPIRequest's.
GO_JOB_FIELDS = {
    "cluster",
    "subCluster",
    "partition",
    "project",
    "user",
    "shared",
    "jobState",
    "tags",
    "resources",
    "energyFootprint",
    "footprint",
    "metaData",
    "concurrentJobs",
    "energy",
    "arrayJobId",
    "walltime",
    "requestedMemory",
    "jobId",
    "duration",
    "smt",
    "monitoringStatus",
    "numAcc",
    "numHwthreads",
    "numNodes",
    "statistics",
    "id",
    "submitTime",
    "startTime",
}
GO_STOP_FIELDS = {"jobId", "cluster", "startTime", "jobState", "stopTime"}


def corpus_rows(name: str) -> list[SacctRow]:
    out = list(parse_sacct((CORPUS / "slurm" / name).read_text(), SACCT_FIELDS, CET_2))
    assert not [p for p in out if isinstance(p, Problem)]
    return [r for r in out if isinstance(r, SacctRow)]


def job_rows() -> list[SacctRow]:
    rows = corpus_rows("sonar_sacct_output_running-pending.txt") + corpus_rows(
        "sonar_sacct-output_completed.txt"
    )
    return [r for r in rows if not r.step]


def sacct_row(fields: list[str], values: list[str]) -> SacctRow:
    row = parse_sacct_line("|".join(values), fields, CET_2)
    assert isinstance(row, SacctRow), row
    return row


FIELDS = ["JobID", "JobIDRaw", "User", "State", "Submit", "Start", "End", "NodeList"]
TIMES = ["2025-01-01T00:00:00", "2025-01-01T00:00:01", "2025-01-01T00:00:02"]


# --- the structs against cc-backend's own examples --------------------------------------------------------------


def test_cc_backend_example_payloads_decode_with_unknown_fields_forbidden() -> None:
    start = msgspec.json.decode((CC / "cc-backend" / "startJobPayload.json").read_bytes(), type=StartJob)
    assert start.job_id == 123000 and start.cluster == "fritz" and start.num_hwthreads == 72
    assert [r.hostname for r in start.resources] == ["f0726"] and start.requested_memory == 128000
    assert start.meta_data["jobName"] == "ams_pipeline" and start.sub_cluster == "main"
    stop = msgspec.json.decode((CC / "cc-backend" / "stopJobPayload.json").read_bytes(), type=StopJob)
    assert (stop.job_id, stop.job_state, stop.start_time, stop.stop_time) == (
        123000,
        "completed",
        1649723812,
        1649763839,
    )


def test_cc_backend_nats_test_event_decodes() -> None:
    text = (CC / "lineprotocol" / "cc-backend-nats-job-events.lp").read_text()
    parsed = parse_payload(text, now=0)
    assert not parsed.errors and len(parsed.lines) == 1
    line = parsed.lines[0]
    assert line.tags == {"function": "start_job"}
    payload = line.fields["event"]
    assert isinstance(payload, str)
    start = msgspec.json.decode(payload, type=StartJob)
    assert start.shared == "none" and start.smt == 1 and start.resources[0].hwthreads == [0, 1, 2, 3]


def test_unknown_fields_are_refused_like_cc_backend_does() -> None:
    with pytest.raises(msgspec.ValidationError, match="exclusive"):
        msgspec.json.decode(
            b'{"jobId":1,"cluster":"c","user":"u","resources":[],"numNodes":1,"startTime":1,"exclusive":1}',
            type=StartJob,
        )
    with pytest.raises(msgspec.ValidationError, match="jobState"):
        msgspec.json.decode(b'{"jobId":1,"stopTime":2,"jobState":"stopped"}', type=StopJob)


def test_wire_names_are_cc_backends() -> None:
    start = StartJob(job_id=1, cluster="c", user="u", resources=[], num_nodes=1, start_time=1)
    assert set(StartJob.__struct_encode_fields__) <= GO_JOB_FIELDS
    assert set(StopJob.__struct_encode_fields__) == GO_STOP_FIELDS
    assert json.loads(msgspec.json.encode(start)) == {
        "jobId": 1,
        "cluster": "c",
        "user": "u",
        "resources": [],
        "numNodes": 1,
        "startTime": 1,
    }


# --- state mapping --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slurm", "cc"),
    [
        ("COMPLETED", "completed"),
        ("CANCELLED", "cancelled"),
        ("FAILED", "failed"),
        ("TIMEOUT", "timeout"),
        ("OUT_OF_MEMORY", "out_of_memory"),
        ("NODE_FAIL", "node_fail"),
        ("PREEMPTED", "preempted"),
        ("BOOT_FAIL", "boot_fail"),
        ("DEADLINE", "deadline"),
        ("RUNNING", "running"),
        ("PENDING", "pending"),
        ("SUSPENDED", "suspended"),
        ("REVOKED", "cancelled"),
    ],
)
def test_state_mapping(slurm: str, cc: str) -> None:
    assert cc_job_state(slurm) == cc
    assert cc in CC_JOB_STATES


def test_every_end_state_has_a_cc_backend_state_that_ends_the_job() -> None:
    assert {cc_job_state(slurm) for slurm in TERMINAL_STATES}.isdisjoint({"pending", "running", "suspended"})


@pytest.mark.parametrize("slurm", ["REQUEUED", "RESIZING", "CANCELLED by 5", "completed", ""])
def test_state_mapping_refuses(slurm: str) -> None:
    with pytest.raises(ValueError, match="no cc-backend job state"):
        cc_job_state(slurm)


# --- builders on the corpus -------------------------------------------------------------------------------------


def sanity_checks(start: StartJob) -> None:
    """cc-backend's importer.SanityChecks, minus the cluster lookup, plus its DisallowUnknownFields decode."""
    assert start.user and start.resources and start.num_nodes >= 1
    assert len(start.resources) == start.num_nodes
    assert start.num_acc >= 0 and start.num_hwthreads >= 0
    wire = msgspec.json.encode(start)
    assert set(json.loads(wire)) <= GO_JOB_FIELDS
    assert msgspec.json.decode(wire, type=StartJob) == start


def test_corpus_job_rows_give_valid_events() -> None:
    counts = {"start": 0, "stop": 0, "pending": 0}
    for row in job_rows():
        start = start_job(row, "fox")
        stop = stop_job(row, "fox")
        if row.state == "PENDING":
            assert start is None and stop is None
            counts["pending"] += 1
            continue
        if row.start is None:  # cancelled while pending: cc-backend never heard of it
            assert start is None and stop is None
            continue
        assert start is not None
        sanity_checks(start)
        counts["start"] += 1
        assert start.job_id == row.job_id and start.user == row.user and start.project == row.account
        assert [r.hostname for r in start.resources] == expand(row.node_list)
        assert start.start_time == int(row.start.timestamp())
        assert row.submit is not None and start.submit_time == int(row.submit.timestamp())
        assert start.meta_data["jobName"] == row.job_name
        if isinstance(row.time_limit, int):
            assert start.walltime == row.time_limit * 60
        if row.state == "RUNNING":
            assert stop is None
            continue
        assert stop is not None
        counts["stop"] += 1
        assert stop.job_state == cc_job_state(row.state)
        assert (stop.job_id, stop.cluster, stop.start_time) == (start.job_id, start.cluster, start.start_time)
        assert stop.stop_time >= stop.start_time
        assert set(json.loads(msgspec.json.encode(stop))) == GO_STOP_FIELDS
    assert counts == {"start": counts["start"], "stop": counts["stop"], "pending": 31}
    assert counts["start"] > counts["stop"] > 0


def test_gpu_job_start_payload() -> None:
    row = job_rows()[0]  # 1879824, RUNNING on gpu-2 with gres/gpu=1
    start = start_job(row, "fox")
    assert start is not None
    assert json.loads(msgspec.json.encode(start)) == {
        "jobId": 1879824,
        "cluster": "fox",
        "user": "uc-10000",
        "resources": [{"hostname": "gpu-2"}],
        "numNodes": 1,
        "startTime": 1757678772,
        "partition": "accel_long",
        "project": "ac10000",
        "numHwthreads": 32,
        "numAcc": 1,
        "walltime": 20160 * 60,
        "requestedMemory": 128 * 1024,
        "submitTime": 1757276166,
        "metaData": {
            "jobName": "siamE3F1",
            "slurmInfo": "JobIDRaw=1879824\nJobName=siamE3F1\nUser=uc-10000\nAccount=ac10000\n"
            "Partition=accel_long\nNodeList=gpu-2\nState=RUNNING\nSubmit=2025-09-07T22:16:06+02:00\n"
            "Start=2025-09-12T14:06:12+02:00\nTimelimitRaw=20160\nReqCPUS=32\n"
            "AllocTRES=billing=32,cpu=32,gres/gpu:a100=1,gres/gpu=1,mem=128G,node=1",
        },
    }
    assert stop_job(row, "fox") is None


def test_multi_node_cancelled_by_uid() -> None:
    row = next(r for r in job_rows() if r.node_list == "c1-[9-10]")
    start, stop = start_job(row, "fox"), stop_job(row, "fox")
    assert start is not None and stop is not None
    assert [r.hostname for r in start.resources] == ["c1-9", "c1-10"] and start.num_nodes == 2
    assert stop.job_state == "cancelled"  # State was "CANCELLED by 2103426"


def test_timeout_oom_and_node_fail_jobs() -> None:
    rows = corpus_rows("sonar_sacct-output_completed.txt")
    timeout = [stop_job(r, "fox") for r in rows if r.state == "TIMEOUT" and not r.step]
    assert len(timeout) == 2 and all(s is not None and s.job_state == "timeout" for s in timeout)
    # the corpus has OUT_OF_MEMORY only on steps (973997.0): the job row of such a job, as sacct prints it
    oom = sacct_row(FIELDS, ["973997", "973997", "u", "OUT_OF_MEMORY", *TIMES, "c1-5"])
    stop = stop_job(oom, "fox")
    assert stop is not None and stop.job_state == "out_of_memory"
    # hb-jobinfo's NODE_FAIL job never started (Start=None): no event at all, cc-backend never saw it
    hb = (CORPUS / "slurm" / "hb-jobinfo_sacct_snowman-delimited.txt").read_text()
    node_fail_line = next(line for line in hb.splitlines() if "☃NODE_FAIL☃" in line)
    fields = HB_JOBINFO_FIELDS[:12]  # JobID ... End
    node_fail = parse_sacct_line("☃".join(node_fail_line.split("☃")[:12]), fields, CET_2, delimiter="☃")
    assert isinstance(node_fail, SacctRow) and node_fail.state == "NODE_FAIL" and node_fail.start is None
    assert start_job(node_fail, "c") is None and stop_job(node_fail, "c") is None
    started = sacct_row(FIELDS, ["8", "8", "u", "NODE_FAIL", *TIMES, "n[1-2]"])
    stop = stop_job(started, "c")
    assert stop is not None and stop.job_state == "node_fail"


def test_hwthreads_accelerators_and_options() -> None:
    row = job_rows()[0]
    start = start_job(
        row,
        "fox",
        shared="multi_user",
        hwthreads={"gpu-2": [0, 1, 2]},
        accelerators={"gpu-2": ["00000000:49:00.0"]},
        smt=2,
        job_script="#!/bin/sh\n",
    )
    assert start is not None
    resource = start.resources[0]
    assert resource.hwthreads == [0, 1, 2] and resource.accelerators == ["00000000:49:00.0"]
    assert start.shared == "multi_user" and start.smt == 2 and start.meta_data["jobScript"] == "#!/bin/sh\n"


# --- refusals ------------------------------------------------------------------------------------------------------


def test_steps_are_refused() -> None:
    row = sacct_row(
        FIELDS,
        [
            "5.batch",
            "5.batch",
            "",
            "COMPLETED",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:01",
            "2025-01-01T00:00:02",
            "n1",
        ],
    )
    with pytest.raises(ValueError, match="not step 'batch'"):
        start_job(row, "c")
    with pytest.raises(ValueError, match="not step 'batch'"):
        stop_job(row, "c")


def test_array_task_needs_jobidraw() -> None:
    fields = [f for f in FIELDS if f != "JobIDRaw"]
    row = sacct_row(
        fields,
        ["7_3", "u", "COMPLETED", "2025-01-01T00:00:00", "2025-01-01T00:00:01", "2025-01-01T00:00:02", "n1"],
    )
    with pytest.raises(ValueError, match="JobIDRaw"):
        start_job(row, "c")
    with_raw = sacct_row(
        FIELDS,
        [
            "7_3",
            "9",
            "u",
            "COMPLETED",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:01",
            "2025-01-01T00:00:02",
            "n1",
        ],
    )
    start = start_job(with_raw, "c")
    assert start is not None and start.job_id == 9 and start.array_job_id == 7


def test_missing_user_nodes_end_and_backwards_times_are_refused() -> None:
    base = [
        "5",
        "5",
        "u",
        "COMPLETED",
        "2025-01-01T00:00:00",
        "2025-01-01T00:00:01",
        "2025-01-01T00:00:02",
        "n1",
    ]

    def with_(i: int, value: str) -> SacctRow:
        values = list(base)
        values[i] = value
        return sacct_row(FIELDS, values)

    with pytest.raises(ValueError, match="no User"):
        start_job(with_(2, ""), "c")
    with pytest.raises(ValueError, match="no NodeList"):
        start_job(with_(7, "None assigned"), "c")
    with pytest.raises(ValueError, match="no End"):
        stop_job(with_(6, "Unknown"), "c")
    with pytest.raises(ValueError, match="before it starts"):
        stop_job(with_(6, "2024-12-31T23:59:59"), "c")
    with pytest.raises(ValueError, match="no cc-backend job state"):
        stop_job(with_(3, "REQUEUED"), "c")


# --- the line-protocol wrapping ------------------------------------------------------------------------------------


def test_event_lines_round_trip_through_line_protocol() -> None:
    row = next(r for r in job_rows() if r.node_list == "c1-[9-10]")
    start, stop = start_job(row, "fox"), stop_job(row, "fox")
    assert start is not None and stop is not None
    text = (
        format_line(job_event_line(start, 1758868030)) + "\n" + format_line(job_event_line(stop, 1758868030))
    )
    assert text.startswith('job,function=start_job event="{\\"jobId\\":1956908,')
    parsed = parse_payload(text, now=0)
    assert not parsed.problems and len(parsed.lines) == 2
    decoded: list[Any] = []
    for line, kind in zip(parsed.lines, (StartJob, StopJob), strict=True):
        payload = line.fields["event"]
        assert isinstance(payload, str)
        decoded.append(msgspec.json.decode(payload, type=kind))
    assert decoded == [start, stop]
    assert [line.tags["function"] for line in parsed.lines] == ["start_job", "stop_job"]
