"""Per-job summaries from the bus: the running aggregates of a job and the `jobsummary` / `job_summary` it
ends as (docs/jobs.md is the specification). Pure: lines and records in, structs and lines out; the worker
(`consumers/jobs/`) owns the clock, the bus, the state file and InfluxDB.

**What is read.** Per-process lines (`process_cpu_time`, `process_rss`, `process_read`, `process_written`),
per-process GPU lines (`process_acc_utilization`, `process_acc_mem_used`, below the card's `type-id`, so a
card shared by several jobs is split between them), `job_processes` (one per job, node and sample: the
sample's anchor), the cards' `nv_energy_abs`; and the job records: cc-backend `start_job`/`stop_job`, Sonar
jobs envelopes (`slurm` events, Slurm's and OCS'), the node producer's `nodejob` start/end.

**Samples, redelivery and order.** A job's lines on one node are gathered per sample time in a *bucket*:
a line sets `bucket[measurement, process]`, so the same line again (a redelivered message, a translated copy)
changes nothing. A bucket is folded into the running aggregate once the node has a sample `window` seconds
newer; a line for a sample time already folded is late and dropped (counted), never added twice. `window`
must cover the worker's redelivery delay (JetStream's `ack_wait`), so that after a crash the unacknowledged
messages, which come back after newer ones, still find their buckets open.

**CPU time** is Sonar's per-process cumulative `cpu_time`, which counts waited-for children: when a
process of the job that was sampled ends, the CPU time already counted for it is credited to its parent
(`ppid`), whose next increase first pays that credit back, so a child's time is counted once (with the
tail it burnt after its last sample). CPU and elapsed time are counted over the same interval: from a known
start (batch system, `nodejob`) a process first seen counts all it has (a job's processes start inside the
job); without one the interval starts at the job's first sample, so what the processes of a node's first
sample had spent before that is left out (one busy thread read 1.1 cores busy when it was counted), and a node
first sampled later keeps what its own rate says it spent since (`summarize._before`). **Memory** is the sum of the job's processes' `process_rss` per sample
(Sonar `resident_memory`). **I/O** sums each process's increase of `process_read`/`process_written`.

**Slurm's words, Slurm's meaning** (a node is the "task"): per node the maximum over time (`mem_max`); over
the job the maximum of the maxima (`max_rss`, with `max_rss_node`) and the average `ave_rss` = total of the
nodes' maxima / nodes, `ave_cpu` = CPU seconds / nodes. The InfluxDB `mem_peak` is the job's footprint
to compare with its (total) request: the nodes' peaks summed (one node: its peak).

The package, one job per module: `state` (the aggregates' structs and keys), `metrics` (metric lines into
them), `records` (job records into them), `summary` (the summary's structs), `flags` (the flag rules and
thresholds, shared with `hpcbus report`), `summarize`, `encode` (event line, InfluxDB point, state file)
and `closing` (when a job is summarised).
"""

from __future__ import annotations

from hpcbus.schemas.jobsummary.closing import Timing, close, due
from hpcbus.schemas.jobsummary.encode import (
    MEASUREMENT,
    MEASUREMENTS,
    POINT,
    decode_state,
    encode_state,
    event_line,
    event_point,
    influx_point,
    summary_time,
)
from hpcbus.schemas.jobsummary.flags import (
    DEFAULT_THRESHOLDS,
    FLAGS,
    Percent,
    Thresholds,
    flags,
    thresholds_of,
)
from hpcbus.schemas.jobsummary.metrics import (
    ANCHOR,
    ENERGY,
    ENERGY_KEEP,
    GPU_METRICS,
    METRICS,
    PROCESS_METRICS,
    add_metric,
    fold_all,
)
from hpcbus.schemas.jobsummary.records import (
    TERMINAL,
    add_nodejob,
    add_start,
    add_stop,
    sonar_time,
    tres_count,
)
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
    state_key,
)
from hpcbus.schemas.jobsummary.summarize import summarize
from hpcbus.schemas.jobsummary.summary import Closed, GpuSummary, NodeSummary, Scheduler, Summary

__all__ = [
    "ANCHOR",
    "DEFAULT_THRESHOLDS",
    "ENERGY",
    "ENERGY_KEEP",
    "FLAGS",
    "GPU_METRICS",
    "MEASUREMENT",
    "MEASUREMENTS",
    "METRICS",
    "POINT",
    "PROCESS_METRICS",
    "TERMINAL",
    "Bucket",
    "Card",
    "Closed",
    "GpuSummary",
    "JobState",
    "Limits",
    "Node",
    "NodeSummary",
    "Percent",
    "Proc",
    "Scheduler",
    "State",
    "Summary",
    "Thresholds",
    "Timing",
    "add_metric",
    "add_nodejob",
    "add_start",
    "add_stop",
    "close",
    "decode_state",
    "due",
    "encode_state",
    "event_line",
    "event_point",
    "flags",
    "fold_all",
    "influx_point",
    "is_closed",
    "job_key",
    "job_of",
    "sonar_time",
    "state_key",
    "summarize",
    "summary_time",
    "thresholds_of",
    "tres_count",
]
