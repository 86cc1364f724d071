"""Slurm jobs envelopes <-> `slurm` events, and cc-backend's `start_job`/`stop_job` (docs/mapping.md section 6).

Sonar -> bus: the envelope travels whole (cut into parts when large by `schemas.sonar.split`, each part a
valid envelope); derived
cc-backend events are added for ClusterCockpit, tagged `origin=sonar` so the way back does not count them twice.

Bus -> Sonar: whole envelopes come back exactly (`JobsAssembler`); job information from ClusterCockpit
(start_job/stop_job) or single-record `slurm,function=record` events is merged per (cluster, job, step) —
later records override earlier ones field by field, as the Sonar spec prescribes for its partial and redundant
Slurm records — and flushed as one JobsEnvelope per cluster after the grace window.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from hpcbus.schemas.ccbackend import (
    Resource,
    StartJob,
    StopJob,
    cc_job_state,
    job_event_line,
    read_start_job,
    read_stop_job,
)
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.noderange import compress, expand, is_placeholder
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.values import TERMINAL_STATES, parse_tres
from hpcbus.schemas.sonar.types import JobsAttributes, JobsData, JobsEnvelope, SlurmJob
from hpcbus.schemas.translate.common import Assembled, epoch_of, own_meta, utc_timestamp
from hpcbus.schemas.translate.events import (
    MAX_PART_BYTES,
    envelope_event,
    errors_tags,
    placed,
    sonar_event_parts,
)

__all__ = ["JobsAssembler", "cc_job_events", "jobs_to_lines"]

_SLURM_FIELDS = {f.name: f.default for f in msgspec.structs.fields(SlurmJob)}


def jobs_to_lines(
    env: JobsEnvelope,
    *,
    cluster: str = "",
    cc_events: bool = True,
    max_part_bytes: int = MAX_PART_BYTES,
    problems: list[Problem] | None = None,
    now: int = 0,
) -> list[Line]:
    """The `slurm` event(s) of one jobs envelope, then (with `cc_events`) the derived start/stop events.

    `problems`, when given, collects a warning for each cc-backend event that could not be derived because
    the record lacks what cc-backend needs (see `cc_job_events`); the envelope itself always travels.
    """
    data = env.data
    if data is None:
        tags, ts = errors_tags(env.errors, cluster, node_level=False, now=now)
        return [envelope_event("slurm", env, tags, ts)]
    a = data.attributes
    tags, ts = placed(a.time, a.cluster, cluster, now)
    lines = [
        Line("slurm", part_tags, {"event": payload.decode()}, ts)
        for part_tags, payload in sonar_event_parts(env, tags, max_part_bytes)
    ]
    if cc_events and "cluster" in tags:  # cc-backend's jobs need their cluster: none is made up
        lines.extend(cc_job_events(a.slurm_jobs, tags["cluster"], ts, problems=problems))
    elif cc_events and a.slurm_jobs and problems is not None:
        problems.append(
            Problem(
                "no start_job/stop_job for cc-backend: the envelope names no cluster and none was given",
                kind="sonar job",
                path="data.attributes.cluster",
                severity="warning",
            )
        )
    return lines


def _hosts(nodes: list[str]) -> tuple[list[str], tuple[int, str] | None]:
    """Host names of a record's node ranges, and `(index, reason)` of the first entry that is not a host list
    (None when all are). Placeholders such as "None assigned" are not hosts, and no error either."""
    hosts: list[str] = []
    for j, rng in enumerate(nodes):
        if is_placeholder(rng):
            continue
        try:
            hosts.extend(expand(rng))
        except ValueError as exc:
            return hosts, (j, str(exc))
    return hosts, None


def cc_state(job_state: str) -> str:
    """cc-backend jobState of a Slurm state: `CANCELLED by 2101037` -> `cancelled`; "" when it has none."""
    try:
        return cc_job_state(job_state.split(" ", 1)[0])
    except ValueError:
        return ""


def _count(tres: str, name: str) -> int:
    try:
        value = parse_tres(tres).get(name, "")
    except ValueError:
        return 0
    return int(value) if value.isdigit() else 0


def cc_job_events(
    records: Iterable[SlurmJob], cluster: str, time: int, *, problems: list[Problem] | None = None
) -> list[Line]:
    """cc-backend `job,function=start_job|stop_job` events for the top-level records (docs/mapping.md 6).

    Payloads and lines are `schemas.ccbackend`'s, so a job derived from Sonar and one derived from sacct by the
    Slurm producer look the same to cc-backend.

    Only `job_id` and `job_state` are sure to be in a record (the spec's other two mandatory fields are the
    step and the name); everything else may be absent from a record that carries changed fields only. Nothing
    is made up for cc-backend: a start_job needs `start_time`, `user_name` and real `nodes` (cc-backend's
    `user`, `resources`, `numNodes`), so a started top-level record lacking the user or the nodes gets no
    start_job and, when `problems` is given, a warning naming what is missing; an absent `submit_time` is
    left out of the payload (cc-backend's `submitTime` is optional). A record without `start_time` gets
    neither event (a stop_job needs the start time that identifies the job).
    """
    out = []
    for i, rec in enumerate(records):
        if rec.job_step or not rec.start_time:
            continue
        start = epoch_of(rec.start_time)
        hosts, bad = _hosts(rec.nodes)
        if bad is not None:  # a wrong host list is not "nodes absent": say which entry and why
            if problems is not None:
                problems.append(
                    Problem(
                        f"job {rec.job_id}: no start_job for cc-backend: {bad[1]}",
                        kind="sonar job",
                        path=f"data.attributes.slurm_jobs[{i}].nodes[{bad[0]}]",
                        severity="warning",
                    )
                )
            hosts = []
        elif not (hosts and rec.user_name) and problems is not None:
            missing = [name for name, ok in (("user_name", rec.user_name), ("nodes", hosts)) if not ok]
            problems.append(
                Problem(
                    f"job {rec.job_id}: no start_job for cc-backend: {' and '.join(missing)} absent "
                    "(cc-backend needs user, resources and numNodes; nothing is made up)",
                    kind="sonar job",
                    severity="warning",
                )
            )
        if hosts and rec.user_name:
            payload = StartJob(
                job_id=rec.job_id,
                cluster=cluster,
                user=rec.user_name,
                resources=[Resource(hostname=h) for h in hosts],
                num_nodes=len(hosts),
                start_time=start,
                partition=rec.partition,
                project=rec.account,
                num_hwthreads=_count(rec.allocated_resources, "cpu") or rec.requested_cpus,
                num_acc=_count(rec.allocated_resources, "gres/gpu"),
                walltime=rec.time_limit - 2 if rec.time_limit >= 2 else 0,  # real Sonar: seconds + 2
                requested_memory=rec.requested_memory_per_node // 1024,
                array_job_id=rec.array_job_id,
                submit_time=epoch_of(rec.submit_time) if rec.submit_time else 0,
                meta_data={"jobName": rec.job_name} if rec.job_name else {},
            )
            out.append(job_event_line(payload, time, cluster=cluster, origin="sonar"))
        state = rec.job_state.split(" ", 1)[0]
        if state in TERMINAL_STATES and rec.end_time:
            stop = StopJob(
                job_id=rec.job_id,
                cluster=cluster,
                start_time=start,
                stop_time=max(start, epoch_of(rec.end_time)),
                job_state=cc_job_state(state),
            )
            out.append(job_event_line(stop, time, cluster=cluster, origin="sonar"))
    return out


# --- bus -> Sonar -------------------------------------------------------------------------------------------


class _Parts:
    __slots__ = ("created", "parts", "total")

    def __init__(self, created: float, total: int):
        self.created = created
        self.total = total
        self.parts: dict[int, JobsEnvelope] = {}


class _Loose:
    """Records of one cluster merged from ClusterCockpit events and single-record events."""

    __slots__ = ("created", "newest", "records")

    def __init__(self, created: float):
        self.created = created
        self.newest = 0
        self.records: dict[tuple[int, str], tuple[int, dict[str, Any]]] = {}


class JobsAssembler:
    """`slurm`/`job` events -> JobsEnvelopes (see the module docstring)."""

    def __init__(self, *, grace: float = 30.0, max_groups: int = 256, max_records: int = 100_000):
        self.grace = grace
        self.max_groups = max_groups
        self.max_records = max_records
        self._parts: dict[tuple[str, int, int], _Parts] = {}
        self._loose: dict[str, _Loose] = {}

    @property
    def waiting(self) -> bool:
        """Something is held for a later envelope."""
        return bool(self._parts or self._loose)

    def add_lines(self, lines: Iterable[Line], *, cluster: str = "", now: float) -> list[Assembled]:
        out: list[Assembled] = []
        for line in lines:
            payload = line.fields.get("event")
            if not isinstance(payload, str):
                continue
            tags = line.tags
            if line.measurement == "slurm":
                function = tags.get("function")
                if function == "sonar":
                    self._envelope(line, payload, cluster, now, out)
                elif function == "record":
                    self._record(line, payload, cluster, now, out)
            elif line.measurement == "job" and tags.get("origin") != "sonar":
                self._cc_event(line, payload, cluster, now, out)
        return out

    # whole envelopes, possibly in parts

    def _envelope(self, line: Line, payload: str, cluster: str, now: float, out: list[Assembled]) -> None:
        try:
            env = msgspec.json.decode(payload, type=JobsEnvelope)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            out.append(_problem_only(cluster or line.tags.get("cluster", ""), line, f"slurm envelope: {exc}"))
            return
        tags = line.tags
        if "parts" not in tags:
            out.append(Assembled(kind="job", envelope=env))
            return
        try:
            part, total = int(tags.get("part", "")), int(tags["parts"])
        except ValueError:
            out.append(Assembled(kind="job", envelope=env, complete=False))
            return
        key = (tags.get("cluster") or cluster, line.time, total)
        group = self._parts.get(key)
        if group is None:
            while len(self._parts) >= self.max_groups:
                out.append(self._join(self._parts.pop(next(iter(self._parts)))))
            group = self._parts[key] = _Parts(now, total)
        group.parts[part] = env
        if len(group.parts) >= total:
            del self._parts[key]
            out.append(self._join(group))

    @staticmethod
    def _join(group: _Parts) -> Assembled:
        envs = [group.parts[i] for i in sorted(group.parts)]
        first = envs[0]
        if first.data is None:
            return Assembled(kind="job", envelope=first, complete=len(envs) == group.total)
        records = [r for e in envs if e.data is not None for r in e.data.attributes.slurm_jobs]
        attrs = msgspec.structs.replace(first.data.attributes, slurm_jobs=records)
        env = msgspec.structs.replace(first, data=msgspec.structs.replace(first.data, attributes=attrs))
        complete = sorted(group.parts) == list(range(1, group.total + 1))
        return Assembled(kind="job", envelope=env, complete=complete)

    # loose records

    def _record(self, line: Line, payload: str, cluster: str, now: float, out: list[Assembled]) -> None:
        try:
            raw = msgspec.json.decode(payload)
            rec = msgspec.convert(raw, SlurmJob)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            out.append(_problem_only(cluster or line.tags.get("cluster", ""), line, f"slurm record: {exc}"))
            return
        fields = {k: getattr(rec, k) for k in raw if k in _SLURM_FIELDS}
        self._merge(line.tags.get("cluster") or cluster, line.time, fields, now, out)

    def _cc_event(self, line: Line, payload: str, cluster: str, now: float, out: list[Assembled]) -> None:
        function = line.tags.get("function")
        try:
            if function == "start_job":
                fields = _from_start(read_start_job(payload))
            elif function == "stop_job":
                fields = _from_stop(read_stop_job(payload))
            else:
                return
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            out.append(_problem_only(cluster or line.tags.get("cluster", ""), line, f"{function}: {exc}"))
            return
        cl = fields.pop("_cluster", "") or line.tags.get("cluster") or cluster
        self._merge(cl, line.time, fields, now, out)

    def _merge(
        self, cluster: str, time: int, fields: dict[str, Any], now: float, out: list[Assembled]
    ) -> None:
        job_id = fields.get("job_id", 0)
        if not isinstance(job_id, int) or job_id < 1:
            return
        pending = self._loose.get(cluster)
        if pending is None:
            pending = self._loose[cluster] = _Loose(now)
        key = (job_id, fields.get("job_step", ""))
        old = pending.records.get(key)
        if old is None:
            pending.records[key] = (time, fields)
        else:
            old_time, old_fields = old
            if time >= old_time:
                pending.records[key] = (time, {**old_fields, **fields})
            else:
                pending.records[key] = (old_time, {**fields, **old_fields})
        pending.newest = max(pending.newest, time)
        if len(pending.records) >= self.max_records:
            out.append(self._loose_envelope(cluster, self._loose.pop(cluster)))

    @staticmethod
    def _loose_envelope(cluster: str, pending: _Loose) -> Assembled:
        records = []
        problems = []
        for _time, fields in pending.records.values():
            f = dict(fields)
            if not f.get("job_state"):
                # The spec's one mandatory field an event may not carry (a stop_job without jobState, and no
                # start_job to say RUNNING): reported, never made up. Absent fields stay absent.
                problems.append(
                    Problem(
                        f"job {f.get('job_id')}: no job_state known (a Sonar record must carry one); left out",
                        kind="slurm record",
                        severity="error",
                    )
                )
                continue
            try:
                records.append(msgspec.convert(f, SlurmJob))
            except msgspec.ValidationError as exc:
                problems.append(
                    Problem(f"job {f.get('job_id')}: {exc}", kind="slurm record", severity="error")
                )
        attrs = JobsAttributes(
            time=utc_timestamp(pending.newest), cluster=cluster or "unknown", slurm_jobs=records
        )
        env = JobsEnvelope(meta=own_meta("clustercockpit"), data=JobsData(attributes=attrs))
        return Assembled(kind="job", envelope=env, complete=False, problems=problems)

    def flush(self, now: float) -> list[Assembled]:
        out: list[Assembled] = []
        limit = now - self.grace
        for key in [k for k, g in self._parts.items() if g.created <= limit]:
            out.append(self._join(self._parts.pop(key)))
        for cl in [c for c, p in self._loose.items() if p.created <= limit]:
            out.append(self._loose_envelope(cl, self._loose.pop(cl)))
        return out

    def flush_all(self) -> list[Assembled]:
        return self.flush(float("inf"))


def _from_start(job: StartJob) -> dict[str, Any]:
    """Sonar SlurmJob fields of a cc-backend start_job."""
    f: dict[str, Any] = {"job_id": job.job_id, "job_state": "RUNNING", "_cluster": job.cluster}
    if job.user:
        f["user_name"] = job.user
    if job.project:
        f["account"] = job.project
    if job.partition:
        f["partition"] = job.partition
    if job.array_job_id:
        f["array_job_id"] = job.array_job_id
    hosts = [r.hostname for r in job.resources if r.hostname]
    if hosts:
        try:
            f["nodes"] = compress(hosts)
        except ValueError:
            f["nodes"] = sorted(hosts)
    if job.num_nodes:
        f["requested_node_count"] = job.num_nodes
    if job.num_hwthreads:
        f["requested_cpus"] = job.num_hwthreads
    if job.walltime:
        f["time_limit"] = job.walltime + 2
    if job.submit_time:
        f["submit_time"] = utc_timestamp(job.submit_time)
    if job.start_time:
        f["start_time"] = utc_timestamp(job.start_time)
    if job.meta_data.get("jobName"):
        f["job_name"] = job.meta_data["jobName"]
    return f


def _from_stop(job: StopJob) -> dict[str, Any]:
    """Sonar SlurmJob fields of a cc-backend stop_job."""
    f: dict[str, Any] = {"job_id": job.job_id, "_cluster": job.cluster}
    if job.job_state:
        f["job_state"] = job.job_state.upper()
    if job.start_time:
        f["start_time"] = utc_timestamp(job.start_time)
    if job.stop_time:
        f["end_time"] = utc_timestamp(job.stop_time)
    return f


def _problem_only(cluster: str, line: Line, reason: str) -> Assembled:
    """An undecodable event: reported with an empty envelope rather than dropped without a word."""
    attrs = JobsAttributes(time=utc_timestamp(line.time), cluster=cluster or "unknown")
    env = JobsEnvelope(meta=own_meta(), data=JobsData(attributes=attrs))
    problem = Problem(reason, kind="lp event", path=f"event {line.measurement}")
    return Assembled(kind="job", envelope=env, complete=False, problems=[problem])
