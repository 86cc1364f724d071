"""Metric lines into the running aggregates: a job's lines on a node are gathered per sample time in a
bucket and folded, oldest first, once the node has a sample `window` seconds newer (the package docstring
says why: redelivery, order, children's CPU time counted once)."""

from __future__ import annotations

import math
from typing import Final

from hpcbus.schemas.jobsummary.state import (
    Bucket,
    Card,
    JobState,
    Limits,
    Node,
    Proc,
    State,
    is_closed,
    job_key,
    job_of,
)
from hpcbus.schemas.lineprotocol import Line

__all__ = [
    "ANCHOR",
    "ENERGY",
    "ENERGY_KEEP",
    "GPU_METRICS",
    "METRICS",
    "PROCESS_METRICS",
    "add_metric",
    "fold_all",
]

PROCESS_METRICS: Final = frozenset({"process_cpu_time", "process_rss", "process_read", "process_written"})
GPU_METRICS: Final = frozenset({"process_acc_utilization", "process_acc_mem_used"})
ANCHOR: Final = "job_processes"
ENERGY: Final = "nv_energy_abs"
METRICS: Final = PROCESS_METRICS | GPU_METRICS | {ANCHOR, ENERGY}
"""Every metric the aggregates read; any other line is passed over."""
ENERGY_KEEP: Final = 64
"""Energy readings kept per card (newest): enough for `window` at any sensible interval."""


def add_metric(state: State, cluster: str, line: Line, now: float, limits: Limits) -> bool:
    """Take one metric line; False when it is not one the aggregates read (or late)."""
    name = line.measurement
    if name not in METRICS:
        return False
    tags = line.tags
    host = tags.get("hostname", "")
    if not host:
        return False
    if name == ENERGY:
        return _add_energy(state, cluster, host, tags.get("type-id", ""), line)
    job = tags.get("job")
    if not job:
        return False
    value = line.fields.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    key = job_key(job, tags.get("epoch", "0"))
    if is_closed(state, cluster, key):
        state.late_lines += 1
        return False
    j = job_of(state, cluster, key, now)
    if not j.user and tags.get("user"):
        j.user = tags["user"]
    node = j.nodes.get(host)
    if node is None:
        if len(j.nodes) >= limits.max_nodes:
            return False
        node = j.nodes[host] = Node()
    t = line.time
    if t <= node.folded:
        node.late_lines += 1
        state.late_lines += 1
        return False
    bucket = node.buckets.get(t)
    if bucket is None:
        bucket = node.buckets[t] = Bucket(values={}, ppids={})
    if name == ANCHOR:
        bucket.values[ANCHOR] = float(value)
    else:
        proc = tags.get("stype-id", "")
        if name in GPU_METRICS:
            slot = f"{name}\t{proc}\t{tags.get('type-id', '')}"
        else:
            slot = f"{name}\t{proc}"
            ppid = tags.get("ppid")
            if ppid:
                bucket.ppids[proc] = f"{key}/{ppid}"
        bucket.values[slot] = float(value)
    if t > node.newest:
        node.newest = t
        _fold(state, cluster, host, node, node.newest - limits.window, limits)
    if len(node.buckets) > limits.max_buckets:
        _fold(
            state, cluster, host, node, sorted(node.buckets)[len(node.buckets) - limits.max_buckets], limits
        )
    return True


def _add_energy(state: State, cluster: str, host: str, card: str, line: Line) -> bool:
    value = line.fields.get("value")
    if not card or not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False  # a NaN/inf reading would make the job's energy unwritable
    readings = state.energy.setdefault(f"{cluster}\t{host}\t{card}", {})
    readings[line.time] = float(value)
    if len(readings) > ENERGY_KEEP:
        for t in sorted(readings)[: len(readings) - ENERGY_KEEP]:
            del readings[t]
    return True


