"""The running aggregates of the jobs a worker follows, as saved in its state file: a job (`JobState`), its
nodes, their processes, cards and open samples (`Bucket`), and the whole `State`. The field order, defaults
and `array_like` choices are the state file's format (`encode.encode_state`): change none of them without a
way to read old files.
"""

from __future__ import annotations

import msgspec

from hpcbus.schemas.jobsummary.summary import Scheduler, Summary

__all__ = [
    "Bucket",
    "Card",
    "JobState",
    "Limits",
    "Node",
    "Proc",
    "State",
    "is_closed",
    "job_key",
    "job_of",
    "state_key",
]


class Limits(msgspec.Struct, kw_only=True, frozen=True):
    """Memory bounds and sample-time rules of the aggregates (the worker's settings fill them)."""

    window: int = 120
    """Seconds of sample time a sample stays open for late lines (see the module docstring)."""
    interval: float = 30.0
    """Sample interval assumed for coverage while a node has given only one sample."""
    max_processes: int = 4096
    """Processes remembered per job and node (the least recently seen are forgotten beyond it)."""
    max_buckets: int = 256
    """Open samples per job and node (the oldest are folded beyond it)."""
    max_nodes: int = 4096
    """Nodes per job."""
    remember: float = 7 * 86400.0
    """Seconds a summarised job is remembered (late records for it are dropped)."""
    max_remembered: int = 100_000


class Proc(msgspec.Struct, kw_only=True, array_like=True):
    """One process of a job on a node: what was counted for it so far."""

    cpu: float = 0.0
    """Its last cumulative `cpu_time` (s)."""
    read: int = 0
    """Its last `process_read` (KiB)."""
    written: int = 0
    ppid: str = ""
    """Parent's process key (`<jobkey>/<ppid>`), "" when unknown."""
    counted: float = 0.0
    """CPU seconds counted for it (credited to the parent when it ends)."""
    seen: int = 0
    """Sample time it was last in."""


class Card(msgspec.Struct, kw_only=True, array_like=True):
    """One GPU as the job used it on one node (sums of its processes on that card)."""

    samples: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    mem_max: float = 0.0
    """MiB."""
    energy_first: float | None = None
    energy_last: float | None = None
    """`nv_energy_abs` (J) at the job's first and last sample on the card."""


class Bucket(msgspec.Struct, kw_only=True):
    """The lines of one sample of a job on a node, keyed so that a repeated line replaces itself."""

    values: dict[str, float] = {}
    """`<measurement>\\t<process key>` (GPU: `...\\t<card>`) -> value."""
    ppids: dict[str, str] = {}
    """process key -> parent's process key."""


class Node(msgspec.Struct, kw_only=True):
    """A job on one node."""

    samples: int = 0
    first: int = 0
    last: int = 0
    """Sample times (s) of the first and the last folded sample."""
    min_gap: int = 0
    """Shortest time between two folded samples: the node's sample interval."""
    cpu: float = 0.0
    mem_max: float = 0.0
    """KiB."""
    mem_sum: float = 0.0
    read: float = 0.0
    """KiB."""
    written: float = 0.0
    folded: int = 0
    """Newest folded sample time: lines at or before it are late."""
    newest: int = 0
    late_lines: int = 0
    procs: dict[str, Proc] = {}
    credit: dict[str, float] = {}
    """process key -> CPU seconds of its ended children not yet seen in its own `cpu_time`."""
    cards: dict[str, Card] = {}
    buckets: dict[int, Bucket] = {}
    hwthreads: int = 0
    """From the node's `nodejob` (its cpuset), 0 when unknown."""
    accelerators: list[str] = []
    nodejob_start: int = 0
    nodejob_end: int = 0
    cpu_before: float = 0.0
    """CPU seconds the processes of the node's first sample had already spent when first seen: time before
    that sample, which counts when the job's start is known; else the job's interval starts at the earliest
    first sample of any node, and only a later node's share of it since then counts (`summarize._before`)."""


class JobState(msgspec.Struct, kw_only=True):
    """Everything known of one job while it runs (saved in the worker's state file)."""

    cluster: str
    job: str
    scheduler: Scheduler = "process"
    user: str = ""
    account: str = ""
    partition: str = ""
    state: str = ""
    start: int = 0
    end: int = 0
    hosts: list[str] = []
    """Allocated nodes (from the job record), [] when unknown."""
    cores: int = 0
    gpus: int = 0
    mem_requested: int = 0
    """Bytes, the job's total request."""
    record: bool = False
    """A job record (start_job, stop_job, Sonar jobs) was seen: its end comes from the batch system."""
    ended_at: float = 0.0
    """Worker clock when the end was learnt (0 = not yet)."""
    active_at: float = 0.0
    """Worker clock of the last line or record for the job."""
    nodes: dict[str, Node] = {}


class State(msgspec.Struct, kw_only=True):
    """The worker's whole state: open jobs and the cards' recent energy readings."""

    jobs: dict[str, JobState] = {}
    """`<cluster>\\t<job key>` -> job."""
    energy: dict[str, dict[int, float]] = {}
    """`<cluster>\\t<host>\\t<card>` -> {sample time: J}, the newest `ENERGY_KEEP`."""
    closed: dict[str, float] = {}
    """Jobs already summarised -> when (worker clock): their late lines and records are dropped, so a
    redelivered record never opens a job again. Pruned after `Limits.remember` seconds / entries."""
    outbox: dict[str, Summary] = {}
    """Summaries made but not yet both published and written to InfluxDB."""
    late_lines: int = 0
    cluster: str = ""
    durable: str = ""
    """What the state belongs to (the worker's cluster and durable; "" in files older than these fields):
    a worker refuses at start a file of another cluster or durable instead of sending its jobs' summaries
    to a cluster it does not serve."""


def job_key(job: str | int, epoch: str | int = 0) -> str:
    """The bus's job key: `<job>` for Slurm and OCS (epoch 0), `<job>@<epoch>` for process groups."""
    return f"{job}@{epoch}" if epoch and str(epoch) != "0" else str(job)


def state_key(cluster: str, job: str) -> str:
    return f"{cluster}\t{job}"


def is_closed(state: State, cluster: str, job: str) -> bool:
    """True when the job was summarised already: what comes for it now is late and left alone."""
    return state_key(cluster, job) in state.closed


def job_of(state: State, cluster: str, job: str, now: float) -> JobState:
    key = state_key(cluster, job)
    found = state.jobs.get(key)
    if found is None:
        scheduler: Scheduler = "process" if "@" in job else "slurm"
        found = state.jobs[key] = JobState(cluster=cluster, job=job, scheduler=scheduler)
    found.active_at = now
    return found
