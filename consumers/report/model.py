"""What a job report says, and how it is worked out from what InfluxDB holds about the job.

`JobData` is what `consumers.report.fetch` read (the `job_summary` point when there is one, the job's
start/stop and node events, and its per-node, per-card series in buckets of `step` seconds); `build` turns it
into a `Report`, which the text, HTML and JSON outputs only render.

Numbers follow the `job_summary` definitions of `consume jobs` (docs/jobs.md section 2): CPU efficiency =
CPU seconds / (cores x elapsed); the job's memory peak = the nodes' peaks summed, beside the job's whole
request (Slurm's `requested_memory_per_node` is the job's total since 21.08; a node's bar gets its even
share of it); GPU utilisation = mean over the job's cards, a card allocated but never seen counting 0 %. When the summary has a value it is taken
(the worker saw every sample, the report sees buckets); what it lacks is computed from the series:

- per bucket, the job's processes on a node are summed (`consume influx` already folds them per job); a
  bucket in which the node reported the job (`job_processes`) but a process series has no point counts as 0,
  because per-process lines are omitted when zero (docs/mapping.md, principle 7);
- CPU seconds = sum over buckets with samples of (mean % of a core / 100) x the part of what the bucket's
  samples measured (each the interval before it: (t - interval, t + step - interval] for a bucket at t full
  of samples) that lies in the job's [start, end] (`_within`): CPU and elapsed time over the same interval,
  so a first sample that measured nothing of the job counts nothing, and one busy thread reads at most one
  core;
- with a summary, its totals and the nodes' CPU figures from its `jobsummary` event, so that they add up;
- coverage = share of the elapsed time covered by buckets with samples.

Nothing is invented: a value that cannot be known (no request, no core count) is None and shown as unknown.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from hpcbus.consumers.report.settings import ReportSettings
from hpcbus.schemas.jobsummary import Thresholds, flags

KIB = 1024
MIB = 1024 * 1024

FLAG_TEXT = {
    "idle_gpu": "A GPU the job used was idle: below {idle_gpu} % utilisation on average. Ask for fewer GPUs, or "
    "check that the program really runs on the GPU.",
    "mem_overrequested": "The job used less than {mem_overrequested} % of the memory it requested (peak {mem_peak} "
    "of {mem_requested}). Requesting less lets it start sooner and leaves memory for others.",
    "cpu_underused": "The CPU cores were under-used: {cpu_eff} of {cores_of} time was spent "
    "computing (threshold {cpu_underused} %). Ask for fewer cores, or check that the program runs in parallel.",
    "no_samples": "No samples were recorded for this job: no node producer reported its processes, so its "
    "use of CPU, memory and GPUs is unknown.",
    "stop_missing": "The job's end was never seen: it was closed after a time limit, so its state and "
    "elapsed time may be wrong.",
}
"""Flag name -> the plain words for it; `{...}` are filled from the report (unknown ones stay as written)."""


class JobRef(msgspec.Struct, frozen=True):
    """A job as the bus keys it: `key` = `<job>` (Slurm, OCS) or `<job>@<epoch>` (process group)."""

    cluster: str
    key: str

    @property
    def job(self) -> str:
        return self.key.split("@", 1)[0]

    @property
    def epoch(self) -> str:
        """The `epoch` tag: "" for batch jobs (the lines carry none)."""
        return self.key.split("@", 1)[1] if "@" in self.key else ""


class Buckets(msgspec.Struct):
    """One series of the job per node (and card): bucket start (epoch s) -> value."""

    hostname: str
    card: str = ""
    values: dict[int, float] = msgspec.field(default_factory=dict)


class JobData(msgspec.Struct, kw_only=True):
    """Everything read from InfluxDB about one job."""

    ref: JobRef
    summary: dict[str, Any] | None = None
    summary_nodes: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """The summary's `per_node` (from its `jobsummary` event): the nodes' figures that add up to its totals."""
    start_job: dict[str, Any] | None = None
    stop_job: dict[str, Any] | None = None
    record: dict[str, Any] | None = None
    """The job's top-level Sonar record from the `slurm` events (Slurm or OCS), merged over time."""
    scheduler_hint: str = ""
    """"ocs" when the record came from an OCS accounting file."""
    user: str = ""
    """The `user` tag of the job's lines (the only name a process group has without node events)."""
    node_events: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """The job's `nodejob` start/end events (node view: hwthreads, accelerators, start and stop)."""
    step: int = 1
    first: int | None = None
    last: int | None = None
    extent: dict[str, tuple[int, int, int]] = msgspec.field(default_factory=dict)
    """hostname -> (first, last, count) of its `job_processes` points: where its samples fall, so what each
    of its buckets measured (`_measured`)."""
    samples: list[Buckets] = msgspec.field(default_factory=list)
    """count of `job_processes` points per bucket and node: where the node reported the job."""
    cpu: list[Buckets] = msgspec.field(default_factory=list)
    """mean `process_cpu_util` (% of a core, the job's processes summed)."""
    mem: list[Buckets] = msgspec.field(default_factory=list)
    """mean `process_rss` (KiB)."""
    mem_max: list[Buckets] = msgspec.field(default_factory=list)
    gpu_util: list[Buckets] = msgspec.field(default_factory=list)
    """mean `process_acc_utilization` (%), per card."""
    gpu_mem: list[Buckets] = msgspec.field(default_factory=list)
    """mean `process_acc_mem_used` (MiB), per card."""
    gpu_mem_max: list[Buckets] = msgspec.field(default_factory=list)
    mem_total: dict[str, float] = msgspec.field(default_factory=dict)
    """hostname -> `mem_total` (KiB)."""
    gpu_mem_total: dict[str, float] = msgspec.field(default_factory=dict)
    """"host/card" -> `nv_fb_mem_total` (MiB)."""


