"""The `jobsummary` event's JSON as structs (docs/jobs.md section 4): the job, its nodes and its cards. The
field order and `omit_defaults` are the event's wire form (`encode.event_line`) and, through the worker's
outbox, part of its state file."""

from __future__ import annotations

from typing import Literal

import msgspec

from hpcbus.schemas.jobsummary.flags import Thresholds

__all__ = ["Closed", "GpuSummary", "NodeSummary", "Scheduler", "Summary"]

Scheduler = Literal["slurm", "ocs", "process"]

Closed = Literal["end", "stop_missing", "evicted"]
"""Why a summary was made: the job's end, no stop within `stop_timeout`, or the `max_jobs` bound."""


class NodeSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    hostname: str
    samples: int = 0
    first: int | None = None
    last: int | None = None
    cores: int | None = None
    cpu_seconds: float | None = None
    """CPU seconds the job's processes used on this node; written even when 0 (None only when not built from
    a node's aggregates)."""
    cpu_eff: float | None = None
    mem_max: int | None = None
    """Bytes: the maximum over time of the job's resident memory on this node (Slurm's MaxRSS of a task)."""
    mem_avg: float | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    coverage: float | None = None


class GpuSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    hostname: str
    card: str
    """The accelerator `type-id` (NVML uuid or PCI bus id)."""
    samples: int = 0
    util: float | None = None
    """Mean over the job's samples of the card: its processes' utilisation summed (%)."""
    util_max: float | None = None
    mem_peak: int | None = None
    """Bytes: the maximum of the job's processes' memory on the card, summed per sample."""
    energy: float | None = None
    """J, the card's energy counter between the job's first and last sample on it."""


class Summary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The `jobsummary` event's JSON (docs/jobs.md); absent = unknown, never made up."""

    cluster: str
    job: str
    scheduler: Scheduler
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    state: str | None = None
    start: int | None = None
    end: int | None = None
    elapsed: float | None = None
    nodes: int | None = None
    cores: int | None = None
    gpus: int | None = None
    samples: int
    """Samples of the job, summed over its nodes (always present: 0 means none came)."""
    cpu_seconds: float | None = None
    cpu_eff: float | None = None
    ave_cpu: float | None = None
    mem_peak: int | None = None
    mem_avg: float | None = None
    mem_requested: int | None = None
    mem_eff: float | None = None
    max_rss: int | None = None
    max_rss_node: str | None = None
    ave_rss: float | None = None
    gpu_util: float | None = None
    gpu_mem_peak: int | None = None
    energy: float | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    coverage: float | None = None
    flags: list[str]
    """Names from `FLAGS`, in that order; [] when none."""
    closed: Closed
    """Why the summary was made: the job's end, no stop within `stop_timeout`, or the `max_jobs` bound."""
    thresholds: Thresholds
    per_node: list[NodeSummary]
    per_gpu: list[GpuSummary]
    late_lines: int = 0
    """Lines that came for samples already folded (dropped, not counted)."""
