"""cc-backend `start_job` / `stop_job` payloads built from sacct job rows.

The payload structs, cc-backend's checks and the event line are `schemas.ccbackend`'s; this module only
knows how a sacct row fills them (`start_job`, `stop_job`): what cc-backend requires (a user, a node list,
the job's own id rather than an array task's) is checked here and reported as `ValueError` naming the row.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcbus.schemas.ccbackend import Resource, Shared, StartJob, StopJob, cc_job_state
from hpcbus.schemas.noderange import expand
from hpcbus.schemas.slurm.sacct import SacctRow
from hpcbus.schemas.slurm.values import TERMINAL_STATES, epoch_seconds, format_timestamp, parse_tres

__all__ = ["start_job", "stop_job"]


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
    if row.state not in TERMINAL_STATES or row.start is None:
        return None
    job_id = _true_job_id(row)
    if row.end is None:
        raise ValueError(f"line {row.line}: job {job_id} is {row.state} but has no End time")
    start, stop = epoch_seconds(row.start), epoch_seconds(row.end)
    if stop < start:
        raise ValueError(f"line {row.line}: job {job_id} ends ({stop}) before it starts ({start})")
    return StopJob(job_id=job_id, cluster=cluster, start_time=start, stop_time=stop, job_state=state)
