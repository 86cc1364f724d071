"""Sonar sample envelope -> metric lines + one skeleton event (docs/mapping.md section 4).

Hot path (a node with 128 hwthreads, 4 GPUs and 300 processes gives ~3,000 lines per sample): one tag dict per
level object (node, hwthread, GPU, disk, job, process), shared by all lines of that object; the per-field
work is a getattr, a truth test and one `Line`. Values are converted only where the registry says so.

Zeros (registry `zero`, docs/mapping.md principle 7): the series a dashboard plots per node, hwthread, GPU
and disk get a line for 0 too (an idle node's load is 0, not a gap); zeros that mean "not reported" and
per-process zeros get none, as in Sonar. Either way the round trip is exact: a 0 line puts back the 0 the
skeleton already holds, which Sonar's encoding omits.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from schemas.lineprotocol import Line
from schemas.problems import Problem
from schemas.sonar.types import (
    SampleAttributes,
    SampleEnvelope,
    SampleGpu,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
)
from schemas.translate.common import epoch_of, job_key, tag_value, unique_key, unique_keys
from schemas.translate.events import errors_tags
from schemas.translate.registry import (
    CONV_KIB_TO_MIB,
    CONV_PSTATE,
    REGISTRY,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
    disk_stat_name,
)

__all__ = ["Put", "SampleHeader", "sample_to_lines", "skeleton_event", "unplaceable", "walk_sample"]

_F53 = 2**53
_TINY = 2.2250738585072014e-308  # smallest normal double; line protocol writers print subnormals as 0.0


class SampleHeader(msgspec.Struct, kw_only=True):
    """The payload of a `sample,function=skeleton` event."""

    lines: int
    """Number of metric lines of this envelope (the reassembler's completeness test)."""
    skeleton: SampleEnvelope
    """The envelope with every value that went out as a metric line set to zero."""


def _to_float(v: int | float) -> float | None:
    """A Sonar number as a float line value, or None when the float would not give it back exactly."""
    if type(v) is int:
        return float(v) if -_F53 <= v <= _F53 else None
    return None if -_TINY < v < _TINY and v != 0 else v


def _kib_to_mib(v: int) -> float | None:
    return v / 1024 if v <= _F53 else None


def _pstate(v: int) -> float | None:
    return float(v - 1) if v <= _F53 else None


def _converter(kind: type, conv: str) -> Callable[[int], float | int | None] | None:
    """None = the value goes out as it is (an int: schemas.sonar.types bounds every integer to int64)."""
    if conv == CONV_KIB_TO_MIB:
        return _kib_to_mib
    if conv == CONV_PSTATE:
        return _pstate
    return _to_float if kind is float else None


_Conv = Callable[[int], float | int | None] | None
_Table = tuple[tuple[str, str, _Conv, object, bool], ...]


def _fields(level: str, cls: type[msgspec.Struct], *, boot: bool = False) -> _Table:
    """(attribute, measurement, converter, the attribute's zero, whether a zero is written) for every
    registry entry of `level`; `boot`: the envelope has `system.boot` (Sonar >= 0.15)."""
    defaults = {f.name: f.default for f in msgspec.structs.fields(cls)}
    return tuple(
        (
            m.field,
            m.name,
            _converter(m.kind, m.conv),
            defaults[m.field],
            m.zero == ZERO_WRITTEN or (boot and m.zero == ZERO_WITH_BOOT),
        )
        for m in REGISTRY
        if m.level == level
    )


_NODE = _fields("node", SampleSystem)
_NODE_BOOT = _fields("node", SampleSystem, boot=True)
_GPU = _fields("accelerator", SampleGpu)
_PROC = _fields("process", SampleProcess)
_PGPU = _fields("process_gpu", SampleProcessGpu)
_DISK_NAMES = tuple(disk_stat_name(i) for i in range(17))


def skeleton_event(header: SampleHeader, tags: dict[str, str], time: int) -> Line:
    """The `sample,function=skeleton` event line."""
    return Line("sample", tags, {"event": msgspec.json.encode(header).decode()}, time)


Put = Callable[[dict[str, str], list[tuple[str, float | int]]], None]
"""Receives the metric lines of one object: its tag dict (shared by those lines) and (measurement, value)
pairs, in line order. `sample_to_lines` makes `Line`s of them; `schemas.translate.payloads` writes text."""


def _values(obj: object, table: _Table, zeros: dict[str, object]) -> list[tuple[str, float | int]]:
    """(measurement, value) per non-zero field of `obj` listed in `table`, and per zero where the table says
    so; each field that became a line is recorded in `zeros` (attribute -> zero value) so the skeleton keeps
    only what did not travel as a line."""
    out: list[tuple[str, float | int]] = []
    for attr, name, conv, zero, keep_zero in table:
        v = getattr(obj, attr)
        if v or keep_zero:
            bv = v if conv is None else conv(v)
            if bv is not None:
                out.append((name, bv))
                zeros[attr] = zero
    return out


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
    ts = epoch_of(env.data.attributes.time)
    lines: list[Line] = []
    add = lines.append

    def put(tags: dict[str, str], values: list[tuple[str, float | int]]) -> None:
        for name, v in values:
            add(Line(name, tags, {"value": v}, ts))

    header = walk_sample(env, put)
    lines.insert(0, header)
    return lines


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


def walk_sample(env: SampleEnvelope, put: Put) -> Line:
    """Hand every metric line of a placeable sample to `put`, object by object in line order, and return
    its skeleton event (which announces how many lines went to `put`).

    One walk for both outputs (`Line`s and text), so the lines and the skeleton can never disagree."""
    data = env.data
    assert data is not None
    a = data.attributes
    ts = epoch_of(a.time)
    cl, host = a.cluster, a.node
    count = 0
    node_tags = {"cluster": cl, "hostname": host, "type": "node", "type-id": "0"}

    system = a.system
    zeros: dict[str, object] = {}
    values = _values(system, _NODE_BOOT if system.boot else _NODE, zeros)
    if values:
        put(node_tags, values)
        count += len(values)

    cpus = system.cpus
    if cpus:  # every hwthread listed was measured: its 0 is written too
        for i, v in enumerate(cpus):
            put({"cluster": cl, "hostname": host, "type": "hwthread", "type-id": str(i)}, [("cpu_time", v)])
        count += len(cpus)
        zeros["cpus"] = [0] * len(cpus)

    if system.gpus:
        gpus = []
        for g, key in zip(system.gpus, unique_keys(g.uuid for g in system.gpus), strict=True):
            gz: dict[str, object] = {}
            values = _values(g, _GPU, gz)
            if values:
                put({"cluster": cl, "hostname": host, "type": "accelerator", "type-id": key}, values)
                count += len(values)
            gpus.append(msgspec.structs.replace(g, **gz) if gz else g)
        zeros["gpus"] = gpus

    if system.disks:
        disks = []
        for d, key in zip(system.disks, unique_keys(d.name for d in system.disks), strict=True):
            stats = d.stats
            if stats:
                tags = {
                    "cluster": cl,
                    "hostname": host,
                    "type": "node",
                    "type-id": "0",
                    "stype": "disk",
                    "stype-id": key,
                }
                # every column listed was read: its 0 is written too
                put(tags, [(_DISK_NAMES[i] if i < 17 else disk_stat_name(i), v) for i, v in enumerate(stats)])
                count += len(stats)
                d = msgspec.structs.replace(d, stats=[0] * len(stats))
            disks.append(d)
        zeros["disks"] = disks

    jobs = []
    seen_jobs: set[str] = set()
    seen_procs: set[str] = set()
    for job in a.jobs:
        jk = unique_key(job_key(job.job, job.epoch), seen_jobs)
        base = {"cluster": cl, "hostname": host, "job": str(job.job)}
        if job.user:  # optional: an empty tag value cannot be written
            base["user"] = tag_value(job.user)
        if job.epoch:
            base["epoch"] = str(job.epoch)
        procs = job.processes
        n = len(procs) + sum(p.rolledup for p in procs if p.rolledup > 0)
        put(
            {**base, "type": "node", "type-id": "0", "stype": "job", "stype-id": jk},
            [("job_processes", min(n, 2**63 - 1))],
        )
        count += 1
        new_procs = []
        changed = False
        for p in procs:
            pk = unique_key(f"{jk}/{p.pid}", seen_procs)
            ptags = {**base, "type": "node", "type-id": "0", "stype": "process", "stype-id": pk}
            if p.pid:
                ptags["pid"] = str(p.pid)
            if p.cmd:
                ptags["cmd"] = tag_value(p.cmd)
            if p.ppid:
                ptags["ppid"] = str(p.ppid)
            pz: dict[str, object] = {}
            values = _values(p, _PROC, pz)
            if values:
                put(ptags, values)
                count += len(values)
            if p.gpus:
                pgpus = []
                for pg, gk in zip(p.gpus, unique_keys(x.uuid for x in p.gpus), strict=True):
                    gtags = {**ptags, "type": "accelerator", "type-id": gk}
                    gtags.pop("ppid", None)  # the process lines carry it; one place is enough
                    pgz: dict[str, object] = {}
                    values = _values(pg, _PGPU, pgz)
                    if values:
                        put(gtags, values)
                        count += len(values)
                    pgpus.append(msgspec.structs.replace(pg, **pgz) if pgz else pg)
                pz["gpus"] = pgpus
            if pz:
                p = msgspec.structs.replace(p, **pz)
                changed = True
            new_procs.append(p)
        jobs.append(msgspec.structs.replace(job, processes=new_procs) if changed else job)

    skeleton = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            data,
            attributes=msgspec.structs.replace(
                a, system=msgspec.structs.replace(system, **zeros) if zeros else system, jobs=jobs
            ),
        ),
    )
    header_tags = {**node_tags, "function": "skeleton"}
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
