"""`SacctRow` -> Sonar `SlurmJob`, as Sonar renders it or with its two data-losing bugs fixed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Final

from hpcbus.schemas.slurm.sacct import compiled
from hpcbus.schemas.slurm.sacct.row import SacctRow
from hpcbus.schemas.slurm.values import (
    Limit,
    format_timestamp,
    sonar_seconds,
    split_nodelist,
    to_extended_uint,
    whole_seconds,
)
from hpcbus.schemas.sonar.types import SacctData, SlurmJob


def _name(value: str) -> str:
    """Sonar drops `Unknown` (and empty) for job_name, user_name, account and reservation."""
    return "" if value == "Unknown" else value


def _exact(value: int | float | None) -> int:
    return 0 if value is None else whole_seconds(value)


def _sonar(value: int | float | None) -> int:
    return 0 if value is None else sonar_seconds(value)


def _time_limit(limit: Limit) -> int:
    """TimelimitRaw as Sonar emits it: minutes * 60 + 2 (seconds, ExtendedUint), UNLIMITED -> 1, none -> 0."""
    return to_extended_uint(limit * 60 if isinstance(limit, int) else limit)


_EMPTY_SACCT: Final = SacctData()

_render: Final = compiled.native.render if compiled.native is not None else None
_RENDERER: Final = compiled.RENDERER


def to_slurm_job(
    row: SacctRow,
    tz: tzinfo | None = None,
    *,
    sonar_compat: bool = False,
    requested_resources: Mapping[str, str] | None = None,
) -> SlurmJob:
    """Render a row as a Sonar `SlurmJob` (see `to_slurm_job_pure`, the reference this equals).

    The default form (no `tz`, not `sonar_compat`, no requested resources: what the producer asks for) goes
    through the compiled renderer when it is built (`compiled.py`); a row it is not sure of, and every
    other form, through the pure one, which also raises the errors.
    """
    if _render is not None and tz is None and not sonar_compat and not requested_resources:
        job = _render(_RENDERER, row)
        if job is not None:
            return job
    return to_slurm_job_pure(row, tz, sonar_compat=sonar_compat, requested_resources=requested_resources)


def to_slurm_job_pure(
    row: SacctRow,
    tz: tzinfo | None = None,
    *,
    sonar_compat: bool = False,
    requested_resources: Mapping[str, str] | None = None,
) -> SlurmJob:
    """Render a row as a Sonar `SlurmJob`, field for field as Sonar 0.18.1's `src/slurmjobs.rs` does.

    Both modes (real Sonar behaviour, kept because consumers of Sonar data rely on it):
    - `time_limit` = TimelimitRaw minutes * 60 + 2: Sonar emits *seconds* as an ExtendedUint although the
      spec says minutes; `UNLIMITED` -> 1. `priority` = Priority + 2.
    - `exit_code` is the status half of ExitCode, omitted when 0 (the signal half is dropped).
    - `nodes` is NodeList split at top-level commas, not expanded (each element a NodeRange).
    - `requested_memory_per_node` is ReqMem in KiB, which since Slurm 21.08 is the job's *total* request
      (the name is Sonar's); an old per-CPU value (`4000Mc`) is left out, as Sonar does (it cannot parse
      it), because it is no per-node amount.
    - Zero and empty values are omitted; `Unknown` is omitted for job_name, user_name, account, reservation.
    - `allocated_resources` and `sacct.AllocTRES` are both AllocTRES; `requested_resources` comes from
      `requested_resources[str(job id)]` (Sonar reads it from `scontrol show job`), if given.
    - `array_task_id` 0 and `het_job_offset` 0 are omitted like every zero (the first element of an array
      or het job is recognisable only by `array_job_id`/`het_job_id` being set).

    Only with `sonar_compat=True` (used by the golden test; deliberately wrong otherwise):
    - durations printed with a fraction (`14:50.006`) lose their whole seconds (-> 840); the default mode
      rounds to the nearest second (-> 890).
    - `job_state` is State verbatim (`CANCELLED by 2101037`); the default mode gives the bare word, as the
      spec asks.

    `tz`, when given, re-expresses the timestamps in that zone; by default they keep the zone `parse_sacct`
    was given (Sonar uses its own local offset, which is the same thing when both run on one host).
    Raises `ValueError` for a row Sonar's schema cannot carry (no Submit time, no State, job id 0).
    """
    job_id = row.job_id
    if job_id <= 0:
        raise ValueError(f"line {row.line}: job id must be positive, got {job_id}")
    if not row.state:
        raise ValueError(f"line {row.line}: job {job_id} has no State")
    if row.submit is None:
        raise ValueError(f"line {row.line}: job {job_id} has no Submit time")
    seconds = _sonar if sonar_compat else _exact
    job = row.job

    def stamp(when: datetime | None) -> str:
        if when is None:
            return ""
        return format_timestamp(when.astimezone(tz) if tz is not None else when)

    state = row.state
    if sonar_compat and row.cancelled_by is not None:
        state = f"{state} by {row.cancelled_by}"

    sacct = SacctData(
        min_cpu=seconds(row.min_cpu),
        alloc_tres=row.alloc_tres,
        ave_cpu=seconds(row.ave_cpu),
        ave_disk_read=row.ave_disk_read or 0,
        ave_disk_write=row.ave_disk_write or 0,
        ave_rss=row.ave_rss or 0,
        ave_vm_size=row.ave_vmsize or 0,
        elapsed_raw=row.elapsed_raw or 0,
        system_cpu=seconds(row.system_cpu),
        user_cpu=seconds(row.user_cpu),
        max_rss=row.max_rss or 0,
        max_vm_size=row.max_vmsize or 0,
    )
    return SlurmJob(
        job_id=job_id,
        job_step=row.step,
        job_name=_name(row.job_name),
        job_state=state,
        array_job_id=job.base if job is not None and job.is_array else 0,
        array_task_id=(job.array_task_id or 0) if job is not None else 0,
        het_job_id=job.base if job is not None and job.is_het else 0,
        het_job_offset=(job.het_offset or 0) if job is not None else 0,
        user_name=_name(row.user),
        account=_name(row.account),
        submit_time=stamp(row.submit),
        time_limit=_time_limit(row.time_limit),
        partition=row.partition,
        reservation=_name(row.reservation),
        nodes=split_nodelist(row.node_list) if row.node_list else [],
        priority=to_extended_uint(row.priority) if row.priority is not None else 0,
        distribution=row.layout,
        requested_resources=requested_resources.get(str(job_id), "") if requested_resources else "",
        allocated_resources=row.alloc_tres,
        requested_cpus=row.req_cpus or 0,
        requested_memory_per_node=0 if row.req_mem_per_cpu else row.req_mem_kib or 0,
        requested_node_count=row.req_nodes or 0,
        start_time=stamp(row.start),
        suspend_time=seconds(row.suspended),
        end_time=stamp(row.end),
        exit_code=row.exit_status or 0,
        sacct=None if sacct == _EMPTY_SACCT else sacct,
    )
