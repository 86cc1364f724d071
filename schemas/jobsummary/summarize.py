"""A finished job's aggregates into its `Summary`: Slurm's words with Slurm's meaning, absent when unknown
(the package docstring and docs/jobs.md say what each number is)."""

from __future__ import annotations

from hpcbus.schemas.jobsummary.flags import Thresholds, flags
from hpcbus.schemas.jobsummary.state import JobState, Limits, Node
from hpcbus.schemas.jobsummary.summary import Closed, GpuSummary, NodeSummary, Summary

__all__ = ["summarize"]


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def _before(node: Node, begin: int) -> float:
    """CPU seconds of `node` spent before `begin`, where the interval of a job whose start is unknown begins
    (the earliest first sample of any node). What the processes of the node's first sample had spent lies
    before that sample: for the node(s) first sampled at `begin`, all of it is before the interval. A node
    first sampled later (its agent started late) spent part of it inside: as much as its own rate (the CPU
    seconds after its first sample / the time to its last) would spend between `begin` and its first
    sample, at most all of it, stays in the interval, the rest is before. A node sampled once has no rate,
    so all of it is taken as before (an under-count, never more cores busy than there were). Per node, so
    the nodes' figures still add up to the job's."""
    gap = node.first - begin
    span = node.last - node.first
    if gap <= 0 or span <= 0:
        return node.cpu_before
    rate = max(0.0, node.cpu - node.cpu_before) / span
    return node.cpu_before - min(node.cpu_before, rate * gap)


def summarize(
    job: JobState,
    thresholds: Thresholds,
    limits: Limits,
    closed: Closed = "end",
) -> Summary:
    """The summary of a job whose samples are all folded (`fold_all`)."""
    nodes_seen = {h: n for h, n in job.nodes.items() if n.samples}
    first = min((n.first for n in nodes_seen.values()), default=0)
    last = max((n.last for n in nodes_seen.values()), default=0)
    start = job.start or min((n.nodejob_start for n in job.nodes.values() if n.nodejob_start), default=0)
    # CPU and elapsed time over the same interval: from a known start, all the CPU of the job's processes
    # (they started in the job); from the first sample, only what was spent after it (`_before`).
    cpu = {h: n.cpu if start else max(0.0, n.cpu - _before(n, first)) for h, n in nodes_seen.items()}
    start = start or first
    end = job.end or last
    elapsed = float(end - start) if start and end and end >= start else None
    hosts = job.hosts or sorted(job.nodes)
    cores = job.cores or sum(n.hwthreads for n in job.nodes.values()) or None
    samples = sum(n.samples for n in nodes_seen.values())
    per_node: list[NodeSummary] = []
    covered = 0.0
    for host in sorted(set(hosts) | set(job.nodes)):
        node = job.nodes.get(host)
        if node is None or not node.samples:
            per_node.append(NodeSummary(hostname=host))
            continue
        node_cores = node.hwthreads or (cores if len(hosts) == 1 else 0) or None
        step = node.min_gap or limits.interval
        node_covered = min(node.samples * step, elapsed) if elapsed else None
        covered += node_covered or 0.0
        per_node.append(
            NodeSummary(
                hostname=host,
                samples=node.samples,
                first=node.first,
                last=node.last,
                cores=node_cores,
                cpu_seconds=cpu[host],
                cpu_eff=_pct(cpu[host], node_cores * elapsed) if node_cores and elapsed else None,
                mem_max=int(node.mem_max * 1024),
                mem_avg=node.mem_sum * 1024 / node.samples,
                read_bytes=int(node.read * 1024),
                write_bytes=int(node.written * 1024),
                coverage=_pct(node_covered, elapsed) if node_covered is not None and elapsed else None,
            )
        )
    per_gpu: list[GpuSummary] = []
    allocated: set[tuple[str, str]] = set()
    for host, node in job.nodes.items():
        allocated.update((host, card) for card in node.accelerators)
        allocated.update((host, card) for card in node.cards)
    for host, card in sorted(allocated):
        c = job.nodes[host].cards.get(card)
        if c is None or not c.samples:
            per_gpu.append(GpuSummary(hostname=host, card=card, util=0.0 if samples else None))
            continue
        energy = None
        if c.energy_first is not None and c.energy_last is not None:
            energy = c.energy_last - c.energy_first
        per_gpu.append(
            GpuSummary(
                hostname=host,
                card=card,
                samples=c.samples,
                util=round(c.util_sum / c.samples, 3),
                util_max=c.util_max,
                mem_peak=int(c.mem_max * 1024 * 1024),
                energy=energy,
            )
        )
    gpus = max(job.gpus, len(per_gpu)) or None
    measured = [g for g in per_gpu if g.util is not None]
    gpu_util: float | None = None
    if gpus and samples:
        # cards allocated but never seen (a count without ids) are unused cards: 0 %
        gpu_util = round(sum(g.util or 0.0 for g in measured) / max(gpus, len(measured)), 3)
    gpu_mem = [g.mem_peak for g in per_gpu if g.mem_peak is not None]
    energies = [g.energy for g in per_gpu if g.energy is not None]
    cpu_seconds = sum(cpu.values()) if samples else None
    maxima = {h: n.mem_max * 1024 for h, n in nodes_seen.items()}
    mem_peak = int(sum(maxima.values())) if samples else None
    max_rss_node = max(maxima, key=lambda h: maxima[h]) if maxima else None
    mem_requested = job.mem_requested or None
    cpu_eff = _pct(cpu_seconds, cores * elapsed) if cpu_seconds is not None and cores and elapsed else None
    names = flags(
        thresholds,
        samples=samples,
        gpus=gpus,
        gpu_utils=[g.util for g in per_gpu],
        mem_peak=mem_peak,
        mem_requested=mem_requested,
        cpu_eff=cpu_eff,
        stop_missing=closed == "stop_missing",
    )
    nodes_count = len(hosts) or None
    return Summary(
        cluster=job.cluster,
        job=job.job,
        scheduler=job.scheduler,
        user=job.user or None,
        account=job.account or None,
        partition=job.partition or None,
        state=job.state or None,
        start=start or None,
        end=end or None,
        elapsed=elapsed,
        nodes=nodes_count,
        cores=cores,
        gpus=gpus,
        samples=samples,
        cpu_seconds=cpu_seconds,
        cpu_eff=cpu_eff,
        ave_cpu=cpu_seconds / len(nodes_seen) if cpu_seconds is not None else None,
        mem_peak=mem_peak,
        mem_avg=sum(n.mem_sum * 1024 / n.samples for n in nodes_seen.values()) if samples else None,
        mem_requested=mem_requested,
        mem_eff=_pct(mem_peak, mem_requested) if mem_peak is not None and mem_requested else None,
        max_rss=int(maxima[max_rss_node]) if max_rss_node else None,
        max_rss_node=max_rss_node,
        ave_rss=sum(maxima.values()) / len(maxima) if maxima else None,
        gpu_util=gpu_util,
        gpu_mem_peak=max(gpu_mem) if gpu_mem else None,
        energy=sum(energies) if energies else None,
        read_bytes=int(sum(n.read for n in nodes_seen.values()) * 1024) if samples else None,
        write_bytes=int(sum(n.written for n in nodes_seen.values()) * 1024) if samples else None,
        coverage=_pct(covered, elapsed * nodes_count) if elapsed and nodes_count else None,
        flags=names,
        closed=closed,
        thresholds=thresholds,
        per_node=per_node,
        per_gpu=per_gpu,
        late_lines=sum(n.late_lines for n in job.nodes.values()),
    )