class Gpu(msgspec.Struct, kw_only=True):
    hostname: str
    card: str
    util: float
    """Mean utilisation over the buckets with samples, %."""
    mem_peak: int
    """Bytes."""
    mem_total: int | None = None
    mem_eff: float | None = None
    """Peak / the card's memory, %."""


class Node(msgspec.Struct, kw_only=True):
    hostname: str
    samples: int = 0
    cores: int | None = None
    cpu_seconds: float = 0.0
    cpu_eff: float | None = None
    mem_peak: int = 0
    mem_avg: float = 0.0
    mem_requested: int | None = None
    """The node's even share of the job's request."""
    mem_total: int | None = None
    mem_eff: float | None = None
    """Peak / the node's share of the request, % (None without a request)."""
    gpus: list[Gpu] = msgspec.field(default_factory=list)


class Trace(msgspec.Struct, kw_only=True):
    """One plotted line: `metric` is cpu (cores busy), mem (bytes), gpu_util (%) or gpu_mem (bytes)."""

    name: str
    metric: str
    hostname: str
    card: str = ""
    times: list[int]
    values: list[float]


class Flag(msgspec.Struct):
    name: str
    text: str


class Report(msgspec.Struct, kw_only=True):
    cluster: str
    job: str
    scheduler: str
    """slurm, ocs, process, or "" when the data does not say which batch system."""
    user: str = ""
    account: str = ""
    partition: str = ""
    name: str = ""
    state: str = ""
    nodes: list[str] = msgspec.field(default_factory=list)
    start: int | None = None
    end: int | None = None
    elapsed: float | None = None
    cores: int | None = None
    gpus: int | None = None
    samples: int = 0
    coverage: float | None = None
    cpu_seconds: float | None = None
    cpu_eff: float | None = None
    cores_busy: float | None = None
    """CPU seconds / elapsed: the cores the job kept busy on average (what a job without an allocation,
    a process group, is judged by)."""
    mem_peak: int | None = None
    mem_avg: float | None = None
    mem_requested: int | None = None
    mem_eff: float | None = None
    gpu_util: float | None = None
    gpu_mem_peak: int | None = None
    energy: float | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    flags: list[Flag] = msgspec.field(default_factory=list)
    from_summary: bool = False
    """True when a `job_summary` point was found (its numbers and flags are used)."""
    step: int = 1
    """Seconds per plotted point."""
    per_node: list[Node] = msgspec.field(default_factory=list)
    series: list[Trace] = msgspec.field(default_factory=list)


