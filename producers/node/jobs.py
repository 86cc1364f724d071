"""Grouping processes into jobs the way Sonar does, and noticing jobs that start and end.

A job is a Slurm job when a process's cgroup (or slurmstepd ancestor) names one: such records carry
`epoch = 0`, so samples from every node and every time merge into one job downstream. Any other
process belongs to its process group; process-group ids are reused after a reboot, so those jobs carry
`epoch = boot time - 2020-01-01T00:00Z` (Sonar's definition), which changes with every boot.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Annotated

import msgspec

from hpcbus.producers.node.processes import ProcessGpu, ProcessReading

SONAR_EPOCH_BASE = 1577836800
"""2020-01-01T00:00:00Z; Sonar's `epoch` for non-batch jobs is btime minus this."""


class JobOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which processes are reported and how (Sonar's `ps` options)."""

    min_uid: Annotated[int, msgspec.Meta(ge=0)] = 1000
    """Leave out processes of system users, uid below this (Sonar `exclude_system_jobs`); 0 keeps all."""
    exclude_users: list[str] = msgspec.field(default_factory=list)
    """User names whose processes are left out."""
    exclude_commands: list[str] = msgspec.field(default_factory=list)
    """Command-name prefixes whose processes are left out."""
    min_cpu_time: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """Leave out process records with less cumulative CPU time than this, seconds (checked after
    roll-up, so many small identical processes can together pass it, as in Sonar)."""
    rollup: bool = False
    """Merge processes of one job with the same parent and command and no children into one record
    with pid 0 and `rolledup` = number of merged processes - 1 (Sonar `--rollup`)."""


class JobReading(msgspec.Struct, kw_only=True):
    """The processes of one job on this node at one time (Sonar `SampleJob`)."""

    job: int
    """Slurm job id, or the process group id for processes outside Slurm."""
    epoch: int
    """0 for Slurm jobs; otherwise boot time - 1577836800 (seconds), constant until the next boot."""
    user: str
    uid: int
    slurm: bool
    processes: list[ProcessReading]


class JobStarted(msgspec.Struct, frozen=True, kw_only=True, tag="job_started"):
    """A job that has processes now and had none in the previous sample (feeds `start_job` events)."""

    job: int
    epoch: int
    user: str
    slurm: bool
    time: float
    """When the start was noticed: this sample's time, seconds since the epoch."""
    start_time: float
    """Earliest start time of the job's processes on this node, seconds since the epoch."""
    at_startup: bool = False
    """Seen in the collector's first sample: the job may have started long before (a restart of the
    collector is not a job start; consumers that must not duplicate starts should check this)."""
    hwthreads: tuple[int, ...] = ()
    """OS processor ids the job may use on this node, filled in by the collector (`cpuset.job_cpus`)."""


class JobEnded(msgspec.Struct, frozen=True, kw_only=True, tag="job_ended"):
    """A job whose processes were present in the previous sample and are all gone now."""

    job: int
    epoch: int
    user: str
    slurm: bool
    time: float
    """When the end was noticed: this sample's time; the job ended between `last_seen` and this."""
    last_seen: float
    """Time of the previous sample, the last one that saw the job, seconds since the epoch."""
    start_time: float
    """Earliest start time of the job's processes seen, seconds since the epoch."""


JobEvent = JobStarted | JobEnded


class JobPresence(msgspec.Struct, frozen=True, kw_only=True):
    """Which jobs exist right now, before any filtering (filters must not fake starts and ends)."""

    job: int
    epoch: int
    user: str
    slurm: bool
    start_time: float


def sonar_epoch(boot_time: int) -> int:
    """Sonar's boot-dependent epoch for jobs that are not Slurm jobs."""
    return boot_time - SONAR_EPOCH_BASE


def job_key(p: ProcessReading, epoch: int) -> tuple[int, int]:
    """(job, epoch) of a process: its Slurm job, else its process group (its own pid when it has none,
    as for a container's init, so that unrelated processes are never merged into a job 0)."""
    if p.job:
        return p.job, 0
    return (p.pgid or p.pid), epoch


def _job_user(procs: list[ProcessReading]) -> tuple[str, int]:
    """The job's user: the most common non-root owner (slurmstepd runs as root inside the job)."""
    counts = Counter((p.user, p.uid) for p in procs if p.uid != 0)
    if counts:
        return counts.most_common(1)[0][0]
    return procs[0].user, procs[0].uid


def job_presence(
    procs: list[ProcessReading], boot_time: int, slurm_only: bool = True
) -> dict[tuple[int, int], JobPresence]:
    """Jobs with at least one process now, keyed by (job, epoch). With `slurm_only`, process-group
    jobs (every shell command) are left out: their churn is not worth start/stop events."""
    epoch = sonar_epoch(boot_time)
    groups: dict[tuple[int, int], list[ProcessReading]] = defaultdict(list)
    for p in procs:
        if slurm_only and not p.job:
            continue
        groups[job_key(p, epoch)].append(p)
    out: dict[tuple[int, int], JobPresence] = {}
    for (job, ep), members in groups.items():
        user, _ = _job_user(members)
        out[(job, ep)] = JobPresence(
            job=job,
            epoch=ep,
            user=user,
            slurm=ep == 0,
            start_time=min(p.start_time for p in members),
        )
    return out


def job_changes(
    before: dict[tuple[int, int], JobPresence] | None,
    now_jobs: dict[tuple[int, int], JobPresence],
    now: float,
    last_seen: float,
) -> list[JobStarted | JobEnded]:
    """Starts and ends between two presence maps; `before=None` means this is the first sample."""
    events: list[JobStarted | JobEnded] = []
    old = before or {}
    for key, j in now_jobs.items():
        if key not in old:
            events.append(
                JobStarted(
                    job=j.job,
                    epoch=j.epoch,
                    user=j.user,
                    slurm=j.slurm,
                    time=now,
                    start_time=j.start_time,
                    at_startup=before is None,
                )
            )
    for key, j in old.items():
        if key not in now_jobs:
            events.append(
                JobEnded(
                    job=j.job,
                    epoch=j.epoch,
                    user=j.user,
                    slurm=j.slurm,
                    time=now,
                    last_seen=last_seen,
                    start_time=j.start_time,
                )
            )
    return events


def _merge_gpus(records: list[ProcessReading]) -> list[ProcessGpu]:
    by_card: dict[tuple[int, str], list[ProcessGpu]] = defaultdict(list)
    for r in records:
        for g in r.gpus:
            by_card[(g.index, g.uuid)].append(g)

    def total(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    out: list[ProcessGpu] = []
    for (index, uuid), gs in sorted(by_card.items()):
        mem = total([g.memory_kib for g in gs])
        out.append(
            ProcessGpu(
                index=index,
                uuid=uuid,
                memory_kib=None if mem is None else int(mem),
                gpu_util=total([g.gpu_util for g in gs]),
                memory_util=total([g.memory_util for g in gs]),
            )
        )
    return out


def _rolled(records: list[ProcessReading]) -> ProcessReading:
    """One record summing `records` (same job, ppid and cmd, none with children)."""
    first = records[0]
    utils = [r.cpu_util for r in records if r.cpu_util is not None]
    return ProcessReading(
        pid=0,
        ppid=first.ppid,
        pgid=first.pgid,
        sid=first.sid,
        uid=first.uid,
        user=first.user,
        state=first.state,
        cmd=first.cmd,
        start_time=min(r.start_time for r in records),
        user_time=sum(r.user_time for r in records),
        system_time=sum(r.system_time for r in records),
        children_time=sum(r.children_time for r in records),
        cpu_time=sum(r.cpu_time for r in records),
        cpu_avg=sum(r.cpu_avg for r in records),
        cpu_util=sum(utils) if utils else None,
        num_threads=sum(r.num_threads for r in records),
        resident_kib=sum(r.resident_kib for r in records),
        rss_kib=sum(r.rss_kib for r in records),
        virtual_kib=sum(r.virtual_kib for r in records),
        vsize_kib=sum(r.vsize_kib for r in records),
        read_bytes=sum(r.read_bytes for r in records),
        write_bytes=sum(r.write_bytes for r in records),
        cancelled_write_bytes=sum(r.cancelled_write_bytes for r in records),
        job=first.job,
        step=first.step,
        has_children=False,
        rolledup=sum(r.rolledup + 1 for r in records) - 1,
        gpus=_merge_gpus(records),
    )


def rollup(procs: list[ProcessReading]) -> list[ProcessReading]:
    """Sonar's roll-up within one job; processes with children are never merged (that would break
    the process tree a back end rebuilds)."""
    out: list[ProcessReading] = []
    groups: dict[tuple[int, str], list[ProcessReading]] = {}
    for p in procs:
        if p.has_children:
            out.append(p)
            continue
        groups.setdefault((p.ppid, p.cmd), []).append(p)
    for members in groups.values():
        out.append(members[0] if len(members) == 1 else _rolled(members))
    return out


def group_jobs(
    procs: list[ProcessReading], boot_time: int, opts: JobOptions | None = None
) -> list[JobReading]:
    """Jobs of the node, each with its (filtered, optionally rolled-up) processes; jobs left without
    processes by the filters are not reported. Order: by job id, then epoch; processes by pid."""
    opts = opts or JobOptions()
    epoch = sonar_epoch(boot_time)
    groups: dict[tuple[int, int], list[ProcessReading]] = defaultdict(list)
    excluded_users = set(opts.exclude_users)
    prefixes = tuple(opts.exclude_commands)
    for p in procs:
        if p.uid < opts.min_uid or p.user in excluded_users:
            continue
        if prefixes and p.cmd.startswith(prefixes):
            continue
        groups[job_key(p, epoch)].append(p)
    jobs: list[JobReading] = []
    for (job, ep), members in sorted(groups.items()):
        records = rollup(members) if opts.rollup else members
        if opts.min_cpu_time > 0:
            records = [r for r in records if r.cpu_time >= opts.min_cpu_time]
        if not records:
            continue
        records.sort(key=lambda r: (r.pid, r.ppid, r.cmd))
        user, uid = _job_user(records)
        jobs.append(JobReading(job=job, epoch=ep, user=user, uid=uid, slurm=ep == 0, processes=records))
    return jobs
