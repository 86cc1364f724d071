"""cc-backend `start_job` / `stop_job` payloads built from sacct job rows.

cc-backend (internal/api/nats.go) decodes these JSON payloads with `DisallowUnknownFields`, so a single
misspelt or extra key makes it drop the event with only a log line. The structs below therefore mirror its
Go types field for field (cc-lib `schema.Job` for start_job, `StopJobAPIRequest` for stop_job), forbid
unknown fields when decoding (the tests decode cc-backend's own example payloads with them), and use
cc-backend's defaults as theirs so `omit_defaults` never changes what cc-backend ends up with.

What cc-backend then checks (importer.SanityChecks), and the builders guarantee: the user is not empty,
`resources` is not empty and has exactly `numNodes` entries, `numNodes` >= 1, `jobState` is one of its
states; for stop_job, `stopTime` >= `startTime`. The cluster must exist in cc-backend's configuration,
which only the caller can know.

The wire format around the payload is `job,function=start_job event="<JSON>" <ts>`; `start_job_line` and
`stop_job_line` build it with `schemas.lineprotocol`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

import msgspec

from schemas.lineprotocol import Line, event
from schemas.noderange import expand
from schemas.slurm.sacct import SacctRow
from schemas.slurm.values import epoch_seconds, format_timestamp, parse_tres

__all__ = [
    "CC_JOB_STATES",
    "CcJobState",
    "Resource",
    "StartJob",
    "StopJob",
    "Tag",
    "cc_job_state",
    "start_job",
    "start_job_line",
    "stop_job",
    "stop_job_line",
]

CcJobState = Literal[
    "boot_fail",
    "cancelled",
    "completed",
    "deadline",
    "failed",
    "node_fail",
    "out_of_memory",
    "pending",
    "preempted",
    "running",
    "suspended",
    "timeout",
]
"""cc-lib `schema.JobState`: the values `JobState.Valid()` accepts."""

CC_JOB_STATES: Final[frozenset[str]] = frozenset(get_args(CcJobState))

Shared = Literal["none", "single_user", "multi_user"]
"""cc-lib `Job.Shared`: how the job's nodes are shared."""

_SLURM_TO_CC: Final[dict[str, CcJobState]] = {
    "BOOT_FAIL": "boot_fail",
    "CANCELLED": "cancelled",
    "COMPLETED": "completed",
    "DEADLINE": "deadline",
    "FAILED": "failed",
    "NODE_FAIL": "node_fail",
    "OUT_OF_MEMORY": "out_of_memory",
    "PENDING": "pending",
    "PREEMPTED": "preempted",
    "RUNNING": "running",
    "SUSPENDED": "suspended",
    "TIMEOUT": "timeout",
    "REVOKED": "cancelled",  # a federation sibling removed because another cluster runs the job
}

_NOT_ENDED: Final = frozenset({"pending", "running", "suspended"})


def cc_job_state(slurm_state: str) -> CcJobState:
    """The cc-backend state for a Slurm state word (`OUT_OF_MEMORY` -> `out_of_memory`).

    `CANCELLED by <uid>` must be split first (`values.parse_state`; `SacctRow.state` already is). States with
    no cc-backend counterpart (REQUEUED, RESIZING, ...) raise `ValueError`: they are not an end of the job,
    and guessing one would close a job cc-backend should keep open.
    """
    try:
        return _SLURM_TO_CC[slurm_state]
    except KeyError:
        raise ValueError(f"Slurm state {slurm_state!r} has no cc-backend job state") from None


