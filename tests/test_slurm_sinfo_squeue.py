"""sinfo -> ClusterAttributes and squeue --json -> SlurmJob, on inputs written after Slurm 22.05's formats:
sinfo's `-O type:|` lines and squeue's `openapi/v0.0.38` job dump (src/plugins/openapi/v0.0.38/jobs.c),
plus the structured numbers of data_parser v0.0.39+ (Slurm >= 23.02)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from hpcbus.schemas.noderange import expand_all
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, SacctRow, parse_sacct_line
from hpcbus.schemas.slurm.sacct import to_slurm_job as sacct_to_slurm_job
from hpcbus.schemas.slurm.sinfo import (
    SINFO_NODES_ARGV,
    SINFO_PARTITIONS_ARGV,
    cluster_attributes,
    node_states,
    parse_node_states,
    parse_partitions,
)
from hpcbus.schemas.slurm.squeue import SQUEUE_ARGV, parse_squeue_json
from hpcbus.schemas.sonar.types import ClusterAttributes, ClusterNodes, ClusterPartition, SlurmJob

CET_2 = timezone(timedelta(hours=2))

# --- sinfo ---------------------------------------------------------------------------------------------------

# `sinfo -h -a -O Partition:|,NodeList:|` on a Fox-like cluster: the default partition has a `*`, a
# partition can come on several lines (sinfo groups by node configuration), a hidden one has no nodes.
PARTITIONS = """\
normal*|c1-[5-6,8-9,12-20,25,28],c1-[21,23]|
normal*|c1-29|
bigmem|bigmem-[1-2],c1-29|
accel|gpu-[1-2,4-16]|
accel_long|gpu-[1-2,4-16]|
hidden|(null)|
"""

# `sinfo -h -a -e -O NodeList:|,StateComplete:|`
NODES = """\
c1-[5-6,8]|mixed|
c1-[9-10]|allocated|
c1-[12-20]|idle|
c1-[21,23]|idle+drain|
c1-[25,28-29]|mixed|
bigmem-[1-2]|allocated|
gpu-[1-2,4-10]|mixed|
gpu-11|down+drain+not_responding|
gpu-[12-16]|DRAIN+IDLE|
"""


def test_sinfo_commands_are_sonars() -> None:
    assert SINFO_PARTITIONS_ARGV == ("sinfo", "-h", "-a", "-O", "Partition:|,NodeList:|")
    assert SINFO_NODES_ARGV == ("sinfo", "-h", "-a", "-e", "-O", "NodeList:|,StateComplete:|")


def test_partitions_are_merged_and_compressed() -> None:
    partitions, problems = parse_partitions(PARTITIONS)
    assert problems == []
    assert partitions == [
        ClusterPartition(name="normal", nodes=["c1-[5-6,8-9,12-21,23,25,28-29]"]),
        ClusterPartition(name="bigmem", nodes=["bigmem-[1-2]", "c1-29"]),
        ClusterPartition(name="accel", nodes=["gpu-[1-2,4-16]"]),
        ClusterPartition(name="accel_long", nodes=["gpu-[1-2,4-16]"]),
        ClusterPartition(name="hidden", nodes=[]),
    ]
    normal = expand_all(partitions[0].nodes)
    assert len(normal) == 18 and "c1-29" in normal and "c1-7" not in normal


def test_nodes_grouped_by_state_set() -> None:
    nodes, problems = parse_node_states(NODES)
    assert problems == []
    assert nodes == [
        ClusterNodes(names=["c1-[5-6,8,25,28-29]", "gpu-[1-2,4-10]"], states=["MIXED"]),
        ClusterNodes(names=["bigmem-[1-2]", "c1-[9-10]"], states=["ALLOCATED"]),
        ClusterNodes(names=["c1-[12-20]"], states=["IDLE"]),
        ClusterNodes(names=["c1-[21,23]", "gpu-[12-16]"], states=["IDLE", "DRAIN"]),
        ClusterNodes(names=["gpu-11"], states=["DOWN", "DRAIN", "NOT_RESPONDING"]),
    ]


@pytest.mark.parametrize(
    ("text", "states"),
    [
        ("idle", ["IDLE"]),
        ("mixed+drain", ["MIXED", "DRAIN"]),
        ("idle+cloud+powered_down", ["IDLE", "CLOUD", "POWERED_DOWN"]),
        ("idle*", ["IDLE", "NOT_RESPONDING"]),  # %T forms
        ("drained~", ["DRAINED", "POWERED_DOWN"]),
        ("allocated+", ["ALLOCATED", "COMPLETING"]),
        ("mixed@", ["MIXED", "REBOOT_REQUESTED"]),
        (" down ", ["DOWN"]),
    ],
)
def test_node_states(text: str, states: list[str]) -> None:
    assert node_states(text) == states


@pytest.mark.parametrize("text", ["", "*", "idle++drain", "idle+dr ain", "idle+1"])
def test_node_states_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="node state"):
        node_states(text)


def test_percent_format_without_trailing_bar_and_bad_lines() -> None:
    text = "c1-[1-2]|idle*\nc1-3|mixed|\nc1-[4|idle|\nc1-5\nc1-6|id le|\n\n"
    nodes, problems = parse_node_states(text, place="sinfo-nodes")
    assert nodes == [
        ClusterNodes(names=["c1-[1-2]"], states=["IDLE", "NOT_RESPONDING"]),
        ClusterNodes(names=["c1-3"], states=["MIXED"]),
    ]
    assert [(p.line, p.path) for p in problems] == [(3, "NodeList"), (4, ""), (5, "StateComplete")]
    assert str(problems[1]) == "sinfo-nodes:4: sinfo: 1 fields, expected NodeList|StateComplete|"
    partitions, problems = parse_partitions("*|c1|\nok|c[1|\nfine|c2|\n")
    assert partitions == [ClusterPartition(name="fine", nodes=["c2"])]
    assert [(p.line, p.path) for p in problems] == [(1, "Partition"), (2, "NodeList")]


def test_cluster_attributes_validate_against_sonar_schema() -> None:
    when = datetime(2026, 3, 3, 15, 36, 57, tzinfo=CET_2)
    attributes, problems = cluster_attributes(PARTITIONS, NODES, cluster="fox.educloud.no", time=when)
    assert problems == []
    assert attributes.slurm and attributes.time == "2026-03-03T15:36:57+02:00"
    wire = msgspec.json.encode(attributes)
    assert msgspec.json.decode(wire, type=ClusterAttributes) == attributes
    # every node in a partition has a state, and no node is in two state groups
    in_groups = [name for group in attributes.nodes for name in expand_all(group.names)]
    assert len(in_groups) == len(set(in_groups))
    assert {n for p in attributes.partitions for n in expand_all(p.nodes)} <= set(in_groups)


# --- squeue --json (Slurm 22.05, openapi/v0.0.38) -------------------------------------------------------------

NO_VAL = 0xFFFFFFFE
SUBMIT = 1757276166  # 2025-09-07T20:16:06Z
START = 1757678772  # 2025-09-12T12:06:12Z


def job_0038(**overrides: Any) -> dict[str, Any]:
    """Every key `dump_job_info` writes in 22.05, with the values a plain running batch job has."""
    job: dict[str, Any] = {
        "account": "ac10000",
        "accrue_time": SUBMIT,
        "admin_comment": "",
        "array_job_id": 0,
        "array_task_id": None,
        "array_max_tasks": 0,
        "array_task_string": "",
        "association_id": 17,
        "batch_features": "",
        "batch_flag": True,
        "batch_host": "gpu-2",
        "flags": ["JOB_CPUS_SET", "JOB_WAS_RUNNING"],
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": "fox",
        "cluster_features": "",
        "command": "/fp/homes01/u1/run.sh",
        "comment": "",
        "contiguous": False,
        "core_spec": None,
        "thread_spec": None,
        "cores_per_socket": None,
        "billable_tres": 32.0,
        "cpus_per_task": None,
        "cpu_frequency_minimum": None,
        "cpu_frequency_maximum": None,
        "cpu_frequency_governor": None,
        "cpus_per_tres": "",
        "deadline": 0,
        "delay_boot": 0,
        "dependency": "",
        "derived_exit_code": 0,
        "eligible_time": SUBMIT,
        "end_time": START + 20160 * 60,
        "excluded_nodes": "",
        "exit_code": 0,
        "features": "",
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": ["gpu:a100:1(IDX:0)"],
        "group_id": 5000,
        "job_id": 1879824,
        "job_resources": {
            "nodes": "gpu-2",
            "allocated_cores": 32,
            "allocated_hosts": 1,
            "allocated_nodes": [
                {
                    "sockets": {},
                    "nodename": "gpu-2",
                    "cpus_used": 0,
                    "memory_used": 0,
                    "memory_allocated": 131072,
                }
            ],
        },
        "job_state": "RUNNING",
        "last_sched_evaluation": START,
        "licenses": "",
        "max_cpus": 0,
        "max_nodes": 0,
        "mcs_label": "",
        "memory_per_tres": "",
        "name": "siamE3F1",
        "nodes": "gpu-2",
        "nice": None,
        "tasks_per_core": None,
        "tasks_per_node": 0,
        "tasks_per_socket": None,
        "tasks_per_board": 0,
        "cpus": 32,
        "node_count": 1,
        "tasks": 1,
        "het_job_id": 0,
        "het_job_id_set": "",
        "het_job_offset": 0,
        "partition": "accel_long",
        "memory_per_node": 131072,
        "memory_per_cpu": None,
        "minimum_cpus_per_node": 32,
        "minimum_tmp_disk_per_node": 0,
        "preempt_time": 0,
        "pre_sus_time": 0,
        "priority": 11429,
        "profile": None,
        "qos": "normal",
        "reboot": False,
        "required_nodes": "",
        "requeue": False,
        "resize_time": 0,
        "restart_cnt": 0,
        "resv_name": "",
        "shared": None,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
        "sockets_per_board": 0,
        "sockets_per_node": None,
        "start_time": START,
        "state_description": "",
        "state_reason": "None",
        "standard_error": "/fp/homes01/u1/slurm-1879824.out",
        "standard_input": "/dev/null",
        "standard_output": "/fp/homes01/u1/slurm-1879824.out",
        "submit_time": SUBMIT,
        "suspend_time": 0,
        "system_comment": "",
        "time_limit": 20160,
        "time_minimum": 0,
        "threads_per_core": None,
        "tres_bind": "",
        "tres_freq": "",
        "tres_per_job": "",
        "tres_per_node": "gres:gpu:a100:1",
        "tres_per_socket": "",
        "tres_per_task": "",
        "tres_req_str": "cpu=32,mem=128G,node=1,billing=32,gres/gpu=1,gres/gpu:a100=1",
        "tres_alloc_str": "cpu=32,mem=128G,node=1,billing=32,gres/gpu=1,gres/gpu:a100=1",
        "user_id": 2101000,
        "user_name": "uc-10000",
        "wckey": "",
        "current_working_directory": "/fp/homes01/u1",
    }
    job.update(overrides)
    return job


def squeue_0038(*jobs: dict[str, Any], errors: list[Any] | None = None) -> bytes:
    return json.dumps(
        {
            "meta": {
                "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
                "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
            },
            "errors": errors or [],
            "jobs": list(jobs),
        },
        indent=3,
    ).encode()


PENDING_ARRAY = job_0038(
    job_id=1903070,
    array_job_id=1903070,
    array_task_id=None,
    array_task_string="1-5%2",
    array_max_tasks=2,
    job_state="PENDING",
    state_reason="JobArrayTaskLimit",
    name="train_video_gat",
    user_name="uc-10002",
    account="ac10001",
    nodes="",
    job_resources=None,
    batch_host="",
    start_time=1758000000,  # the scheduler's estimate, not a start
    end_time=1758000000 + 2879 * 60,
    time_limit=2879,
    priority=11174,
    cpus=20,
    memory_per_node=81920,
    gres_detail=[],
    tres_alloc_str="",
    tres_req_str="cpu=20,mem=80G,node=1,billing=20",
)
RUNNING_TASK = job_0038(
    job_id=1903072,
    array_job_id=1903070,
    array_task_id=2,
    array_task_string="",
    name="train_video_gat",
    nodes="gpu-[4-5]",
    node_count=2,
)
HET_1 = job_0038(
    job_id=1467922,
    het_job_id=1467921,
    het_job_offset=1,
    het_job_id_set="1467921-1467922",
    nodes="c1-5,c1-[9-10]",
    node_count=3,
    time_limit=None,
    priority=NO_VAL,
)
COMPLETING = job_0038(job_id=5, job_state="COMPLETING")


def as_json(job: SlurmJob) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(msgspec.json.encode(job))
    return data


def test_squeue_command() -> None:
    assert SQUEUE_ARGV == ("squeue", "--all", "--json")


def test_running_job_matches_what_sonars_sacct_path_says() -> None:
    (job,) = parse_squeue_json(squeue_0038(job_0038()), CET_2)
    assert isinstance(job, SlurmJob)
    assert as_json(job) == {
        "job_id": 1879824,
        "job_name": "siamE3F1",
        "job_state": "RUNNING",
        "user_name": "uc-10000",
        "account": "ac10000",
        "submit_time": "2025-09-07T22:16:06+02:00",
        "time_limit": 20160 * 60 + 2,
        "partition": "accel_long",
        "nodes": ["gpu-2"],
        "priority": 11431,
        "gres_detail": ["gpu:a100:1(IDX:0)"],
        "requested_resources": "cpu=32,mem=128G,node=1,billing=32,gres/gpu=1,gres/gpu:a100=1",
        "allocated_resources": "cpu=32,mem=128G,node=1,billing=32,gres/gpu=1,gres/gpu:a100=1",
        "requested_cpus": 32,
        "minimum_cpus_per_node": 32,
        "requested_memory_per_node": 134217728,
        "requested_node_count": 1,
        "start_time": "2025-09-12T14:06:12+02:00",
    }
    # the same job from the sacct corpus line (Sonar's conversion): the shared fields agree
    line = (
        "1879824|1879824|uc-10000|ac10000|RUNNING|2025-09-12T14:06:12|Unknown||||||1192379|0:0|||||32|128G|1||"
        "2025-09-07T22:16:06|00:00:00|00:00:00|20160|00:00:00|gpu-2|accel_long|"
        "billing=32,cpu=32,gres/gpu:a100=1,gres/gpu=1,mem=128G,node=1|11429|siamE3F1"
    )
    row = parse_sacct_line(line, SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    from_sacct = as_json(sacct_to_slurm_job(row, sonar_compat=True))
    shared = {
        "job_id",
        "job_name",
        "job_state",
        "user_name",
        "account",
        "submit_time",
        "time_limit",
        "partition",
        "nodes",
        "priority",
        "requested_cpus",
        "requested_memory_per_node",
        "requested_node_count",
        "start_time",
    }
    assert {k: from_sacct[k] for k in shared} == {k: as_json(job)[k] for k in shared}


def test_arrays_het_jobs_and_filtering() -> None:
    out = list(parse_squeue_json(squeue_0038(PENDING_ARRAY, RUNNING_TASK, HET_1, COMPLETING), UTC))
    assert all(isinstance(x, SlurmJob) for x in out) and len(out) == 3  # COMPLETING is not asked for
    pending, task, het = (as_json(x) for x in out if isinstance(x, SlurmJob))
    assert pending["job_id"] == 1903070 and pending["array_job_id"] == 1903070
    assert "array_task_id" not in pending and "nodes" not in pending and "start_time" not in pending
    assert pending["time_limit"] == 2879 * 60 + 2 and pending["requested_memory_per_node"] == 80 * 1024 * 1024
    assert (task["job_id"], task["array_job_id"], task["array_task_id"]) == (1903072, 1903070, 2)
    assert task["nodes"] == ["gpu-[4-5]"] and task["requested_node_count"] == 2
    assert (het["job_id"], het["het_job_id"], het["het_job_offset"]) == (1467922, 1467921, 1)
    assert het["time_limit"] == 1  # v0.0.38 writes INFINITE as null
    assert "priority" not in het  # NO_VAL
    assert het["nodes"] == ["c1-5", "c1-[9-10]"]
    assert het["submit_time"] == "2025-09-07T20:16:06+00:00"
    partition_limit = job_0038(time_limit=NO_VAL)
    (job,) = parse_squeue_json(squeue_0038(partition_limit), UTC)
    assert isinstance(job, SlurmJob) and job.time_limit == 0
    completing = list(parse_squeue_json(squeue_0038(COMPLETING), UTC, states=["COMPLETING"]))
    assert len(completing) == 1 and isinstance(completing[0], SlurmJob)


def test_every_record_passes_the_sonar_schema() -> None:
    for job in parse_squeue_json(squeue_0038(job_0038(), PENDING_ARRAY, RUNNING_TASK, HET_1), CET_2):
        assert isinstance(job, SlurmJob)
        assert msgspec.json.decode(msgspec.json.encode(job), type=SlurmJob) == job


def test_structured_numbers_of_newer_slurm() -> None:
    """data_parser v0.0.39+ (Slurm >= 23.02): numbers as {set, infinite, number}, job_state a list."""

    def n(number: int = 0, *, set_: bool = True, infinite: bool = False) -> dict[str, Any]:
        return {"set": set_, "infinite": infinite, "number": number}

    job = {
        "job_id": 42,
        "name": "x",
        "job_state": ["PENDING", "REQUEUED"],
        "user_name": "u",
        "array_job_id": n(40),
        "array_task_id": n(3),
        "het_job_id": n(0),
        "het_job_offset": n(set_=False),
        "submit_time": n(SUBMIT),
        "start_time": n(0),
        "time_limit": n(infinite=True),
        "priority": n(7),
        "cpus": n(4),
        "node_count": n(1),
        "memory_per_node": n(set_=False),
        "nodes": "",
    }
    (out,) = parse_squeue_json(json.dumps({"jobs": [job], "errors": [], "warnings": []}), UTC)
    assert isinstance(out, SlurmJob)
    assert as_json(out) == {
        "job_id": 42,
        "job_name": "x",
        "job_state": "PENDING",
        "array_job_id": 40,
        "array_task_id": 3,
        "user_name": "u",
        "submit_time": "2025-09-07T20:16:06+00:00",
        "time_limit": 1,
        "priority": 9,
        "requested_cpus": 4,
        "requested_node_count": 1,
    }


def test_errors_and_bad_jobs_are_problems() -> None:
    errors = [{"error_number": 1, "error": "Unable to contact slurm controller (connect failure)"}]
    no_submit = job_0038(job_id=9, submit_time=0)
    no_id = job_0038(job_id=None)
    out = list(
        parse_squeue_json(squeue_0038(no_submit, job_0038(), no_id, errors=errors), UTC, place="squeue")
    )
    problems = [p for p in out if isinstance(p, Problem)]
    assert [(p.path, p.kind) for p in problems] == [
        ("errors[0]", "squeue"),
        ("jobs[0]", "squeue"),
        ("jobs[2]", "squeue"),
    ]
    assert "connect failure" in problems[0].reason and "no submit_time" in problems[1].reason
    assert sum(isinstance(x, SlurmJob) for x in out) == 1
    (broken,) = parse_squeue_json(b"squeue: error: Invalid user", UTC)
    assert isinstance(broken, Problem) and "not squeue --json output" in broken.reason
    (wrong_type,) = parse_squeue_json(b'{"jobs": [{"job_id": "12"}]}', UTC)
    assert isinstance(wrong_type, Problem)