# --- building -------------------------------------------------------------------------------------------------


def _by_host(series: list[Buckets]) -> dict[str, dict[int, float]]:
    return {b.hostname: b.values for b in series}


def _by_card(series: list[Buckets]) -> dict[tuple[str, str], dict[int, float]]:
    return {(b.hostname, b.card): b.values for b in series}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(*values: Any) -> str:
    return next((str(v) for v in values if isinstance(v, str) and v), "")


def _node_cores(data: JobData) -> dict[str, int]:
    """Cores per node: the node's view (cpuset of the job) where it reported one, else the batch system's
    count spread evenly over its nodes (sacct knows the count, not the placement)."""
    cores: dict[str, int] = {}
    start = data.start_job or {}
    total, count = _int(start.get("numHwthreads")), _int(start.get("numNodes"))
    for r in start.get("resources") or []:
        if isinstance(r, dict) and total and count and total % count == 0:
            cores[str(r.get("hostname", ""))] = total // count
    for event in data.node_events:
        threads = event.get("hwthreads")
        host = str(event.get("hostname", ""))
        if isinstance(threads, list) and threads and (host not in cores or data.ref.epoch):
            cores[host] = len(threads)
    return cores


def _scheduler(data: JobData) -> str:
    if data.summary and data.summary.get("scheduler"):
        return str(data.summary["scheduler"])
    if data.ref.epoch:
        return "process"
    if data.scheduler_hint:
        return data.scheduler_hint
    meta = (data.start_job or {}).get("metaData") or {}
    return "slurm" if isinstance(meta, dict) and "slurmInfo" in meta else ""


def _times(data: JobData) -> tuple[int | None, int | None, str]:
    """Start, end and state from the batch system, else the node events, else the samples."""
    start_job, stop_job, record = data.start_job or {}, data.stop_job or {}, data.record or {}
    start = _int(start_job.get("startTime")) or _int(stop_job.get("startTime"))
    end = _int(stop_job.get("stopTime"))
    state = _str(record.get("job_state"), stop_job.get("jobState"))
    if start_job and not stop_job and not state:
        state = "RUNNING"
    if data.node_events and start is None:
        starts = [_int(e.get("startTime")) for e in data.node_events]
        start = min((s for s in starts if s), default=None)
    if data.node_events and end is None and not data.start_job:
        ends = {
            str(e.get("hostname")): _int(e.get("stopTime")) for e in data.node_events if e.get("stopTime")
        }
        hosts = {str(e.get("hostname")) for e in data.node_events}
        if ends and set(ends) == hosts:
            end = max(v for v in ends.values() if v)
            state = state or "ENDED"
    if start is None:
        start = data.first
    if end is None and data.last is not None:
        end = data.last  # as `consume jobs` ends such a job: its last sample
        state = state or "NO END SEEN"
    return start, end, state.upper()


def build(data: JobData, thresholds: ReportSettings) -> Report:
    """The report of `data` (see the module docstring for what each number means)."""
    summary = data.summary or {}
    start, end, state = _times(data)
    if _int(summary.get("start")) is not None:
        start = _int(summary.get("start"))
    if _int(summary.get("end")) is not None:
        end = _int(summary.get("end"))
    elapsed = _float(summary.get("elapsed"))
    if elapsed is None and start is not None and end is not None:
        elapsed = float(max(0, end - start))
    start_job, record = data.start_job or {}, data.record or {}
    report = Report(
        cluster=data.ref.cluster,
        job=data.ref.key,
        scheduler=_scheduler(data),
        user=_str(summary.get("user"), start_job.get("user"), record.get("user_name"))
        or _str(*(e.get("user") for e in data.node_events), data.user),
        account=_str(summary.get("account"), start_job.get("project"), record.get("account")),
        partition=_str(summary.get("partition"), start_job.get("partition"), record.get("partition")),
        name=_str((start_job.get("metaData") or {}).get("jobName"), record.get("job_name")),
        state=_str(summary.get("state")).upper() or state,
        start=start,
        end=end,
        elapsed=elapsed,
        step=data.step,
        from_summary=bool(summary),
    )
    _per_node(report, data)
    _overall(report, data, summary)
    report.flags = _flags(report, summary, thresholds.thresholds())
    report.series = _traces(data, report.start, report.end)
    return report