def _fold(state: State, cluster: str, host: str, node: Node, upto: float, limits: Limits) -> None:
    """Fold the node's buckets with sample time <= `upto`, oldest first."""
    for t in sorted(node.buckets):
        if t > upto:
            break
        _fold_one(state, cluster, host, node, t, node.buckets.pop(t), limits)


def _fold_one(
    state: State, cluster: str, host: str, node: Node, t: int, bucket: Bucket, limits: Limits
) -> None:
    procs: dict[str, dict[str, float]] = {}
    gpus: dict[str, list[float]] = {}
    for slot, value in bucket.values.items():
        if slot == ANCHOR:
            continue
        name, _, rest = slot.partition("\t")
        if name in GPU_METRICS:
            _proc, _, card = rest.partition("\t")
            sums = gpus.setdefault(card, [0.0, 0.0])
            sums[0 if name == "process_acc_utilization" else 1] += value
        else:
            procs.setdefault(rest, {})[name] = value
    first = not node.samples
    if first:
        node.first = t
    else:
        gap = t - node.last
        node.min_gap = gap if not node.min_gap else min(node.min_gap, gap)
    node.samples += 1
    node.last = t
    node.folded = t
    # Processes no longer in the sample ended: their counted CPU is owed by their parents' `cpu_time`,
    # which may already include it in this very sample (so this comes first). A process in a sample only
    # through zero-valued lines is omitted by the producer and looks ended; it counted nothing since.
    for key in [k for k in node.procs if k not in procs]:
        gone = node.procs.pop(key)
        node.credit.pop(key, None)
        if gone.ppid and gone.counted and gone.ppid in node.procs:
            node.credit[gone.ppid] = node.credit.get(gone.ppid, 0.0) + gone.counted
    rss = 0.0
    for key, values in procs.items():
        rss += values.get("process_rss", 0.0)
        proc = node.procs.get(key)
        if proc is None:
            proc = node.procs[key] = Proc()
            if first:
                node.cpu_before += values.get("process_cpu_time", 0.0)
        ppid = bucket.ppids.get(key)
        if ppid:
            proc.ppid = ppid
        cpu = values.get("process_cpu_time", proc.cpu)
        if cpu > proc.cpu:
            increase = cpu - proc.cpu
            owed = node.credit.get(key, 0.0)
            if owed:
                paid = min(owed, increase)
                increase -= paid
                if owed - paid > 0:
                    node.credit[key] = owed - paid
                else:
                    del node.credit[key]
            proc.counted += increase
            node.cpu += increase
            proc.cpu = cpu
        for name, attr in (("process_read", "read"), ("process_written", "written")):
            now_value = int(values.get(name, getattr(proc, attr)))
            before = getattr(proc, attr)
            if now_value > before:
                if attr == "read":
                    node.read += now_value - before
                else:
                    node.written += now_value - before
                setattr(proc, attr, now_value)
        proc.seen = t
    node.mem_max = max(node.mem_max, rss)
    node.mem_sum += rss
    if len(node.procs) > limits.max_processes:
        for key in sorted(node.procs, key=lambda k: node.procs[k].seen)[
            : len(node.procs) - limits.max_processes
        ]:
            del node.procs[key]
            node.credit.pop(key, None)
    for card, (util, mem) in gpus.items():
        c = node.cards.get(card)
        if c is None:
            c = node.cards[card] = Card()
        c.samples += 1
        c.util_sum += util
        c.util_max = max(c.util_max, util)
        c.mem_max = max(c.mem_max, mem)
    for card, c in node.cards.items():
        joules = state.energy.get(f"{cluster}\t{host}\t{card}", {}).get(t)
        if joules is not None and card in gpus:
            if c.energy_first is None:
                c.energy_first = joules
            c.energy_last = joules


def fold_all(state: State, job: JobState, limits: Limits) -> None:
    """Fold every open sample of a job (at its end)."""
    for host, node in job.nodes.items():
        _fold(state, job.cluster, host, node, math.inf, limits)
