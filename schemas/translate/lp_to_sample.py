"""Metric lines (+ skeleton events) from any number of NATS messages -> Sonar sample envelopes.

`Assembler` groups by (cluster, hostname, timestamp) — the identity of a Sonar sample — and emits a group when
its skeleton's announced line count is reached (complete), when it is older than the grace window, when too
many groups are open, or when it grew past `max_lines` (partial). Why these rules: a sample's lines may be
split over several messages and subjects (the skeleton travels on `.events.sample`, the values on `.metrics`)
that arrive in any order; waiting for all of them must neither hold memory without bound nor lose data, so
anything that cannot be completed is emitted as it is, flagged, and anything that arrives too late becomes a
follow-up envelope (docs/mapping.md section 4.3).

ClusterCockpit collector lines that have a Sonar meaning only *without* a skeleton (`cpu_user` per hwthread,
`nv_util`, `load_one`, ...: the aliases of section 4.4) never open or extend a group whose (cluster, host, time)
has, or had, a skeleton: the skeleton's own lines already carry those values (hpcbus' node producer sends
both kinds in one message, the CC lines after the Sonar ones). Taken as they were, they were a second,
"follow-up" envelope per sample whose `cpus` were integrated from percentages, zeros between two real samples.

Hot path: `add_lines` does one dict lookup for the measurement and one insert per line (the group is looked
up again only when it changes); all placing and converting happens once per group, when it is emitted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

import msgspec

from schemas.lineprotocol import Line
from schemas.problems import Problem
from schemas.sonar.types import (
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
from schemas.translate.common import (
    Assembled,
    epoch_of,
    job_key,
    own_meta,
    unique_key,
    unique_keys,
    utc_timestamp,
)
from schemas.translate.registry import CONV_KIB_TO_MIB, CONV_PSTATE, REGISTRY
from schemas.translate.sample_to_lp import SampleHeader

__all__ = ["Assembler"]

_U64 = 2**63 - 1
_I64_MIN = -(2**63)
_MAX_CPUS = 1 << 16
"""A hwthread index above this is taken for garbage rather than grown into a list."""
_MAX_DISK_COLUMN = 64


def _to_int(x: float | int) -> int:
    return x if isinstance(x, int) else round(x)


def _to_float(x: float | int) -> float:
    return float(x)


def _mib_to_kib(x: float | int) -> int:
    return round(x * 1024)


def _pstate(x: float | int) -> int:
    return round(x) + 1


class _Target(NamedTuple):
    """Where the value of one measurement goes."""

    level: str
    attr: str
    conv: Callable[[float | int], float | int]
    lo: int
    """Lowest valid Sonar value (0 for uint64, -2^63 for int64 fields); floats are not bounded."""
    counted: bool
    """A registry measurement (counts toward the skeleton's line total); False for ClusterCockpit aliases."""
    column: int = -1
    type: str = ""
    """The `type` tag of lines of this level (docs/mapping.md section 3)."""


def _zero_defaults(struct: type[msgspec.Struct]) -> frozenset[str]:
    """Fields whose default is 0: Sonar omits them when 0, and the bus writes their 0 as a line (a dashboard
    needs the point), so a 0 line must leave the field at its default, or the envelope would not come back
    byte for byte (msgspec omits a float default only when it is the default object itself)."""
    return frozenset(
        f.name for f in msgspec.structs.fields(struct) if type(f.default) in (int, float) and f.default == 0
    )


_ZERO_DEFAULT_SYSTEM = _zero_defaults(SampleSystem)
_ZERO_DEFAULT_GPU = _zero_defaults(SampleGpu)

_TYPE_OF_LEVEL = {
    "node": "node",
    "hwthread": "hwthread",
    "accelerator": "accelerator",
    "disk": "node",
    "job": "node",
    "process": "node",
    "process_gpu": "accelerator",
    "busy": "hwthread",
}
"""The `type` tag a line of each level carries (docs/mapping.md section 3); other lines of the same name are
different quantities (a per-core `cpu_load`, a node-level `cpu_user`) and have no Sonar field."""

_SIGNED = frozenset({"temperature", "rolledup"})
_SONAR_FLOATS = frozenset({"load1", "load5", "load15", "cpu_avg", "cpu_util", "gpu_util", "gpu_memory_util"})


def _target(level: str, attr: str, conv: str, counted: bool, column: int = -1) -> _Target:
    if attr in _SONAR_FLOATS:
        fn: Callable[[float | int], float | int] = _to_float
    elif conv == CONV_KIB_TO_MIB:
        fn = _mib_to_kib
    elif conv == CONV_PSTATE:
        fn = _pstate
    else:
        fn = _to_int
    return _Target(
        level, attr, fn, _I64_MIN if attr in _SIGNED else 0, counted, column, _TYPE_OF_LEVEL[level]
    )


_DISPATCH: dict[str, _Target] = {m.name: _target(m.level, m.field, m.conv, True, m.column) for m in REGISTRY}

# ClusterCockpit collector names (docs/mapping.md section 4.4). Not counted toward a skeleton's total.
_CC_ALIASES: dict[str, _Target] = {
    "load_one": _target("node", "load1", "", False),
    "nv_util": _target("accelerator", "ce_util", "", False),
    "nv_fb_mem_used": _target("accelerator", "memory", CONV_KIB_TO_MIB, False),
    "nv_mem_util": _target("accelerator", "memory_util", "", False),
    "nv_power_usage": _target("accelerator", "power", "", False),
    "nv_temp": _target("accelerator", "temperature", "", False),
    "nv_fan": _target("accelerator", "fan", "", False),
    "nv_sm_clock": _target("accelerator", "ce_clock", "", False),
    "nv_mem_clock": _target("accelerator", "memory_clock", "", False),
    "nv_perf_state": _target("accelerator", "performance_state", CONV_PSTATE, False),
    "nv_power_max_limit": _target("accelerator", "power_limit", "", False),
}
_BUSY_PARTS = ("cpu_user", "cpu_nice", "cpu_system", "cpu_irq", "cpu_softirq")
"""Sonar's busy time per core is user+nice+system+irq+softirq (FACTS: /proc/stat); cpustat sends each as %."""
for _name in (*_BUSY_PARTS, "cpu_used"):
    _CC_ALIASES[_name] = _Target("busy", _name, _to_float, 0, False, -1, "hwthread")
_DISPATCH.update(_CC_ALIASES)
_PROCESS_AS_IS: dict[str, tuple[str, type, int]] = {
    name: (t.attr, float if t.conv is _to_float else int, t.lo)
    for name, t in _DISPATCH.items()
    if t.level == "process" and t.conv in (_to_float, _to_int)
}
"""Process measurements whose line value is the Sonar value itself (when of the Sonar type): (attribute,
type, lowest valid value), for the inline placing in `_Placer.put_all`."""
_COUNTED_TYPE: dict[str, str] = {name: t.type for name, t in _DISPATCH.items() if t.counted}
"""Measurement -> the `type` tag of its level, for the lines that count toward a skeleton's total: the hot
path of `Assembler.add_lines` needs only this; every other line goes through `_DISPATCH`."""

_DISKSTAT_N = re.compile(r"diskstat_([0-9]{1,3})")

_Key = tuple[str, str, int]
_LineKey = tuple[str, str | None, str | None]

# What was emitted for a (cluster, host, time) (`Assembler._emitted`), in increasing order of knowledge.
_BARE = 1
"""Emitted without a skeleton (built from tags)."""
_SKELETON = 2
"""Emitted with its skeleton, partial: the CC aliases of a later line have no Sonar meaning for it."""
_COMPLETE = 3
"""Emitted complete: a skeleton arriving again is a duplicate."""


class _Group:
    """The lines of one (cluster, hostname, time) seen so far."""

    __slots__ = ("created", "expected", "extra", "followup", "header", "key", "limit", "lines")

    def __init__(self, key: _Key, created: float, followup: bool, limit: int):
        self.key = key
        self.created = created
        self.followup = followup
        self.header: SampleHeader | None = None
        self.expected = -1
        self.limit = limit
        """Emit when `len(lines)` reaches this: the announced count, or what `max_lines` leaves room for."""
        self.lines: dict[_LineKey, Line] = {}
        self.extra: dict[_LineKey, Line] = {}


class Assembler:
    """Groups metric lines and skeleton events into SampleEnvelopes (see the module docstring).

    Feed it with `add_lines(lines, cluster=..., now=...)` (`cluster` = the subject's cluster, used for lines
    without a `cluster` tag; `now` = a clock in seconds, monotonic or wall, only compared with itself), call
    `flush(now)` periodically and `flush_all()` at the end. Each returns the envelopes that became ready.
    """

    def __init__(
        self,
        *,
        grace: float = 30.0,
        max_groups: int = 4096,
        max_lines: int = 200_000,
        remember: int | None = None,
        max_hosts: int = 65_536,
    ):
        if grace < 0 or max_groups < 1 or max_lines < 1:
            raise ValueError("grace must be >= 0, max_groups and max_lines >= 1")
        self.grace = grace
        self.max_groups = max_groups
        self.max_lines = max_lines
        self.remember = remember if remember is not None else 16 * max_groups
        self.max_hosts = max_hosts
        self._groups: dict[_Key, _Group] = {}
        self._emitted: dict[_Key, int] = {}
        """Keys already emitted -> the most that any emission of it had: `_BARE`, `_SKELETON` or `_COMPLETE`
        (bounded by `remember`)."""
        self._cpu: dict[tuple[str, str], tuple[int, list[float]]] = {}
        """Per (cluster, host): time of the last integrated group and busy seconds per hwthread."""
        self.ignored = 0
        """Metric lines that have no Sonar field (ClusterCockpit-only metrics), or whose ClusterCockpit alias has
        no Sonar meaning next to a skeleton."""
        self.duplicates = 0
        """Skeletons that arrived again after their complete envelope was emitted (redelivery)."""

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    # --- input ---------------------------------------------------------------------------------------------

    def add_lines(
        self, lines: Iterable[Line], *, cluster: str = "", now: float, others: list[Line] | None = None
    ) -> list[Assembled]:
        """Take lines (metrics of any kind and `sample` skeleton events). Other events are ignored, or appended
        to `others` when given (so that `LpToSonar` routes a mixed stream in this one pass over it).

        The loop is the translator's hot path (~3,000 lines per node sample): a registry line of its own level
        costs two dict lookups, one key tuple and one insert; the current group is found again only when the
        line's (cluster, host, time) differs from the previous line's, compared field by field so that no
        tuple is built for it. Everything else (CC aliases, `diskstat_<k>`, other levels) takes `_add_other`.
        """
        out: list[Assembled] = []
        groups = self._groups
        counted = _COUNTED_TYPE
        group: _Group | None = None
        known: dict[_LineKey, Line] = {}
        g_cluster = g_host = ""
        g_time = limit = 0
        for line in lines:
            fields = line.fields
            if "value" not in fields:
                if line.measurement == "sample" and "event" in fields:
                    self._add_header(line, cluster, now, out)
                    group = None  # it may have emitted the current group
                elif others is not None:
                    others.append(line)
                continue
            meas = line.measurement
            tags = line.tags
            level_type = counted.get(meas)
            if level_type is None or tags.get("type") != level_type:
                self._add_other(line, cluster, now, out)
                group = None
                continue
            t = line.time
            host = tags.get("hostname", "")
            cl = tags.get("cluster") or cluster
            if group is None or t != g_time or host != g_host or cl != g_cluster:
                gkey = (cl, host, t)
                group = groups.get(gkey)
                if group is None:
                    group = self._open(gkey, now, out)
                g_cluster, g_host, g_time = gkey
                known, limit = group.lines, group.limit  # only headers and `_add_other` change the limit
            known[(meas, tags.get("type-id"), tags.get("stype-id"))] = line
            if len(known) >= limit:
                self._emit(group, out)
                group = None
        return out

    def _add_other(self, line: Line, cluster: str, now: float, out: list[Assembled]) -> None:
        """A metric line that is not a registry measurement at its own level: a ClusterCockpit alias (not
        counted toward the skeleton's total), a `diskstat_<k>` column beyond the registry, or ignored.

        An alias stands for a Sonar field only in a stream without skeletons: next to a skeleton (open, or
        already emitted for the same key) it is ClusterCockpit-only data and ignored, never a group of its
        own."""
        meas = line.measurement
        target = _DISPATCH.get(meas)
        if target is None:
            target = self._diskstat_target(meas)
            if target is None:
                self.ignored += 1
                return
        tags = line.tags
        if tags.get("type") != target.type:
            self.ignored += 1  # eg cpu_load per hwthread, cpu_user per node: no Sonar field for them
            return
        gkey = (tags.get("cluster") or cluster, tags.get("hostname", ""), line.time)
        group = self._groups.get(gkey)
        if not target.counted and (
            (group is not None and group.header is not None) or self._emitted.get(gkey, 0) >= _SKELETON
        ):
            self.ignored += 1
            return
        if group is None:
            group = self._open(gkey, now, out)
        lkey = (meas, tags.get("type-id"), tags.get("stype-id"))
        if target.counted:
            group.lines[lkey] = line
        else:
            extra = group.extra  # only in a group without a skeleton (see above): room for the counted lines
            extra[lkey] = line
            group.limit = self.max_lines - len(extra)
        if len(group.lines) >= group.limit:
            self._emit(group, out)

    def _add_header(self, line: Line, cluster: str, now: float, out: list[Assembled]) -> None:
        try:
            header = msgspec.json.decode(str(line.fields["event"]), type=SampleHeader)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Not placeable, but not silently dropped either: an empty partial result carries the problem.
            problem = Problem(f"skeleton not decodable: {exc}", kind="lp event", path="event sample")
            out.append(
                Assembled(kind="sample", envelope=_empty(cluster, line), complete=False, problems=[problem])
            )
            return
        data = header.skeleton.data
        if data is None or not (data.attributes.time and data.attributes.cluster and data.attributes.node):
            # Errors-only, or a sample that could not be placed (`sample_to_lines`): nothing to wait for.
            out.append(Assembled(kind="sample", envelope=header.skeleton))
            return
        a = data.attributes
        gkey = (a.cluster, a.node, epoch_of(a.time))
        if self._emitted.get(gkey, 0) == _COMPLETE and gkey not in self._groups:
            self.duplicates += 1
            return
        group = self._groups.get(gkey)
        if group is None:
            group = self._open(gkey, now, out)
        if group.header is None:
            group.header = header
            group.expected = header.lines
            # ClusterCockpit aliases taken while the skeleton was on its way: CC-only data next to it.
            self.ignored += len(group.extra)
            group.extra.clear()
            group.limit = min(header.lines, self.max_lines)
        if len(group.lines) >= group.limit:
            self._emit(group, out)

    def _diskstat_target(self, meas: str) -> _Target | None:
        m = _DISKSTAT_N.fullmatch(meas)
        if m is None or not 17 < int(m[1]) <= _MAX_DISK_COLUMN:
            return None
        target = _Target("disk", "stats", _to_int, 0, True, int(m[1]) - 1, "node")
        _DISPATCH[meas] = target  # bounded: at most _MAX_DISK_COLUMN names
        _COUNTED_TYPE[meas] = "node"
        return target

    # --- groups ----------------------------------------------------------------------------------------------

    def _open(self, gkey: _Key, now: float, out: list[Assembled]) -> _Group:
        groups = self._groups
        while len(groups) >= self.max_groups:
            self._emit(next(iter(groups.values())), out)
        group = _Group(gkey, now, gkey in self._emitted, self.max_lines)
        groups[gkey] = group
        return group

    def _emit(self, group: _Group, out: list[Assembled]) -> None:
        del self._groups[group.key]
        result = self._build(group)
        emitted = self._emitted
        state = _COMPLETE if result.complete else _SKELETON if group.header is not None else _BARE
        emitted[group.key] = max(state, emitted.pop(group.key, 0))
        while len(emitted) > self.remember:
            del emitted[next(iter(emitted))]
        out.append(result)

    def flush(self, now: float) -> list[Assembled]:
        """Emit every group that has waited `grace` seconds or more (partial envelopes)."""
        out: list[Assembled] = []
        limit = now - self.grace
        groups = self._groups
        while groups:
            group = next(iter(groups.values()))  # insertion order = creation order
            if group.created > limit:
                break
            self._emit(group, out)
        return out

    def flush_all(self) -> list[Assembled]:
        """Emit every open group (end of input)."""
        out: list[Assembled] = []
        while self._groups:
            self._emit(next(iter(self._groups.values())), out)
        return out

    # --- building --------------------------------------------------------------------------------------------

    def _build(self, group: _Group) -> Assembled:
        cluster, host, ts = group.key
        header = group.header
        problems: list[Problem] = []
        if header is not None and header.skeleton.data is not None:
            env = header.skeleton
            attrs = env.data.attributes  # type: ignore[union-attr]
            degraded = False
        else:
            attrs = SampleAttributes(
                time=utc_timestamp(ts),
                cluster=cluster or "unknown",
                node=host or "unknown",
                system=SampleSystem(),
            )
            env = SampleEnvelope(meta=own_meta(), data=SampleData(attributes=attrs))
            degraded = True
        place = _Placer(attrs, problems)
        place.put_all(group.lines.items())
        busy: dict[int, dict[str, float]] = {}
        for (meas, tid, sid), line in group.extra.items():
            target = _DISPATCH[meas]
            if target.level == "busy":
                if tid is not None and tid.isdigit():
                    busy.setdefault(int(tid), {})[meas] = float(line.fields["value"])
            else:
                place.put(target, line, tid, sid)
        if busy and not attrs.system.cpus:
            self._integrate(cluster, host, ts, busy, attrs.system)
        if degraded:
            _canonical_order(attrs)
        complete = header is not None and len(group.lines) >= group.expected
        return Assembled(
            kind="sample", envelope=env, complete=complete, followup=group.followup, problems=problems
        )

    def _integrate(
        self, cluster: str, host: str, ts: int, busy: dict[int, dict[str, float]], system: SampleSystem
    ) -> None:
        """Sonar's cumulative busy seconds per hwthread from ClusterCockpit's per-interval percentages."""
        state = self._cpu.pop((cluster, host), None)
        last, acc = state if state is not None else (ts, [])
        n = max(busy) + 1
        if n > _MAX_CPUS:
            return
        if len(acc) < n:
            acc.extend([0.0] * (n - len(acc)))
        dt = ts - last
        if 0 < dt <= 3600:  # a gap longer than an hour (or time going back) adds nothing rather than a guess
            for i, parts in busy.items():
                pct = (
                    sum(parts[p] for p in _BUSY_PARTS if p in parts)
                    if any(p in parts for p in _BUSY_PARTS)
                    else parts.get("cpu_used", 0.0)
                )
                if pct > 0:
                    acc[i] += pct / 100.0 * dt
        self._cpu[(cluster, host)] = (max(ts, last), acc)
        while len(self._cpu) > self.max_hosts:
            del self._cpu[next(iter(self._cpu))]
        system.cpus = [int(x) for x in acc]


class _Placer:
    """Puts line values into a SampleAttributes, finding (or, for lines the skeleton did not announce,
    creating) the GPU, disk, job, process or process GPU each line belongs to."""

    def __init__(self, attrs: SampleAttributes, problems: list[Problem]):
        self.attrs = attrs
        self.system = attrs.system
        self.problems = problems
        system = attrs.system
        self.gpus = dict(zip(unique_keys(g.uuid for g in system.gpus), system.gpus, strict=True))
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
                    for gk, g in zip(unique_keys(g.uuid for g in p.gpus), p.gpus, strict=True):
                        self.pgpus[(pk, gk)] = g

    def _problem(self, line: Line, reason: str) -> None:
        self.problems.append(
            Problem(reason, kind="lp metric", path=f"measurement {line.measurement}", severity="warning")
        )

    def put_all(self, items: Iterable[tuple[_LineKey, Line]]) -> None:
        """`put` for every line of a group. The two most frequent kinds of line, a process value that goes in
        unconverted (~10 per process on a busy node) and a hwthread's `cpu_time` (one per core), are placed
        right here, because a call per line was a third of the cost of building an envelope; anything else,
        and any value that needs one of the checks `put` makes, goes to `put`."""
        procs = self.procs
        cpus = self.system.cpus
        n_cpus = min(len(cpus), _MAX_CPUS)
        as_is = _PROCESS_AS_IS
        last_sid: str | None = None
        proc: SampleProcess | None = None
        for (meas, tid, sid), line in items:
            spec = as_is.get(meas)
            if spec is not None:
                value = line.fields["value"]
                attr, kind, lo = spec
                if type(value) is kind and (kind is float or lo <= value <= _U64):  # type: ignore[operator]
                    if sid != last_sid:  # a process's lines arrive together
                        proc, last_sid = procs.get(sid or ""), sid
                    if proc is not None and proc.ppid:
                        setattr(proc, attr, value)
                        continue
            elif meas == "cpu_time" and tid is not None and tid.isdigit():
                value = line.fields["value"]
                i = int(tid)
                if i < n_cpus and type(value) is int and 0 <= value <= _U64:
                    cpus[i] = value
                    continue
            self.put(_DISPATCH[meas], line, tid, sid)

    def put(self, target: _Target, line: Line, tid: str | None, sid: str | None) -> None:
        try:
            value = target.conv(line.fields["value"])  # type: ignore[arg-type]
        except (OverflowError, ValueError):
            self._problem(line, f"value {line.fields['value']!r} is not a number Sonar can hold")
            return
        if type(value) is int and not target.lo <= value <= _U64:
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
                if not 0 <= i < _MAX_CPUS:
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
                if value or target.attr not in _ZERO_DEFAULT_GPU:  # a 0 line stays Sonar's absent field
                    setattr(self._gpu(tid or ""), target.attr, value)
            elif level == "node":
                if value or target.attr not in _ZERO_DEFAULT_SYSTEM:
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


def _canonical_order(attrs: SampleAttributes) -> None:
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


def _empty(cluster: str, line: Line) -> SampleEnvelope:
    attrs = SampleAttributes(
        time=utc_timestamp(line.time),
        cluster=line.tags.get("cluster") or cluster or "unknown",
        node=line.tags.get("hostname") or "unknown",
        system=SampleSystem(),
    )
    return SampleEnvelope(meta=own_meta(), data=SampleData(attributes=attrs))