def interval(first: int, last: int, count: int) -> int:
    """A node's sample interval (s) from its first and last sample and their count; 1 with one sample."""
    return max(1, round((last - first) / (count - 1))) if count > 1 else 1


def _measured(data: JobData, host: str, t: int, samples: float) -> tuple[float, float]:
    """(lo, hi]: the time the `samples` samples of `host` in the bucket at `t` measured. A bucket holds the
    samples in [t, t + step) (`fetch`: `GROUP BY time(step, offset)`), each the interval before it: with
    the node's samples every `interval` s from its first, the first in the bucket is at s = the first of
    them at or after t, and the bucket measured (s - interval, s + (samples - 1) x interval]. So a point of
    one sample (step = interval) measured (t - step, t], and one of step / interval samples (a long job,
    step > interval) measured (t - interval, t + step - interval], not (t - step, t]. A node of one sample
    (or none known) is taken as sampled evenly over the step."""
    first, last, count = data.extent.get(host, (t, t, 1))
    every = float(interval(first, last, count)) if count > 1 else data.step / max(1.0, samples)
    s = first + max(0, math.ceil((t - first) / every)) * every
    if s >= t + data.step:  # irregular samples: none where the regular ones would be
        s = float(t)
    return s - every, s + (max(1.0, samples) - 1) * every


def _within(data: JobData, host: str, t: int, samples: float, start: int | None, end: int | None) -> float:
    """Seconds of the job's interval [start, end] in what the point of `host` at `t`, of `samples` samples,
    measured (`_measured`): what its busy cores count for. A point whose samples all lie at or before the
    start (the first sample, when nothing earlier says when the job started) measured nothing of the job;
    one just after it, only the part since the start (a process's first `cpu_util` is its lifetime
    average)."""
    lo, hi = _measured(data, host, t, samples)
    if start is not None:
        lo = max(lo, start)
    if end is not None and end > (start or lo):
        hi = min(hi, end)
    return float(max(0.0, hi - lo))


def _per_node(report: Report, data: JobData) -> None:
    cores = _node_cores(data)
    samples, cpu = _by_host(data.samples), _by_host(data.cpu)
    mem, mem_max = _by_host(data.mem), _by_host(data.mem_max)
    gpu_util, gpu_mem_max = _by_card(data.gpu_util), _by_card(data.gpu_mem_max)
    request_mib = _int((data.start_job or {}).get("requestedMemory"))
    record_kib = _int((data.record or {}).get("requested_memory_per_node"))
    requested = request_mib * MIB if request_mib else (record_kib * KIB if record_kib else None)
    report.mem_requested = requested
    hosts = set(samples) | set(cores) | {str(e.get("hostname")) for e in data.node_events}
    hosts |= {
        str(r.get("hostname")) for r in (data.start_job or {}).get("resources") or [] if isinstance(r, dict)
    }
    elapsed = report.elapsed
    for host in sorted(h for h in hosts if h):
        covered = sorted(samples.get(host, {}))
        node = Node(hostname=host, samples=int(sum(samples.get(host, {}).values())), cores=cores.get(host))
        node.cpu_seconds = sum(
            cpu.get(host, {}).get(t, 0.0) / 100.0 * _within(data, host, t, n, report.start, report.end)
            for t, n in samples.get(host, {}).items()
        )
        if node.cores and elapsed:
            node.cpu_eff = 100.0 * node.cpu_seconds / (node.cores * elapsed)
        node.mem_peak = int(max(mem_max.get(host, {}).values(), default=0.0) * KIB)
        node.mem_avg = _mean([mem.get(host, {}).get(t, 0.0) * KIB for t in covered])
        total = data.mem_total.get(host)
        node.mem_total = int(total * KIB) if total else None
        for h, card in sorted(k for k in set(gpu_util) | set(gpu_mem_max) if k[0] == host):
            values = gpu_util.get((h, card), {})
            peak = int(max(gpu_mem_max.get((h, card), {}).values(), default=0.0) * MIB)
            card_total = data.gpu_mem_total.get(f"{h}/{card}")
            gpu = Gpu(
                hostname=h,
                card=card,
                util=_mean([values.get(t, 0.0) for t in covered]) if covered else 0.0,
                mem_peak=peak,
                mem_total=int(card_total * MIB) if card_total else None,
            )
            if gpu.mem_total:
                gpu.mem_eff = 100.0 * peak / gpu.mem_total
            node.gpus.append(gpu)
        report.per_node.append(node)
    share = requested // len(report.per_node) if requested and report.per_node else None
    for node in report.per_node:
        node.mem_requested = share
        if share:
            node.mem_eff = 100.0 * node.mem_peak / share
    report.nodes = [n.hostname for n in report.per_node]


