"""`squeue --json` -> Sonar `SlurmJob` records for the jobs that are queued or running.

sacct (slurmdbd) lags behind and is expensive on big sites; squeue asks slurmctld for its live view, which
is what a "what is running now" sample wants. Slurm 22.05 (Debian bookworm) prints squeue's JSON with the
REST plugin `openapi/v0.0.38` (src/plugins/openapi/v0.0.38/jobs.c `dump_job_info`): plain integers, `null`
for NO_VAL/INFINITE on some fields, `job_state` a string. Slurm >= 23.02 (data_parser v0.0.39+) prints
numbers as `{"set": .., "infinite": .., "number": ..}` and `job_state` as a list; both shapes are read.

Mapping to Sonar's fields (so records match what `sacct.to_slurm_job` gives for the same job):
- `time_limit` = minutes * 60 + 2 like Sonar's sacct path (seconds as ExtendedUint); no limit (v0.0.38
  `null`, v0.0.39 `infinite`) -> 1; NO_VAL (the partition's limit applies) -> omitted.
- `priority` + 2; `nodes` split at top-level commas (not expanded); `start_time` only for RUNNING jobs
  (for a pending job squeue's start_time is the scheduler's estimate, not a start).
- `requested_memory_per_node` = `memory_per_node` (MB) in KiB; a `memory_per_cpu` request is left out.
  Note that squeue's value is per node, while sacct's ReqMem (and so Sonar's value) is the job total.
- array: `array_job_id` when not 0, `array_task_id` when not null (a pending array's own record has
  `array_task_string` like `1-5%2` and no task id); het: `het_job_id`/`het_job_offset`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, tzinfo
from typing import Final

import msgspec

from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.values import UNLIMITED, Limit, format_timestamp, split_nodelist, to_extended_uint
from hpcbus.schemas.sonar.types import SlurmJob

__all__ = ["SQUEUE_ARGV", "Number", "SqueueJob", "SqueueOutput", "parse_squeue_json", "to_slurm_job"]

SQUEUE_ARGV: Final = ("squeue", "--all", "--json")
"""`--all`: hidden partitions too (squeue --json dumps every field whatever --format says)."""

KIND: Final = "squeue"

_NO_VAL: Final = frozenset({0xFFFFFFFE, 0xFFFE, 0xFFFFFFFFFFFFFFFE})
_INFINITE: Final = frozenset({0xFFFFFFFF, 0xFFFF, 0xFFFFFFFFFFFFFFFF})


class Number(msgspec.Struct, gc=False):
    """A number as data_parser v0.0.39+ prints it (`{"set": true, "infinite": false, "number": 60}`)."""

    set: bool = False
    infinite: bool = False
    number: int = 0


Num = int | Number | None


def _value(n: Num) -> Limit:
    """An int, `UNLIMITED`, or None for every spelling of "no value" in both JSON generations."""
    if n is None:
        return None
    if isinstance(n, Number):
        if n.infinite:
            return UNLIMITED
        return n.number if n.set else None
    if n in _NO_VAL:
        return None
    if n in _INFINITE:
        return UNLIMITED
    return n


def _int(n: Num) -> int:
    value = _value(n)
    return value if isinstance(value, int) else 0


class SqueueJob(msgspec.Struct, gc=False):
    """The fields of one `jobs[]` entry that a `SlurmJob` needs; the many others are skipped while decoding."""

    job_id: Num = None
    name: str | None = None
    job_state: str | list[str] | None = None
    user_name: str | None = None
    account: str | None = None
    partition: str | None = None
    resv_name: str | None = None
    nodes: str | None = None
    array_job_id: Num = None
    array_task_id: Num = None
    array_task_string: str | None = None
    het_job_id: Num = None
    het_job_offset: Num = None
    submit_time: Num = None
    start_time: Num = None
    time_limit: Num | msgspec.UnsetType = msgspec.UNSET
    """Minutes; v0.0.38 writes `null` for INFINITE (and NO_VAL, "partition's limit", as a number)."""
    priority: Num = None
    cpus: Num = None
    node_count: Num = None
    minimum_cpus_per_node: Num = None
    memory_per_node: Num = None
    tres_req_str: str | None = None
    tres_alloc_str: str | None = None
    gres_detail: list[str] | None = None

    @property
    def state(self) -> str:
        """The base state word (`RUNNING`); v0.0.39+ lists flags after it (`["PENDING", "REQUEUED"]`)."""
        state = self.job_state
        if isinstance(state, list):
            return state[0] if state else ""
        return state or ""


class _Error(msgspec.Struct, gc=False):
    error: str | None = None
    description: str | None = None
    error_number: int | None = None
    error_code: int | None = None


class SqueueOutput(msgspec.Struct, gc=False):
    """The top level of `squeue --json`."""

    jobs: list[SqueueJob] = []
    errors: list[_Error] = []


_DECODER: Final = msgspec.json.Decoder(SqueueOutput)


def _stamp(epoch: Num, tz: tzinfo) -> str:
    value = _int(epoch)
    return format_timestamp(datetime.fromtimestamp(value, tz)) if value > 0 else ""


def to_slurm_job(job: SqueueJob, tz: tzinfo) -> SlurmJob:
    """One squeue job -> `SlurmJob` (see the module docstring); `ValueError` when it has no id, state or
    submit time (Sonar's schema requires all three)."""
    job_id = _int(job.job_id)
    if job_id <= 0:
        raise ValueError("job has no job_id")
    state = job.state
    if not state:
        raise ValueError(f"job {job_id} has no job_state")
    submit = _stamp(job.submit_time, tz)
    if not submit:
        raise ValueError(f"job {job_id} has no submit_time")
    array_job_id = _int(job.array_job_id)
    task = _value(job.array_task_id)
    het_job_id = _int(job.het_job_id)
    limit: Limit = None
    if job.time_limit is None:
        limit = UNLIMITED
    elif not isinstance(job.time_limit, msgspec.UnsetType):
        limit = _value(job.time_limit)
    priority = _value(job.priority)
    nodes = job.nodes or ""
    return SlurmJob(
        job_id=job_id,
        job_name=job.name or "",
        job_state=state,
        array_job_id=array_job_id,
        array_task_id=task if array_job_id and isinstance(task, int) else 0,
        het_job_id=het_job_id,
        het_job_offset=_int(job.het_job_offset) if het_job_id else 0,
        user_name=job.user_name or "",
        account=job.account or "",
        submit_time=submit,
        time_limit=to_extended_uint(limit * 60 if isinstance(limit, int) else limit),
        partition=job.partition or "",
        reservation=job.resv_name or "",
        nodes=split_nodelist(nodes) if nodes and nodes != "None assigned" else [],
        priority=to_extended_uint(priority) if priority is not None else 0,
        gres_detail=job.gres_detail or [],
        requested_resources=job.tres_req_str or "",
        allocated_resources=job.tres_alloc_str or "",
        requested_cpus=_int(job.cpus),
        minimum_cpus_per_node=_int(job.minimum_cpus_per_node),
        requested_memory_per_node=_int(job.memory_per_node) * 1024,
        requested_node_count=_int(job.node_count),
        start_time=_stamp(job.start_time, tz) if state == "RUNNING" else "",
    )


def parse_squeue_json(
    data: bytes | str,
    tz: tzinfo,
    *,
    states: Sequence[str] = ("RUNNING", "PENDING"),
    place: str = "",
) -> Iterator[SlurmJob | Problem]:
    """`squeue --json` output -> a `SlurmJob` per job in one of `states`, a `Problem` per bad job or
    reported error (`errors[]`), going on after each. Undecodable JSON is one `Problem` and nothing else.

    `tz` is the zone the timestamps are written in (squeue's are epoch seconds, so any zone is exact).
    """
    try:
        output = _DECODER.decode(data)
    except msgspec.DecodeError as error:
        yield Problem(f"not squeue --json output: {error}", place=place, kind=KIND)
        return
    for i, err in enumerate(output.errors):
        reason = err.description or err.error or "squeue reported an error"
        yield Problem(reason, place=place, kind=KIND, path=f"errors[{i}]")
    wanted = frozenset(states)
    for i, job in enumerate(output.jobs):
        if job.state not in wanted:
            continue
        try:
            yield to_slurm_job(job, tz)
        except ValueError as error:
            yield Problem(str(error), place=place, kind=KIND, path=f"jobs[{i}]")
