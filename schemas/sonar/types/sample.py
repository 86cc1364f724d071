"""A node's state at one point in time: the attributes of a `sample` envelope, down to processes and GPUs."""

from __future__ import annotations

import msgspec

from hpcbus.schemas.sonar.types.common import Error, SonarStruct
from hpcbus.schemas.sonar.types.scalars import (
    Clustername,
    ExtendedUint,
    Hostname,
    Int64,
    NonemptyString,
    OptionalTimestamp,
    Timestamp,
    Uint,
)


class SampleGpu(SonarStruct, kw_only=True):
    """Utilization figures for one GPU card; some fields are available on some cards only."""

    index: Uint = 0
    """Local card index, may change at boot (Sonar omits it for card 0)."""
    uuid: NonemptyString = ""
    """Card UUID."""
    failing: Uint = 0
    """If not zero, an error code indicating a card failure state; 1 is "generic failure"."""
    fan: Uint = 0
    """Percent of primary fan's max speed, may exceed 100% on some cards."""
    compute_mode: str = ""
    """Current compute mode, card-specific if known at all."""
    performance_state: ExtendedUint = 0
    """Current performance level, card-specific, as ExtendedUint (0 = unknown, so P0 is sent as 2)."""
    memory: Uint = 0
    """Memory use in kilobytes."""
    ce_util: Uint = 0
    """Percent of computing element capability used."""
    memory_util: Uint = 0
    """Percent of memory used."""
    temperature: Int64 = 0
    """Degrees C card temperature at primary sensor (can be negative)."""
    power: Uint = 0
    """Watts current power usage."""
    power_limit: Uint = 0
    """Watts current power limit."""
    ce_clock: Uint = 0
    """Compute element current clock (MHz)."""
    memory_clock: Uint = 0
    """Memory current clock (MHz)."""


class SampleDisk(SonarStruct, kw_only=True):
    """One block device's counters from /proc/diskstats (not in the spec text; Sonar v0.15)."""

    name: str = ""
    """Device name, eg "sda1", "nvme0n1", "dm-0"."""
    major: Uint = 0
    """Device major number."""
    minor: Uint = 0
    """Device minor number."""
    stats: list[Uint] = []
    """The numeric columns of the device's /proc/diskstats line, in kernel order (17 on current kernels)."""


class SampleSystem(SonarStruct, kw_only=True):
    """State of the node as a whole, independent of the jobs running on it."""

    boot: OptionalTimestamp = ""
    """Boot time of the node, in UTC (not in the spec text; Sonar v0.15)."""
    cpus: list[Uint] = []
    """Per core: CPU seconds used since boot (the spec's SampleCpu)."""
    gpus: list[SampleGpu] = []
    """The state of individual GPU devices."""
    disks: list[SampleDisk] = []
    """Per block device counters (not in the spec text; Sonar v0.15)."""
    used_memory: Uint = 0
    """Primary memory in use in kilobytes (MemTotal - MemAvailable)."""
    load1: float = 0.0
    """One-minute load average (not in the spec text; Sonar v0.15)."""
    load5: float = 0.0
    """Five-minute load average (not in the spec text; Sonar v0.15)."""
    load15: float = 0.0
    """Fifteen-minute load average (not in the spec text; Sonar v0.15)."""
    runnable_entities: Uint = 0
    """Currently runnable scheduling entities, processes and threads (not in the spec text; Sonar v0.15)."""
    existing_entities: Uint = 0
    """Currently existing scheduling entities (not in the spec text; Sonar v0.15)."""


class SampleProcessGpu(SonarStruct, kw_only=True):
    """Per-process per-GPU sample data."""

    index: Uint = 0
    """Local card index, may change at boot."""
    uuid: NonemptyString = ""
    """Card UUID."""
    gpu_util: float = 0.0
    """Current GPU percentage utilization for the process on the card."""
    gpu_memory: Uint = 0
    """Current GPU memory used in kilobytes for the process on the card."""
    gpu_memory_util: float = 0.0
    """Current GPU memory usage percentage for the process on the card."""


class SampleProcess(SonarStruct, kw_only=True):
    """Sample values for a single process within a job."""

    resident_memory: Uint = 0
    """Kilobytes of private resident memory."""
    virtual_memory: Uint = 0
    """Kilobytes of virtual data+stack memory."""
    cmd: str = ""
    """The command (not the command line); zombies get a <defunct> annotation."""
    pid: Uint = 0
    """Process ID; zero (omitted) for rolled-up processes."""
    ppid: Uint = 0
    """Parent-process ID."""
    in_container: bool = False
    """The process runs in a container (not in the spec text)."""
    num_threads: Uint = 0
    """Number of threads minus one: the main thread is not counted (not in the spec text)."""
    cpu_avg: float = 0.0
    """Average CPU percentage over the process's lifetime; 100.0 is one full core."""
    cpu_util: float = 0.0
    """Current sampled CPU utilization; 100.0 is one full core."""
    cpu_time: Uint = 0
    """Cumulative CPU time in seconds over the process's lifetime."""
    data_read: Uint = 0
    """Kilobytes read, from /proc/<pid>/io (not in the spec text)."""
    data_written: Uint = 0
    """Kilobytes written, from /proc/<pid>/io (not in the spec text)."""
    data_cancelled: Uint = 0
    """Kilobytes of cancelled writes, from /proc/<pid>/io (not in the spec text)."""
    rolledup: Int64 = 0
    """Number of additional processes with the same cmd rolled into this record."""
    gpus: list[SampleProcessGpu] = []
    """GPU sample data for all cards used by the process."""


class SampleJob(SonarStruct, kw_only=True):
    """Sample data for a single job on the node. (job, epoch) identify it; epoch is 0 for Slurm jobs."""

    job: Uint = 0
    """The job ID: the Slurm job ID, or the process group ID for a non-Slurm job."""
    user: NonemptyString = ""
    """User name; `_user_<uid>` if only the uid is known, `_user_unknown` otherwise."""
    epoch: Uint = 0
    """Zero for batch jobs, otherwise a boot counter of the node (never 0 together with job 0)."""
    processes: list[SampleProcess] = []
    """Processes in the job, all with the same job ID."""


class SampleAttributes(SonarStruct, kw_only=True):
    """The state of a node and of its processes at a point in time."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Clustername = ""
    """The canonical cluster name whence the datum originated."""
    node: Hostname = ""
    """The name of the node as it is known to the node itself."""
    system: SampleSystem = msgspec.field(default_factory=SampleSystem)
    """State of the node as a whole."""
    jobs: list[SampleJob] = []
    """State of jobs on the node; empty for a heartbeat from an idle node."""
    errors: list[Error] = []
    """Recoverable errors, if any."""