def _overall(report: Report, data: JobData, summary: dict[str, Any]) -> None:
    nodes = report.per_node
    report.samples = sum(n.samples for n in nodes)
    start_job = data.start_job or {}
    report.cores = _int(start_job.get("numHwthreads"))
    if report.cores is None and nodes and all(n.cores for n in nodes):
        report.cores = sum(n.cores or 0 for n in nodes)
    cards = [g for n in nodes for g in n.gpus]
    report.gpus = max(len(cards), _int(start_job.get("numAcc")) or 0) or None
    if report.samples:
        report.cpu_seconds = sum(n.cpu_seconds for n in nodes)
        if report.cores and report.elapsed:
            report.cpu_eff = 100.0 * report.cpu_seconds / (report.cores * report.elapsed)
        report.mem_peak = sum(n.mem_peak for n in nodes)
        report.mem_avg = _mean([n.mem_avg for n in nodes if n.samples])
        if report.elapsed:
            covered = [len(b.values) * data.step for b in data.samples]
            report.coverage = min(100.0, 100.0 * _mean([float(c) for c in covered]) / report.elapsed)
    if report.mem_requested and report.mem_peak is not None:
        report.mem_eff = 100.0 * report.mem_peak / report.mem_requested
    if cards and report.gpus:
        # cards allocated but never seen in use count 0 % (as in the summary)
        report.gpu_util = sum(g.util for g in cards) / report.gpus
        report.gpu_mem_peak = max(g.mem_peak for g in cards)
    # The summary's numbers (from every sample) win over the buckets'.
    for name in (
        "cores",
        "gpus",
        "samples",
        "mem_peak",
        "mem_requested",
        "gpu_mem_peak",
        "read_bytes",
        "write_bytes",
    ):
        value = _int(summary.get(name))
        if value is not None:
            setattr(report, name, value)
    for name in ("cpu_seconds", "cpu_eff", "mem_avg", "mem_eff", "gpu_util", "energy", "coverage"):
        number = _float(summary.get(name))
        if number is not None:
            setattr(report, name, number)
    if summary:
        _summary_nodes(report, data)
    if report.cpu_seconds is not None and report.elapsed:
        report.cores_busy = report.cpu_seconds / report.elapsed
    nodes_count = _int(summary.get("nodes"))
    if nodes_count is not None and nodes_count > len(report.nodes):
        report.nodes += ["?"] * (nodes_count - len(report.nodes))


def _summary_nodes(report: Report, data: JobData) -> None:
    """The nodes' CPU figures from the summary whose totals are shown, so that they add up: its `per_node`,
    or for a one-node job the job's own; several nodes without the event keep the series' figures."""
    figures = {str(n.get("hostname")): n for n in data.summary_nodes if isinstance(n, dict)}
    if not figures and len(report.per_node) == 1 and report.cpu_seconds is not None:
        node = report.per_node[0]
        figures = {node.hostname: {"cpu_seconds": report.cpu_seconds, "cpu_eff": report.cpu_eff}}
    for node in report.per_node:
        found = figures.get(node.hostname)
        if found is None or _float(found.get("cpu_seconds")) is None:
            continue
        node.cpu_seconds = float(found["cpu_seconds"])
        eff = _float(found.get("cpu_eff"))
        if eff is None and node.cores and report.elapsed:
            eff = 100.0 * node.cpu_seconds / (node.cores * report.elapsed)
        node.cpu_eff = eff


