"""What one node saw of a job: the `nodejob` event of the node producer (not a cc-backend event).

cc-backend must get exactly one `start_job` and one `stop_job` per job, with every node of the job in
`resources` (it rejects a second start of the same (jobId, cluster) within 24 h and needs
`len(resources) == numNodes`). A node producer sees only its own share of a job, so its observations
travel under a name of their own, where cc-backend never looks:

    nodejob,cluster=<cluster>,hostname=<node>,function=start|end event="<NodeJob JSON>" <time s>

on `<cluster>.events.nodejob` (the translator's routing: `<cluster>.events.<measurement>`). cc-backend reads
only measurement `job` with `function=start_job|stop_job` on the subject it is configured for, and the
Sonar jobs reassembler only `slurm` and `job`, so neither takes these for its own; InfluxDB stores them as
any other event. The batch-system producers (`produce slurm`, `produce ocs`) are the authority for
cc-backend (docs/mapping.md, "Job events: who tells cc-backend").

The payload keeps cc-backend's spelling where a field means the same thing (`jobId`, `startTime`,
`hwthreads`, `accelerators`), so a reader can merge the nodes' observations into a start_job's `resources`.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from hpcbus.schemas.lineprotocol import Line

__all__ = ["MEASUREMENT", "NodeJob", "node_job_line"]

MEASUREMENT: Final = "nodejob"


class NodeJob(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One node's view of a job starting (`function=start`) or ending (`function=end`) there."""

    job_id: int
    """Slurm job id, or the process group id of a job outside Slurm (then `epoch` is set)."""
    cluster: str
    hostname: str
    """The node that saw the job (the line's `hostname` tag too)."""
    start_time: int
    """Earliest start of the job's processes on this node, epoch seconds; the end repeats the start's."""
    user: str = ""
    epoch: int = 0
    """0 for Slurm jobs; Sonar's boot-dependent epoch for process-group jobs ((jobId, epoch) is the key)."""
    stop_time: int = 0
    """`function=end` only: when the node noticed the last process gone, epoch seconds."""
    hwthreads: list[int] = []
    """OS processor ids the job may use on this node (its cgroup's cpuset, else the CPU affinity of its
    processes); empty when neither could be read."""
    accelerators: list[str] = []
    """GPU ids (the accelerator `type-id` on the bus, NVML uuid or PCI bus id by `gpu_type_id`) of the
    cards the job's processes used when the start was noticed."""
    at_startup: bool = False
    """The job was already running when the node producer started: `startTime` is still the processes'
    start, but the start itself was not witnessed."""


_ENCODER: Final = msgspec.json.Encoder()


def node_job_line(payload: NodeJob, function: Literal["start", "end"], time: int) -> Line:
    """`nodejob,cluster=..,hostname=..,function=start|end event="<JSON>" <time>`; `time` is the start or the
    stop time, so the same observation sent again is byte-identical (JetStream's duplicate window drops it)."""
    tags = {"cluster": payload.cluster, "hostname": payload.hostname, "function": function}
    return Line(MEASUREMENT, tags, {"event": _ENCODER.encode(payload).decode()}, time)