class Tag(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """cc-lib `schema.Tag`: attached to the job when cc-backend creates it."""

    type: str
    name: str
    scope: str = ""
    id: int = 0


class Resource(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """cc-lib `schema.Resource`: one node of the job."""

    hostname: str
    hwthreads: list[int] = []
    """OS processor ids the job may use on this node."""
    accelerators: list[str] = []
    """Accelerator ids; they must equal the collector's `type-id` for the card (e.g. `00000000:49:00.0`)."""
    configuration: str = ""


class StartJob(
    msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False
):
    """The start_job payload (cc-lib `schema.Job`, the fields a job start can carry).

    Defaults are cc-backend's own (`shared` "none", `monitoringStatus` 1, `jobState` forced to running),
    so leaving a field at its default and omitting it from the JSON mean the same to cc-backend.
    `exclusive` is not a field: current cc-lib replaced it by `shared`, and sending it would make
    cc-backend reject the whole event as an unknown field.
    """

    job_id: int
    cluster: str
    user: str
    resources: list[Resource]
    num_nodes: int
    start_time: int
    """Epoch seconds."""
    sub_cluster: str = ""
    """Left empty, cc-backend assigns it from its cluster configuration."""
    partition: str = ""
    project: str = ""
    shared: Shared = "none"
    job_state: CcJobState = "running"
    num_hwthreads: int = 0
    num_acc: int = 0
    smt: int = 0
    walltime: int = 0
    """Requested wall time in seconds."""
    requested_memory: int = 0
    """MB; the builder puts sacct's ReqMem here (since Slurm 21.08 the job's total request)."""
    array_job_id: int = 0
    submit_time: int = 0
    """Epoch seconds."""
    monitoring_status: int = 1
    meta_data: dict[str, str] = {}
    """`jobName`, `slurmInfo`, `jobScript`."""
    tags: list[Tag] = []
    duration: int = 0
    energy: float = 0.0


class StopJob(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """The stop_job payload (cc-backend `StopJobAPIRequest`); (jobId, cluster, startTime) find the job."""

    job_id: int
    stop_time: int
    """Epoch seconds, >= startTime."""
    cluster: str = ""
    start_time: int = 0
    job_state: CcJobState | Literal[""] = ""
    """Empty means `completed` to cc-backend; the builder always sets it."""


def _true_job_id(row: SacctRow) -> int:
    """cc-backend's jobId is the job's own id; for array tasks and het components only JobIDRaw has it."""
    job = row.job
    if row.job_id_raw is None and job is not None and (job.is_array or (job.het_offset or 0) > 0):
        raise ValueError(
            f"line {row.line}: job {job.base} is an array task or het component and the field list has no "
            "JobIDRaw, so its own job id is unknown"
        )
    return row.job_id


def _count(tres: dict[str, str], name: str) -> int:
    value = tres.get(name, "")
    return int(value) if value.isdigit() else 0


def _slurm_info(row: SacctRow, job_id: int) -> str:
    """A short `Key=value` summary of the sacct row, for cc-backend's job view (`metaData.slurmInfo`).

    Named after sacct's columns: this is not `scontrol show job` output and should not pretend to be.
    """
    job = row.job
    items: list[tuple[str, object]] = [("JobIDRaw", job_id)]
    if job is not None and (job.is_array or job.is_het):
        items.append(
            ("JobID", f"{job.base}_{job.array_task_id}" if job.is_array else f"{job.base}+{job.het_offset}")
        )
    items += [
        ("JobName", row.job_name),
        ("User", row.user),
        ("Account", row.account),
        ("Partition", row.partition),
        ("Reservation", row.reservation),
        ("NodeList", row.node_list),
        ("State", row.state if row.cancelled_by is None else f"{row.state} by {row.cancelled_by}"),
        ("Submit", format_timestamp(row.submit) if row.submit else ""),
        ("Start", format_timestamp(row.start) if row.start else ""),
        ("TimelimitRaw", row.time_limit if row.time_limit is not None else ""),
        ("ReqCPUS", row.req_cpus if row.req_cpus is not None else ""),
        ("ReqTRES", row.req_tres),
        ("AllocTRES", row.alloc_tres),
    ]
    return "\n".join(f"{key}={value}" for key, value in items if value != "")


def start_job(
    row: SacctRow,
    cluster: str,
    *,
    shared: Shared = "none",
    hwthreads: Mapping[str, list[int]] | None = None,
    accelerators: Mapping[str, list[str]] | None = None,
    smt: int = 0,
    job_script: str = "",
) -> StartJob | None:
    """The start_job payload for a sacct job row; None when the job has not started (PENDING, or cancelled
    while pending: sacct's Start is Unknown/None), because cc-backend only knows running and ended jobs.

    `resources` are the expanded NodeList (one entry per node, so `numNodes` = their count). sacct does not
    know which CPUs and cards a job got; `hwthreads`/`accelerators` (hostname -> ids, from the node
    producers) fill them in when given. `numHwthreads`/`numAcc` come from AllocTRES (`cpu=`, `gres/gpu=`),
    falling back to NCPUS/ReqCPUS; `walltime` from the time limit; `requestedMemory` is ReqMem in MB (left
    out for an old per-CPU `Mc` value).
    Raises `ValueError` for a step row, a row without user or nodes, an array task without JobIDRaw, or a
    state cc-backend has no name for (REQUEUED, RESIZING; see `cc_job_state`).
    """
    if row.step:
        raise ValueError(f"line {row.line}: start_job is for a job row, not step {row.step!r}")
    state = cc_job_state(row.state)
    if state == "pending" or row.start is None:
        return None
    job_id = _true_job_id(row)
    if not row.user:
        raise ValueError(f"line {row.line}: job {job_id} has no User; cc-backend requires one")
    if not row.node_list:
        raise ValueError(f"line {row.line}: job {job_id} started but has no NodeList")
    hosts = expand(row.node_list)
    resources = [
        Resource(
            hostname=host,
            hwthreads=list(hwthreads.get(host, ())) if hwthreads else [],
            accelerators=list(accelerators.get(host, ())) if accelerators else [],
        )
        for host in hosts
    ]
    tres = parse_tres(row.alloc_tres)
    num_hwthreads = _count(tres, "cpu") or row.alloc_cpus or row.req_cpus or 0
    meta = {"jobName": row.job_name, "slurmInfo": _slurm_info(row, job_id), "jobScript": job_script}
    job = row.job
    return StartJob(
        job_id=job_id,
        cluster=cluster,
        user=row.user,
        resources=resources,
        num_nodes=len(resources),
        start_time=epoch_seconds(row.start),
        partition=row.partition,
        project=row.account,
        shared=shared,
        num_hwthreads=num_hwthreads,
        num_acc=_count(tres, "gres/gpu"),
        smt=smt,
        walltime=row.time_limit * 60 if isinstance(row.time_limit, int) else 0,
        requested_memory=(row.req_mem_kib or 0) // 1024 if not row.req_mem_per_cpu else 0,
        array_job_id=job.base if job is not None and job.is_array else 0,
        submit_time=epoch_seconds(row.submit),
        meta_data={key: value for key, value in meta.items() if value},
    )


def stop_job(row: SacctRow, cluster: str) -> StopJob | None:
    """The stop_job payload for a sacct job row that has ended; None while it is pending, running or
    suspended, and for a job that never started (no start_job was sent, so there is nothing to stop).

    `CANCELLED by <uid>` -> `cancelled`, OUT_OF_MEMORY -> `out_of_memory`, NODE_FAIL -> `node_fail`, ...
    (`cc_job_state`). Raises `ValueError` for a step row, an End before Start, or an ended job without End.
    """
    if row.step:
        raise ValueError(f"line {row.line}: stop_job is for a job row, not step {row.step!r}")
    state = cc_job_state(row.state)
    if state in _NOT_ENDED or row.start is None:
        return None
    job_id = _true_job_id(row)
    if row.end is None:
        raise ValueError(f"line {row.line}: job {job_id} is {row.state} but has no End time")
    start, stop = epoch_seconds(row.start), epoch_seconds(row.end)
    if stop < start:
        raise ValueError(f"line {row.line}: job {job_id} ends ({stop}) before it starts ({start})")
    return StopJob(job_id=job_id, cluster=cluster, start_time=start, stop_time=stop, job_state=state)


_ENCODER: Final = msgspec.json.Encoder()


def start_job_line(payload: StartJob, time: int) -> Line:
    """`job,function=start_job event="<JSON>" <time>` (cc-backend ignores the line's own timestamp)."""
    return event("job", _ENCODER.encode(payload).decode(), time=time, function="start_job")


def stop_job_line(payload: StopJob, time: int) -> Line:
    """`job,function=stop_job event="<JSON>" <time>`."""
    return event("job", _ENCODER.encode(payload).decode(), time=time, function="stop_job")
