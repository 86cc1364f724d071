"""Placing the lines of one sample into its Sonar attributes: finding (or, for lines the skeleton did not
announce, creating) the GPU, disk, job, process or process GPU each line belongs to, converting and range
checking its value; and the canonical order of a sample built without a skeleton.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    SampleAttributes,
    SampleData,
    SampleDisk,
    SampleEnvelope,
    SampleGpu,
    SampleJob,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
)
from hpcbus.schemas.translate.common import (
    device_key,
    job_key,
    own_meta,
    unique_key,
    unique_keys,
    utc_timestamp,
)
from hpcbus.schemas.translate.lp_targets import (
    DISPATCH,
    MAX_CPUS,
    PROCESS_AS_IS,
    U64,
    ZERO_DEFAULT_GPU,
    ZERO_DEFAULT_SYSTEM,
    LineKey,
    Target,
)

__all__ = ["Placer", "canonical_order", "empty_sample"]


class Placer:
    """Puts line values into a SampleAttributes, finding (or, for lines the skeleton did not announce,
    creating) the GPU, disk, job, process or process GPU each line belongs to."""

    def __init__(self, attrs: SampleAttributes, problems: list[Problem]):
        self.attrs = attrs
        self.system = attrs.system
        self.problems = problems
        system = attrs.system
        self.gpus = dict(
            zip(unique_keys((g.uuid for g in system.gpus), safe=device_key), system.gpus, strict=True)
        )
        self.disks = dict(zip(unique_keys(d.name for d in system.disks), system.disks, strict=True))
        self.jobs: dict[str, SampleJob] = {}
        self.procs: dict[str, SampleProcess] = {}
        self.pgpus: dict[tuple[str, str], SampleProcessGpu] = {}
        seen_jobs: set[str] = set()
        seen_procs: set[str] = set()
        for job in attrs.jobs:
            jk = unique_key(job_key(job.job, job.epoch), seen_jobs)
            self.jobs[jk] = job
            for p in job.processes:
                pk = unique_key(f"{jk}/{p.pid}", seen_procs)
                self.procs[pk] = p
                if p.gpus:
                    for gk, g in zip(
                        unique_keys((g.uuid for g in p.gpus), safe=device_key), p.gpus, strict=True
                    ):
                        self.pgpus[(pk, gk)] = g

    def _problem(self, line: Line, reason: str) -> None:
        self.problems.append(
            Problem(reason, kind="lp metric", path=f"measurement {line.measurement}", severity="warning")
        )

    def put_all(self, items: Iterable[tuple[LineKey, Line]]) -> None:
        """`put` for every line of a group. The two most frequent kinds of line, a process value that goes in
        unconverted (~10 per process on a busy node) and a hwthread's `cpu_time` (one per core), are placed
        right here, because a call per line was a third of the cost of building an envelope; anything else,
        and any value that needs one of the checks `put` makes, goes to `put`."""
        procs = self.procs
        cpus = self.system.cpus
        n_cpus = min(len(cpus), MAX_CPUS)
        as_is = PROCESS_AS_IS
        last_sid: str | None = None
        proc: SampleProcess | None = None
        for (meas, tid, sid), line in items:
            spec = as_is.get(meas)
            if spec is not None:
                value = line.fields["value"]
                attr, kind, lo = spec
                if type(value) is kind and (kind is float or lo <= value <= U64):  # type: ignore[operator]
                    if sid != last_sid:  # a process's lines arrive together
                        proc, last_sid = procs.get(sid or ""), sid
                    if proc is not None and proc.ppid:
                        setattr(proc, attr, value)
                        continue
            elif meas == "cpu_time" and tid is not None and tid.isdigit():
                value = line.fields["value"]
                i = int(tid)
                if i < n_cpus and type(value) is int and 0 <= value <= U64:
                    cpus[i] = value
                    continue
            self.put(DISPATCH[meas], line, tid, sid)

    def put(self, target: Target, line: Line, tid: str | None, sid: str | None) -> None:
        try:
            value = target.conv(line.fields["value"])  # type: ignore[arg-type]
        except (OverflowError, ValueError):
            self._problem(line, f"value {line.fields['value']!r} is not a number Sonar can hold")
            return
        if type(value) is int and not target.lo <= value <= U64:
            self._problem(line, f"value {value} is outside the range of Sonar field {target.attr}")
            return
        level = target.level
        try:  # most frequent level first: a big node has ~10 lines per process
            if level == "process":
                proc = self.procs.get(sid or "")
                if proc is None or not proc.ppid:  # (created from a GPU line, which carries no ppid)
                    proc = self._proc(line.tags, sid or "")
                setattr(proc, target.attr, value)
            elif level == "process_gpu":
                pk = sid or ""
                pg = self.pgpus.get((pk, tid or ""))
                if pg is None:
                    owner = self._proc(line.tags, pk)
                    pg = SampleProcessGpu(uuid=tid or "-")
                    owner.gpus.append(pg)
                    self.pgpus[(pk, tid or "")] = pg
                setattr(pg, target.attr, value)
            elif level == "hwthread":
                i = int(tid or "")
                cpus = self.system.cpus
                if not 0 <= i < MAX_CPUS:
                    raise ValueError(f"hwthread index {i} out of range")
                if i >= len(cpus):
                    cpus.extend([0] * (i + 1 - len(cpus)))
                cpus[i] = int(value)
            elif level == "disk":
                stats = self._disk(sid or "").stats
                col = target.column
                if col >= len(stats):
                    stats.extend([0] * (col + 1 - len(stats)))
                stats[col] = int(value)
            elif level == "accelerator":
                if value or target.attr not in ZERO_DEFAULT_GPU:  # a 0 line stays Sonar's absent field
                    setattr(self._gpu(tid or ""), target.attr, value)
            elif level == "node":
                if value or target.attr not in ZERO_DEFAULT_SYSTEM:
                    setattr(self.system, target.attr, value)
            else:  # job
                self._job(line.tags)
        except (ValueError, KeyError) as exc:
            self._problem(line, f"cannot place the value: {exc}")

    def _gpu(self, key: str) -> SampleGpu:
        gpu = self.gpus.get(key)
        if gpu is None:
            gpu = SampleGpu(uuid=key or "-")
            self.system.gpus.append(gpu)
            self.gpus[key] = gpu
        return gpu

    def _disk(self, key: str) -> SampleDisk:
        disk = self.disks.get(key)
        if disk is None:
            disk = SampleDisk(name=key)
            self.system.disks.append(disk)
            self.disks[key] = disk
        return disk

    def _job(self, tags: dict[str, str]) -> SampleJob:
        job, epoch = int(tags["job"]), int(tags.get("epoch", "0"))
        jk = job_key(job, epoch)
        found = self.jobs.get(jk)
        if found is None:
            found = SampleJob(job=job, epoch=epoch, user=tags.get("user") or "_user_unknown")
            self.attrs.jobs.append(found)
            self.jobs[jk] = found
        return found

    def _proc(self, tags: dict[str, str], key: str) -> SampleProcess:
        proc = self.procs.get(key)
        if proc is not None:
            if not proc.ppid and "ppid" in tags:  # created from a GPU line, which does not carry ppid
                proc.ppid = int(tags["ppid"])
        else:
            proc = SampleProcess(
                pid=int(tags.get("pid", "0")), ppid=int(tags.get("ppid", "0")), cmd=tags.get("cmd", "")
            )
            self._job(tags).processes.append(proc)
            self.procs[key] = proc
        return proc


def _natural(text: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"([0-9]+)", text))


def _device_id(text: str) -> tuple[int, int, str]:
    """Sort key of a GPU id: NVML indices numerically, everything else (PCI ids are fixed-width hex, uuids)
    as text."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def canonical_order(attrs: SampleAttributes) -> None:
    """Without a skeleton the arrival order is arbitrary; sort so the result depends only on the lines."""
    system = attrs.system
    system.gpus.sort(key=lambda g: _device_id(g.uuid))
    for pos, gpu in enumerate(system.gpus):
        gpu.index = int(gpu.uuid) if gpu.uuid.isdigit() and len(gpu.uuid) < 5 else pos
    system.disks.sort(key=lambda d: _natural(d.name))
    attrs.jobs.sort(key=lambda j: (j.job, j.epoch))
    for job in attrs.jobs:
        job.processes.sort(key=lambda p: (p.pid, p.cmd, p.ppid))
        for p in job.processes:
            p.gpus.sort(key=lambda g: _device_id(g.uuid))


def empty_sample(cluster: str, line: Line) -> SampleEnvelope:
    attrs = SampleAttributes(
        time=utc_timestamp(line.time),
        cluster=line.tags.get("cluster") or cluster or "unknown",
        node=line.tags.get("hostname") or "unknown",
        system=SampleSystem(),
    )
    return SampleEnvelope(meta=own_meta(), data=SampleData(attributes=attrs))
