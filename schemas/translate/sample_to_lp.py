"""Sonar sample envelope -> metric lines + one skeleton event (docs/mapping.md section 4).

Hot path (a node with 128 hwthreads, 4 GPUs and 300 processes gives ~3,000 lines per sample): one walk
(`walk_sample`) hands each object's lines to a `Writer`; `sample_to_lines` makes `Line`s of them and
`schemas.translate.payloads` writes their text. Which fields of an object become lines, and their values, is
`sample_fields`' job (the registry's tables, one plan per pattern of zeros); this module walks the sample:
node, hwthreads, GPUs, disks, jobs and their processes, in line order, with their tags and series keys, and
the skeleton of what did not travel as a line.

Zeros (registry `zero`, docs/mapping.md principle 7): the series a dashboard plots per node, hwthread, GPU
and disk get a line for 0 too (an idle node's load is 0, not a gap); zeros that mean "not reported" and
per-process zeros get none, as in Sonar. Either way the round trip is exact: a 0 line puts back the 0 the
skeleton already holds, which Sonar's encoding omits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from hpcbus.schemas.lineprotocol import STYPE_DISK, Line, node_level_tags
from hpcbus.schemas.lineprotocol.format import INT64_MAX
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import SampleAttributes, SampleEnvelope, SampleJob, SampleProcess
from hpcbus.schemas.translate.common import device_key, epoch_of, job_key, tag_value, unique_key, unique_keys
from hpcbus.schemas.translate.events import errors_tags
from hpcbus.schemas.translate.registry import disk_stat_name
from hpcbus.schemas.translate.sample_fields import (
    DISK_NAMES,
    GPU,
    NODE,
    NODE_BOOT,
    PROCESS,
    PROCESS_GPU,
    Level,
    Plans,
    Values,
    lines_template,
    object_lines,
    plain_ints,
)

__all__ = [
    "JobStep",
    "PutProcess",
    "SampleHeader",
    "Writer",
    "each_job",
    "process_tags",
    "sample_to_lines",
    "skeleton_event",
    "unplaceable",
    "walk_sample",
]


class SampleHeader(msgspec.Struct, kw_only=True):
    """The payload of a `sample,function=skeleton` event."""

    lines: int
    """Number of metric lines of this envelope (the reassembler's completeness test)."""
    skeleton: SampleEnvelope
    """The envelope with every value that went out as a metric line set to zero."""


def skeleton_event(header: SampleHeader, tags: dict[str, str], time: int) -> Line:
    """The `sample,function=skeleton` event line."""
    return Line("sample", tags, {"event": msgspec.json.encode(header).decode()}, time)


PutProcess = Callable[[SampleProcess, str, tuple[str, ...], Values, "str | None"], None]
"""Receives the lines of one process of a job: the process, its series key (`stype-id`), then as `Writer.put`."""
JobStep = Callable[[SampleJob], tuple[SampleJob, int]]
"""Walks one job (`_JobWalk.step`): the job as the skeleton holds it, and its number of lines."""


class Writer(Protocol):
    """Receives the metric lines of a sample from `walk_sample`, object by object in line order. Tag dicts
    are shared by all lines of an object: do not mutate them.

    Why more than one method: a writer of text writes the tag set of 128 hwthreads or of a job's processes
    from one template, where a tag dict per object and its sorting and escaping were most of the cost."""

    def put(self, tags: dict[str, str], names: tuple[str, ...], values: Values, template: str | None) -> None:
        """The lines of one object: measurement `names[i]` has value `values[i]`. `template` (`lines_template`)
        is given when every value is plain (an int64 or a finite normal float)."""

    def hwthreads(self, tags: dict[str, str], values: Sequence[int], plain: bool) -> None:
        """`cpu_time` of hwthread 0, 1, ...: each line's tags are `tags` (cluster, hostname) with
        `type=hwthread` and `type-id=<index>`; `plain`: every value is an int64."""

    def processes(self, job: dict[str, str]) -> PutProcess:
        """The receiver of one job's process lines, each tagged `process_tags(job, process, key)`."""

    def read_values(
        self, obj: object, level: Level
    ) -> tuple[tuple[str, ...], Values, dict[str, object]] | None:
        """`field_values(obj, level.table)` of the node or a GPU as a compiled writer computes it (`level.coded`
        is its table), or None: then `field_values` computes it (the default)."""
        return None

    def jobs(
        self,
        cluster: str,
        host: str,
        jobs: Sequence[SampleJob],
        seen_jobs: set[str],
        seen_procs: set[str],
        step: JobStep,
    ) -> tuple[list[SampleJob], int]:
        """The lines of every job of the sample of node `host` of `cluster` in order (`seen_jobs`,
        `seen_procs`: the series keys so far): `each_job(jobs, step)`, which a compiled writer may do itself
        for the jobs it is sure of, with the same lines, count and keys (`step` for every other one, in its
        place); the jobs it returns only go into the skeleton's JSON, so they need only encode the same
        (`msgspec.json.encode`): a compiled writer may give a job's processes as their JSON (`msgspec.Raw`).
        The default: `each_job`."""
        return each_job(jobs, step)


def process_tags(job: dict[str, str], p: SampleProcess, key: str) -> dict[str, str]:
    """The tags of a process' lines: its job's (`job`), node level, `stype=process` with the process' series
    key, and pid, cmd and ppid where known."""
    tags = {**job, "type": "node", "type-id": "process", "stype": "process", "stype-id": key}
    if p.pid:
        tags["pid"] = str(p.pid)
    if p.cmd:
        tags["cmd"] = tag_value(p.cmd)
    if p.ppid:
        tags["ppid"] = str(p.ppid)
    return tags


class _LineWriter(Writer):
    """The `Writer` of `sample_to_lines`: one `Line` per value, sharing the object's tag dict."""

    def __init__(self, time: int) -> None:
        self.lines: list[Line] = []
        self.time = time

    def put(self, tags: dict[str, str], names: tuple[str, ...], values: Values, template: str | None) -> None:
        add, ts = self.lines.append, self.time
        for name, v in zip(names, values, strict=True):
            add(Line(name, tags, {"value": v}, ts))

    def hwthreads(self, tags: dict[str, str], values: Sequence[int], plain: bool) -> None:
        for i, v in enumerate(values):
            self.put({**tags, "type": "hwthread", "type-id": str(i)}, ("cpu_time",), (v,), None)

    def processes(self, job: dict[str, str]) -> PutProcess:
        def put_process(
            p: SampleProcess, key: str, names: tuple[str, ...], values: Values, _: str | None
        ) -> None:
            self.put(process_tags(job, p, key), names, values, None)

        return put_process


def sample_to_lines(
    env: SampleEnvelope, *, cluster: str = "", now: int = 0, problems: list[Problem] | None = None
) -> list[Line]:
    """All lines of one sample envelope: the skeleton event first, then the metric lines.

    `cluster` and `now` only stand in for an envelope that does not say them: an errors-only envelope whose
    errors name no cluster or time, or a sample without `time`, `cluster` or `node` (all optional in the
    spec). Such a sample cannot be placed (every metric line needs its hostname and time, and the way back
    keys a sample by its own cluster, node and time), so it travels as its skeleton alone, announcing no
    lines and carrying the whole envelope unchanged; `problems`, when given, gets a warning saying so.
    Lines share tag dicts: do not mutate them.
    """
    head = unplaceable(env, cluster, now, problems)
    if head is not None:
        return [head]
    assert env.data is not None  # unplaceable() said so
    writer = _LineWriter(epoch_of(env.data.attributes.time))
    header = walk_sample(env, writer)
    writer.lines.insert(0, header)
    return writer.lines


def unplaceable(env: SampleEnvelope, cluster: str, now: int, problems: list[Problem] | None) -> Line | None:
    """The one line of an envelope that has no metric lines (errors only, or a sample without `time`,
    `cluster` or `node`: see `sample_to_lines`); None for a sample that can be placed."""
    data = env.data
    if data is None:
        return _errors_event(env, cluster, now)
    a = data.attributes
    if not (a.time and a.cluster and a.node):
        return _unplaced_event(env, a, cluster, now, problems)
    return None


class _JobWalk:
    """The reference walk of a sample's jobs, one job (its line, its processes' and their GPUs' lines) per
    `step`: what every writer's `jobs` hands a job to (a compiled writer: each job it does not write itself)."""

    def __init__(
        self,
        out: Writer,
        cl: str,
        host: str,
        seen_jobs: set[str],
        seen_procs: set[str],
        plans: Plans,
        ts: int,
    ) -> None:
        self.out, self.cl, self.host, self.seen_jobs, self.seen_procs = out, cl, host, seen_jobs, seen_procs
        self.plans, self.ts = plans, ts
        self.job_template = lines_template(("job_processes",), (int,), ts)

    def step(self, job: SampleJob) -> tuple[SampleJob, int]:
        """Hand the lines of `job` to the writer: `job` as the skeleton holds it (the same object when
        nothing of it changed) and its number of lines."""
        out, cl, host, seen_procs, plans, ts = (
            self.out,
            self.cl,
            self.host,
            self.seen_procs,
            self.plans,
            self.ts,
        )
        jk = unique_key(job_key(job.job, job.epoch), self.seen_jobs)
        base = {"cluster": cl, "hostname": host, "job": str(job.job)}
        if job.user:  # optional: an empty tag value cannot be written
            base["user"] = tag_value(job.user)
        if job.epoch:
            base["epoch"] = str(job.epoch)
        procs = job.processes
        n = min(len(procs) + sum(p.rolledup for p in procs if p.rolledup > 0), INT64_MAX)
        job_tags = {**base, "type": "node", "stype": "job", "stype-id": jk}
        node_level_tags(job_tags)
        out.put(
            job_tags,
            ("job_processes",),
            (n,),
            self.job_template if type(n) is int else None,  # a struct built in-process may hold any number
        )
        count = 1
        put_process = out.processes(base)
        new_procs = []
        changed = False
        for p in procs:
            pk = unique_key(f"{jk}/{p.pid}", seen_procs)
            names, values, template, pz = object_lines(p, PROCESS, plans, ts)
            if names:
                put_process(p, pk, names, values, template)
                count += len(names)
            if p.gpus:
                ptags = process_tags(base, p, pk)
                pgpus = []
                for pg, gk in zip(
                    p.gpus, unique_keys((x.uuid for x in p.gpus), safe=device_key), strict=True
                ):
                    gtags = {**ptags, "type": "accelerator", "type-id": gk}
                    gtags.pop("ppid", None)  # the process lines carry it; one place is enough
                    names, values, template, pgz = object_lines(pg, PROCESS_GPU, plans, ts)
                    if names:
                        out.put(gtags, names, values, template)
                        count += len(names)
                    pgpus.append(msgspec.structs.replace(pg, **pgz) if pgz else pg)
                pz = {**pz, "gpus": pgpus}
            if pz:
                p = msgspec.structs.replace(p, **pz)
                changed = True
            new_procs.append(p)
        return (msgspec.structs.replace(job, processes=new_procs) if changed else job), count


def each_job(jobs: Sequence[SampleJob], step: JobStep) -> tuple[list[SampleJob], int]:
    """`step` of every job in order: (the jobs as the skeleton holds them, the number of lines) — what
    `Writer.jobs` returns, on the reference path."""
    new_jobs = []
    count = 0
    for job in jobs:
        q, n = step(job)
        count += n
        new_jobs.append(q)
    return new_jobs, count


def walk_sample(env: SampleEnvelope, out: Writer) -> Line:
    """Hand every metric line of a placeable sample to `out`, object by object in line order, and return
    its skeleton event (which announces how many lines went to `out`).

    One walk for both outputs (`Line`s and text), so the lines and the skeleton can never disagree."""
    data = env.data
    assert data is not None
    a = data.attributes
    ts = epoch_of(a.time)
    cl, host = a.cluster, a.node
    count = 0
    plans: Plans = {}
    node_tags = {"cluster": cl, "hostname": host, "type": "node"}  # the bus form: `node_level_tags`

    system = a.system
    read = out.read_values
    names, values, template, node_zeros = object_lines(
        system, NODE_BOOT if system.boot else NODE, plans, ts, read
    )
    zeros = dict(node_zeros)
    if names:
        out.put(node_tags, names, values, template)
        count += len(names)

    cpus = system.cpus
    if cpus:  # every hwthread listed was measured: its 0 is written too
        out.hwthreads({"cluster": cl, "hostname": host}, cpus, plain_ints(cpus))
        count += len(cpus)
        zeros["cpus"] = [0] * len(cpus)

    if system.gpus:
        gpus = []
        for g, key in zip(
            system.gpus, unique_keys((g.uuid for g in system.gpus), safe=device_key), strict=True
        ):
            names, values, template, gz = object_lines(g, GPU, plans, ts, read)
            if names:
                out.put(
                    {"cluster": cl, "hostname": host, "type": "accelerator", "type-id": key},
                    names,
                    values,
                    template,
                )
                count += len(names)
            gpus.append(msgspec.structs.replace(g, **gz) if gz else g)
        zeros["gpus"] = gpus

    if system.disks:
        disks = []
        disk_lines: dict[int, tuple[tuple[str, ...], str]] = {}  # number of columns -> names, template
        for d, key in zip(system.disks, unique_keys(d.name for d in system.disks), strict=True):
            stats = d.stats
            if stats:
                tags = {"cluster": cl, "hostname": host, "type": "node", "stype": STYPE_DISK, "stype-id": key}
                node_level_tags(tags)
                # every column listed was read: its 0 is written too
                known = disk_lines.get(len(stats))
                if known is None:
                    names = tuple(DISK_NAMES[i] if i < 17 else disk_stat_name(i) for i in range(len(stats)))
                    known = disk_lines[len(stats)] = names, lines_template(names, [int] * len(names), ts)
                names, template = known
                out.put(tags, names, tuple(stats), template if plain_ints(stats) else None)
                count += len(stats)
                d = msgspec.structs.replace(d, stats=[0] * len(stats))
            disks.append(d)
        zeros["disks"] = disks

    seen_jobs: set[str] = set()
    seen_procs: set[str] = set()
    jobs, n_lines = out.jobs(
        cl,
        host,
        a.jobs,
        seen_jobs,
        seen_procs,
        _JobWalk(out, cl, host, seen_jobs, seen_procs, plans, ts).step,
    )
    count += n_lines

    skeleton = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            data,
            attributes=msgspec.structs.replace(
                a, system=msgspec.structs.replace(system, **zeros) if zeros else system, jobs=jobs
            ),
        ),
    )
    header_tags = {**node_tags, "type-id": "0", "function": "skeleton"}  # an event: the spec's node form
    return skeleton_event(SampleHeader(lines=count, skeleton=skeleton), header_tags, ts)


