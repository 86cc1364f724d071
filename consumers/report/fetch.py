"""Which job the user means, and everything InfluxDB holds about it, read as `consume influx` stores it.

What is read (docs/mapping.md; names checked against a real `produce node` + `produce slurm` + `consume
influx` run, see tests/test_report_pipeline.py):

- `job_summary` (one point per job from `consume jobs`; tag `job` = the bus's job key), when there is one;
  with it the `jobsummary` event's `per_node` (the nodes' figures that add up to the summary's totals);
- `job_processes`, `process_cpu_util`, `process_rss` (node level) and `process_acc_utilization`,
  `process_acc_mem_used` (card level, `type-id` = the card): the job's processes on each node, selected by
  the `job` and `epoch` tags (no `epoch` tag for batch jobs), which both of the writer's process policies
  keep (`aggregate` folds per job; `full` keeps a series per process, which the sums per bucket add up);
- `job` events (`start_job`/`stop_job` from `produce slurm` and `produce ocs`: user, account, partition,
  cores, requested memory, start, stop, state), `slurm` events (the Sonar record: the state in Slurm's
  words, and whether it came from an OCS accounting file), `nodejob` events (each node's view: its cores);
- `mem_total`, `nv_fb_mem_total`: the size of each node's memory and card, for the bars of jobs without a
  memory request.

Events have no job tag (one series per kind keeps InfluxDB's series count flat), so they are found by a
regular expression on the JSON, restricted to a window around the job's samples when there are any.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from hpcbus.consumers.report.model import Buckets, JobData, JobRef, interval
from hpcbus.influx.query import Influx, exact, ident, literal, regex

DAY = 86400


class NoSuchJob(Exception):
    """No job matched, or several did: the message says which and lists the candidates."""


Progress = Callable[[str], None]


def _where(*conditions: str) -> str:
    return " AND ".join(c for c in conditions if c)


def _cluster(cluster: str) -> str:
    return f"{ident('cluster')} = {literal(cluster)}" if cluster else ""


def _window(start: int | None, end: int | None) -> str:
    parts = []
    if start is not None:
        parts.append(f"time >= {int(start)}s")
    if end is not None:
        parts.append(f"time <= {int(end)}s")
    return " AND ".join(parts)


def _job_tags(ref: JobRef) -> str:
    return f"{ident('job')} = {literal(ref.job)} AND {ident('epoch')} = {literal(ref.epoch)}"


def _event_regex(key: str, number: str) -> str:
    """`"<key>":<number>` followed by the end of that value (`"jobId":12` must not match 123)."""
    return regex(f'"{exact(key)}":{exact(number)}[,}}]')


# --- which job -----------------------------------------------------------------------------------------------


async def resolve(influx: Influx, text: str, cluster: str, progress: Progress) -> tuple[JobRef, list[JobRef]]:
    """The job `text` names, and the other jobs a bare number also matched (the named one wins when it is
    exactly a bus key). Raises NoSuchJob when none or several equally good ones match."""
    progress("finding the job")
    number = text.split("@", 1)[0]
    found: set[JobRef] = set()
    where = _where(_cluster(cluster), f"{ident('job')} = {literal(number)}")
    if "@" in text:
        where = _where(where, f"{ident('epoch')} = {literal(text.split('@', 1)[1])}")
    for s in await influx.query(
        f'SELECT last("value") FROM "job_processes" WHERE {where} GROUP BY "cluster", "epoch"'
    ):
        epoch = s.tags.get("epoch", "")
        found.add(JobRef(s.tags.get("cluster", ""), f"{number}@{epoch}" if epoch else number))
    like = regex(f"^{exact(number)}(@[0-9]+)?$") if "@" not in text else regex(f"^{exact(text)}$")
    summaries = _where(_cluster(cluster), f'"job" =~ {like}')
    for s in await influx.query(
        f'SELECT last("flags") FROM "job_summary" WHERE {summaries} GROUP BY "cluster", "job"'
    ):
        found.add(JobRef(s.tags.get("cluster", ""), s.tags.get("job", "")))
    if "@" not in text and not (cluster and any(r.key == text for r in found)):
        # A batch job that no node sampled is known only by its events (and must not lose to a process
        # group that happens to have the same number); asked even when one cluster has the job by its
        # samples or summary, since another cluster's job of that number may be known by its events alone.
        progress("looking for the job's start and stop events")
        events = _where(_cluster(cluster), f'"event" =~ {_event_regex("jobId", number)}')
        for s in await influx.query(f'SELECT "event" FROM "job" WHERE {events} GROUP BY "cluster"'):
            found.add(JobRef(s.tags.get("cluster", ""), number))
    exact_hits = sorted((r for r in found if r.key == text), key=lambda r: (r.cluster, r.key))
    others = sorted((r for r in found if r.key != text), key=lambda r: (r.cluster, r.key))
    where_text = f" in cluster {cluster}" if cluster else ""
    if len(exact_hits) == 1:
        return exact_hits[0], others
    if len(exact_hits) > 1 or (not exact_hits and len(others) > 1):
        listed = "\n".join(f"  --cluster {r.cluster} --job {r.key}" for r in exact_hits or others)
        raise NoSuchJob(f"job {text!r} is ambiguous{where_text}; name one of:\n{listed}")
    if others:
        return others[0], []
    raise NoSuchJob(
        f"no data for job {text!r}{where_text} in InfluxDB ({influx.settings.url}, db {influx.db!r})"
    )


# --- what is known about it ----------------------------------------------------------------------------------


def _decode(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _summary(influx: Influx, ref: JobRef) -> dict[str, Any] | None:
    where = _where(_cluster(ref.cluster), f"{ident('job')} = {literal(ref.key)}")
    rows = [row for s in await influx.query(f'SELECT * FROM "job_summary" WHERE {where}') for row in s.rows()]
    if not rows:
        return None
    return {k: v for k, v in rows[-1].items() if v is not None}


async def _summary_nodes(influx: Influx, ref: JobRef) -> list[dict[str, Any]]:
    """The `per_node` of the job's `jobsummary` event (the summary's nodes, which its totals add up); []
    when InfluxDB holds no such event (the writer was not subscribed to it, or it is older than this)."""
    where = _where(_cluster(ref.cluster), f"{ident('job')} = {literal(ref.key)}")
    for s in await influx.query(f'SELECT last("event") FROM "jobsummary" WHERE {where}'):
        for row in s.rows():
            nodes = _decode(row.get("last")).get("per_node")
            if isinstance(nodes, list):
                return [n for n in nodes if isinstance(n, dict)]
    return []


async def _extent(influx: Influx, ref: JobRef) -> tuple[dict[str, tuple[int, int, int]], str, str]:
    """hostname -> (first, last, count) of the job's `job_processes` points; the WHERE clause of the job's
    series; the user its lines are tagged with."""
    where = _where(_cluster(ref.cluster), _job_tags(ref))
    out: dict[str, tuple[int, int, int]] = {}
    firsts = await influx.query(
        f'SELECT first("value") FROM "job_processes" WHERE {where} GROUP BY "hostname"'
    )
    lasts = await influx.query(f'SELECT last("value") FROM "job_processes" WHERE {where} GROUP BY "hostname"')
    counts = await influx.query(
        f'SELECT count("value") FROM "job_processes" WHERE {where} GROUP BY "hostname", "user"'
    )
    first = {s.tags.get("hostname", ""): int(s.values[0][0]) for s in firsts if s.values}
    last = {s.tags.get("hostname", ""): int(s.values[0][0]) for s in lasts if s.values}
    count = {s.tags.get("hostname", ""): int(s.values[0][1]) for s in counts if s.values}
    for host in first:
        out[host] = (first[host], last.get(host, first[host]), count.get(host, 1))
    users = sorted({s.tags.get("user", "") for s in counts} - {""})
    return out, where, users[0] if users else ""


async def _events(
    influx: Influx, measurement: str, key: str, ref: JobRef, window: tuple[int | None, int | None]
) -> list[tuple[int, dict[str, str], dict[str, Any]]]:
    """(time, tags, decoded JSON) of the events of `measurement` that name the job, oldest first."""
    where = _where(_cluster(ref.cluster), f'"event" =~ {_event_regex(key, ref.job)}', _window(*window))
    out = []
    for s in await influx.query(f"SELECT * FROM {ident(measurement)} WHERE {where}"):
        for row in s.rows():
            tags = {k: str(v) for k, v in row.items() if k not in ("time", "event") and isinstance(v, str)}
            out.append((int(row.get("time") or 0), tags, _decode(row.get("event"))))
    out.sort(key=lambda e: e[0])
    return out


def _merge_record(
    events: list[tuple[int, dict[str, str], dict[str, Any]]], job: str
) -> tuple[dict[str, Any], str]:
    """The job's top-level record over all `slurm` events (later fields win: producers send what changed),
    and "ocs" when an OCS accounting file was its source."""
    merged: dict[str, Any] = {}
    hint = ""
    for _, _, envelope in events:
        meta = envelope.get("meta") or {}
        attrs = {a.get("key"): a.get("value") for a in meta.get("attrs") or [] if isinstance(a, dict)}
        attributes = (envelope.get("data") or {}).get("attributes") or {}
        for record in attributes.get("slurm_jobs") or []:
            if str(record.get("job_id")) == job and not record.get("job_step"):
                merged.update(record)
                if attrs.get("translated-from") == "ocs-accounting":
                    hint = "ocs"
                elif meta.get("producer") in ("hpcbus", "sonar"):
                    hint = hint or "slurm"
    return merged, hint


async def _buckets(influx: Influx, statement: str, column: str, *, card: bool = False) -> list[Buckets]:
    out = []
    for s in await influx.query(statement):
        values = {int(r["time"]): float(r[column]) for r in s.rows() if r.get(column) is not None}
        out.append(Buckets(s.tags.get("hostname", ""), s.tags.get("type-id", "") if card else "", values))
    return out


async def fetch(influx: Influx, ref: JobRef, max_points: int, progress: Progress) -> JobData:
    """Everything about `ref`; raises NoSuchJob when InfluxDB holds nothing about it at all."""
    progress("reading the job summary")
    data = JobData(ref=ref, summary=await _summary(influx, ref))
    if data.summary:
        data.summary_nodes = await _summary_nodes(influx, ref)
    progress("finding the job's samples")
    extent, where, data.user = await _extent(influx, ref)
    if extent:
        data.first = min(f for f, _, _ in extent.values())
        data.last = max(last for _, last, _ in extent.values())
    window: tuple[int | None, int | None] = (None, None)
    if data.first is not None and data.last is not None:
        window = (data.first - DAY, data.last + DAY)
    elif (
        data.summary
        and isinstance(data.summary.get("start"), int)
        and isinstance(data.summary.get("end"), int)
    ):
        window = (data.summary["start"] - DAY, data.summary["end"] + DAY)
    if not ref.epoch:
        progress("reading the job's start and stop")
        for _, tags, event in await _events(influx, "job", "jobId", ref, window):
            if str(event.get("jobId")) != ref.job:
                continue
            if tags.get("function") == "start_job":
                data.start_job = event
            elif tags.get("function") == "stop_job":
                data.stop_job = event
        start = (data.start_job or {}).get("startTime")
        stop = (data.stop_job or {}).get("stopTime")
        if window == (None, None) and isinstance(start, int):
            window = (start - DAY, (stop if isinstance(stop, int) else start) + DAY)
        progress("reading the batch system's record")
        # Records are stamped when they were read, which for an accounting file read late (OCS) is long
        # after the job: no upper bound.
        since = (window[0], None)
        data.record, data.scheduler_hint = _merge_record(
            await _events(influx, "slurm", "job_id", ref, since), ref.job
        )
    progress("reading the nodes' view of the job")
    for _, tags, event in await _events(influx, "nodejob", "jobId", ref, window):
        if str(event.get("jobId")) == ref.job and str(event.get("epoch") or "") == ref.epoch:
            event.setdefault("hostname", tags.get("hostname", ""))
            data.node_events.append(event)
    if not extent and not data.summary and not data.start_job and not data.stop_job and not data.node_events:
        raise NoSuchJob(f"no data for job {ref.key!r} in cluster {ref.cluster}")
    if extent:
        await _series(influx, data, extent, where, max_points, progress)
    return data


async def _series(
    influx: Influx,
    data: JobData,
    extent: dict[str, tuple[int, int, int]],
    where: str,
    max_points: int,
    progress: Progress,
) -> None:
    assert data.first is not None and data.last is not None
    span = max(1, data.last - data.first)
    data.extent = extent
    data.step = max(min(interval(*e) for e in extent.values()), math.ceil(span / max(1, max_points)))
    within = _where(where, _window(data.first, data.last))
    queries = (
        ("samples", "count", "job_processes", False),
        ("cpu", "sum", "process_cpu_util", False),
        ("mem", "sum", "process_rss", False),
        ("mem_max", "max", "process_rss", False),
        ("gpu_util", "sum", "process_acc_utilization", True),
        ("gpu_mem", "sum", "process_acc_mem_used", True),
        ("gpu_mem_max", "max", "process_acc_mem_used", True),
    )
    for i, (name, function, measurement, card) in enumerate(queries, 1):
        progress(f"reading the job's series {i}/{len(queries)} ({name}, {data.step} s per point)")
        # Buckets start at the first sample's time (InfluxDB's are aligned to the epoch without an offset), so
        # a point's time is a sample's. The bucket at t holds the samples in [t, t + step), each of which
        # measured the interval before it: together (t - interval, t + step - interval] when step > interval,
        # not the step before t (`model._measured`).
        by = f'time({data.step}s, {data.first % data.step}s), "hostname"' + (', "type-id"' if card else "")
        statement = f'SELECT {function}("value") AS "v" FROM {ident(measurement)} WHERE {within} GROUP BY {by} fill(none)'
        setattr(data, name, await _buckets(influx, statement, "v", card=card))
    _per_sample(data)
    hosts = " OR ".join(f"{ident('hostname')} = {literal(h)}" for h in sorted(extent))
    near = _window(data.first - DAY, data.last)
    progress("reading the nodes' memory and cards")
    nodes = _where(_cluster(data.ref.cluster), f"({hosts})", near)
    for s in await influx.query(f'SELECT last("value") FROM "mem_total" WHERE {nodes} GROUP BY "hostname"'):
        data.mem_total[s.tags.get("hostname", "")] = float(s.values[0][1])
    if data.gpu_util or data.gpu_mem:
        cards = f'SELECT last("value") FROM "nv_fb_mem_total" WHERE {nodes} GROUP BY "hostname", "type-id"'
        for s in await influx.query(cards):
            data.gpu_mem_total[f"{s.tags.get('hostname', '')}/{s.tags.get('type-id', '')}"] = float(
                s.values[0][1]
            )


def _per_sample(data: JobData) -> None:
    """Sums over a bucket divided by the samples in it: the mean per sample of the job's processes summed
    (`sum` over all points, so the `full` policy's per-process series add up to the job's)."""
    counts = {b.hostname: b.values for b in data.samples}
    for series in (data.cpu, data.mem, data.gpu_util, data.gpu_mem):
        for b in series:
            n = counts.get(b.hostname, {})
            b.values = {t: v / max(1.0, n.get(t, 1.0)) for t, v in b.values.items()}