def _flags(report: Report, summary: dict[str, Any], t: Thresholds) -> list[Flag]:
    """The summary's flags, in plain words; without a summary, the summary's rules on the report's numbers."""
    if summary:
        names = [n for n in str(summary.get("flags") or "").split(",") if n]
        names += [
            k[5:] for k, v in summary.items() if k.startswith("flag_") and v is True and k[5:] not in names
        ]
    else:
        names = flags(
            t,
            samples=report.samples,
            gpus=report.gpus,
            gpu_utils=[g.util for n in report.per_node for g in n.gpus],
            mem_peak=report.mem_peak,
            mem_requested=report.mem_requested,
            cpu_eff=report.cpu_eff,
        )
    values = {
        "idle_gpu": f"{t.idle_gpu:g}",
        "mem_overrequested": f"{t.mem_overrequested:g}",
        "cpu_underused": f"{t.cpu_underused:g}",
        "mem_peak": size(report.mem_peak),
        "mem_requested": size(report.mem_requested),
        "cpu_eff": percent(report.cpu_eff),
        "cores": str(report.cores) if report.cores is not None else "?",
        "cores_of": (
            f"the {report.cores} cores' of its cpuset (a process group has no allocation)"
            if report.scheduler == "process"
            else f"the allocated {report.cores if report.cores is not None else '?'} cores'"
        ),
    }
    out = []
    for name in names:
        template = FLAG_TEXT.get(name)
        text = template.format(**values) if template else f"flagged {name!r} by the jobs worker."
        out.append(Flag(name, text))
    return out


def _traces(data: JobData, start: int | None, end: int | None) -> list[Trace]:
    """The plotted lines: zeros filled in where the node reported the job but a process series is silent
    (a node whose processes all idled has no CPU series at all, and gets a line at 0). A CPU point that
    measured nothing of the job is left out, not drawn as 0: one whose samples measured nothing after the
    start (`_within`), and a
    node's first point without a value (no earlier reading to measure an interval from)."""
    samples = _by_host(data.samples)
    traces = []
    for metric, series, scale, label in (
        ("cpu", data.cpu, 0.01, "cpu"),
        ("mem", data.mem, float(KIB), "memory"),
        ("gpu_util", data.gpu_util, 1.0, "gpu"),
        ("gpu_mem", data.gpu_mem, float(MIB), "gpu memory"),
    ):
        lines = list(series)
        if metric in ("cpu", "mem"):
            lines += [Buckets(host) for host in samples if host not in {b.hostname for b in series}]
        for b in sorted(lines, key=lambda b: (b.hostname, b.card)):
            times = sorted(set(samples.get(b.hostname, {})) | set(b.values))
            if metric == "cpu":
                counts = samples.get(b.hostname, {})
                times = [t for t in times if _within(data, b.hostname, t, counts.get(t, 1.0), start, end) > 0]
                if len(times) > 1 and times[0] not in b.values and any(t in b.values for t in times):
                    times = times[1:]
            name = f"{label} {b.hostname}" + (f" {b.card}" if b.card else "")
            values = [b.values.get(t, 0.0) * scale for t in times]
            traces.append(
                Trace(name=name, metric=metric, hostname=b.hostname, card=b.card, times=times, values=values)
            )
    return traces


# --- words shared by the renderers ----------------------------------------------------------------------------


def size(n: float | None) -> str:
    """Bytes as a short binary size: `1.5 GiB`."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def percent(p: float | None) -> str:
    return "?" if p is None or math.isnan(p) else f"{p:.1f} %"


def duration(seconds: float | None) -> str:
    """`D-HH:MM:SS` as Slurm writes elapsed times (days only when there are some)."""
    if seconds is None:
        return "?"
    s = round(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text
