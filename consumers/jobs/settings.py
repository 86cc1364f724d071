"""Options of `hpcbus consume jobs` (TOML table `[jobs]`; flags win over the file)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from hpcbus.keys import (
    CPU_UNDERUSED,
    IDLE_GPU,
    LEASE_TTL,
    MEM_OVERREQUESTED,
    PUBLISH_TIMEOUT,
    CpuUnderused,
    IdleGpu,
    LeaseTtl,
    MemOverrequested,
    PublishTimeout,
)
from hpcbus.options import Section
from hpcbus.schemas.jobsummary import Limits, Thresholds, Timing, thresholds_of


class JobsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """When a job's summary is made, what is flagged, and where the running aggregates are kept."""

    state: Literal["file", "jetstream"] = "file"
    """Where the running aggregates are kept. `file`: `state_file` on this host (one worker per cluster;
    its host gone, so are its open jobs). `jetstream`: entries of the cluster's roles bucket
    (`HPCBUS_ROLES_<cluster>`, replicated like the streams) that only the holder of the cluster's `jobs`
    lease may write: run a second worker of the cluster on another host; one acts, the other stands by and
    takes over within `lease_ttl` plus a few seconds when the first dies or stops (docs/jobs.md)."""
    lease_ttl: LeaseTtl = LEASE_TTL
    state_file: str = ""
    """File holding the running aggregates of every open job (rewritten atomically before input is
    acknowledged, so a restarted worker goes on where it stopped). One per worker: run one `consume jobs`
    per cluster. "" = `jobs-<cluster>-<durable>.state` in the service's state directory (systemd's
    `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/hpcbus` or `~/.local/state/hpcbus`), never the current
    directory. The file records its cluster and durable; a worker refuses one of another."""
    save_seconds: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    """Least time between two writes of `state_file` (input is acknowledged after the write that holds it,
    so keep it well below `ack_wait`); raise it when the state is large."""
    grace: Annotated[float, msgspec.Meta(ge=0.0)] = 60.0
    """Seconds after a job's end is known (stop_job, a terminal Slurm/OCS state, its nodes' `nodejob`
    ends) before its summary is made, for samples still on their way."""
    window: Annotated[int, msgspec.Meta(ge=1)] = 120
    """Seconds of sample time a job's sample on a node stays open for late or redelivered lines. Keep it
    above `ack_wait` plus one sample interval: after a crash, unacknowledged messages come back that late."""
    record_wait: Annotated[float, msgspec.Meta(ge=0.0)] = 300.0
    """Seconds a Slurm job (epoch 0) that its nodes saw end (`nodejob` ends) waits for the batch system's
    records before it is summarised without them: a short job can start and end between two polls of
    `produce slurm`, whose records then come after the nodes' events. 0 where no batch-system producer runs."""
    stop_timeout: Annotated[float, msgspec.Meta(gt=0.0)] = 3 * 86400.0
    """Seconds without any line or record for a job the batch system announced (or a node saw start)
    before it is closed without its stop, flagged `stop_missing`."""
    process_quiet: Annotated[float, msgspec.Meta(gt=0.0)] = 300.0
    """Seconds without samples after which a job nobody announced (a process group) has ended."""
    interval: Annotated[float, msgspec.Meta(gt=0.0)] = 30.0
    """Sample interval assumed for coverage while a node has sent only one sample of a job (from two on,
    the node's own interval is used)."""
    idle_gpu: IdleGpu = IDLE_GPU
    mem_overrequested: MemOverrequested = MEM_OVERREQUESTED
    cpu_underused: CpuUnderused = CPU_UNDERUSED
    max_jobs: Annotated[int, msgspec.Meta(ge=1)] = 20_000
    """Open jobs kept, at all times: a line or record that would open one more summarises the least
    recently active job at once (`closed: evicted`, docs/jobs.md section 3)."""
    max_summaries: Annotated[int, msgspec.Meta(ge=1)] = 5_000
    """Summaries waiting to be sent beyond which input is acknowledged only once they are sent (a burst
    that evicts many jobs, InfluxDB or NATS slow or away): the input waits in JetStream instead of the
    summaries in memory and in `state_file`."""
    max_processes: Annotated[int, msgspec.Meta(ge=1)] = 4096
    """Processes remembered per job and node."""
    max_nodes: Annotated[int, msgspec.Meta(ge=1)] = 4096
    """Nodes per job."""
    publish_timeout: PublishTimeout = PUBLISH_TIMEOUT

    def thresholds(self) -> Thresholds:
        return thresholds_of(self)

    def timing(self) -> Timing:
        return Timing(
            grace=self.grace,
            stop_timeout=self.stop_timeout,
            process_quiet=self.process_quiet,
            record_wait=self.record_wait,
            max_jobs=self.max_jobs,
        )

    def limits(self) -> Limits:
        return Limits(
            window=self.window,
            interval=self.interval,
            max_processes=self.max_processes,
            max_nodes=self.max_nodes,
        )


JOBS = Section(
    "jobs",
    JobsSettings,
    metavars={
        "state_file": "FILE",
        "window": "S",
        "save_seconds": "S",
        "record_wait": "S",
        "interval": "S",
        "idle_gpu": "PERCENT",
        "mem_overrequested": "PERCENT",
        "cpu_underused": "PERCENT",
    },
)