def _unplaced_event(
    env: SampleEnvelope, a: SampleAttributes, cluster: str, now: int, problems: list[Problem] | None
) -> Line:
    """A sample lacking `time`, `cluster` or `node`: a skeleton announcing no lines, carrying the envelope."""
    missing = [name for name in ("time", "cluster", "node") if not getattr(a, name)]
    if problems is not None:
        problems.append(
            Problem(
                f"sample without {' and '.join(missing)}: no metric lines (each needs its hostname and time); "
                "the envelope travels whole in its skeleton event",
                kind="sonar sample",
                path=f"data.attributes.{missing[0]}",
                severity="warning",
            )
        )
    tags = {"type": "node", "type-id": "0", "function": "skeleton"}
    if a.cluster or cluster:
        tags["cluster"] = a.cluster or cluster
    if a.node:
        tags["hostname"] = a.node
    return skeleton_event(SampleHeader(lines=0, skeleton=env), tags, epoch_of(a.time) if a.time else now)


def _errors_event(env: SampleEnvelope, cluster: str, now: int) -> Line:
    """An errors-only sample envelope: a skeleton announcing no lines, at its first error's time and node."""
    tags, ts = errors_tags(env.errors, cluster, node_level=True, now=now)
    tags["function"] = "skeleton"
    return skeleton_event(SampleHeader(lines=0, skeleton=env), tags, ts)
