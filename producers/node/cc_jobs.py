"""Job starts and ends seen on this node: `nodejob` events always, cc-backend's form only when asked.

cc-backend must get exactly one `start_job` per job, with every node in `resources`
(`len(resources) == numNodes`), and it rejects a second start of the same (jobId, cluster) within 24 h. A
node sees only its own share of a job: if every node announced the job in cc-backend's form on cc-backend's
subject, the first node to speak would win, a 4-node job would be recorded with one node, and the batch
system producer's complete start would be rejected as a duplicate. So:

- **Always: `nodejob,function=start|end`** on `<cluster>.events.nodejob` (`schemas.nodejob`): hostname,
  user, start (and stop) time, and what only the node knows, the `hwthreads` the job may use here (its
  cgroup cpuset or its processes' affinity, `producers.node.cpuset`) and the `accelerators` its processes
  use (the GPU `type-id` of the bus, NVML uuid or PCI bus id by `gpu_type_id`). cc-backend never reads
  this measurement; nothing the node saw is lost.
- **With `cc_job_events = true` only: `job,function=start_job|stop_job,origin=node`**, for sites without any
  batch-system producer (no `produce slurm` / `produce ocs`). Correct for single-node jobs only: each node
  sends `resources` = itself and `numNodes` = 1. Never enable it beside a batch-system producer: whichever
  start reaches cc-backend first wins, and the stop of the other is for a start time cc-backend never saw.

The authority for cc-backend is the batch-system producer (docs/mapping.md, "Job events: who tells
cc-backend"). What the node cannot know, in cc-backend's form: the other nodes; the final state (a node sees
processes vanish, not why: `jobState` is left out, which cc-backend reads as `completed`); the exact start
(`startTime` is the earliest start of the job's processes here, whole seconds; the stop repeats the start
time announced, remembered per job, because cc-backend finds the job to stop by (jobId, cluster,
startTime)). A job that has not opened its GPU yet when its start is noticed has no accelerators.

Every line carries the event's own time (start or stop) as its timestamp, so an agent restarted within
JetStream's duplicate window republishes byte-identical payloads that the stream drops.
"""

from __future__ import annotations

import math
from typing import Any

from hpcbus.producers.node.jobs import JobEnded, JobReading, JobStarted
from hpcbus.schemas.ccbackend import Resource, StartJob, StopJob, job_event_line
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.nodejob import NodeJob, node_job_line

__all__ = ["JobEvents"]

_MAX_REMEMBERED = 100_000


class JobEvents:
    """Turns the collector's JobStarted/JobEnded into event lines; remembers announced start times."""

    def __init__(self, cluster: str, hostname: str, *, at_startup: bool = True, cc_events: bool = False):
        self.cluster = cluster
        self.hostname = hostname
        self.at_startup = at_startup
        """Also send cc-backend a start_job for jobs found running when the agent starts (cc-backend drops
        repeats). `nodejob` events are sent for them in any case, marked `atStartup`."""
        self.cc_events = cc_events
        """Also send cc-backend's `start_job`/`stop_job` (sites without a batch-system producer only)."""
        self._started: dict[tuple[int, int], int] = {}

    def _node_job(self, ev: JobStarted | JobEnded, start: int, **seen: Any) -> NodeJob:
        """What this node saw of a job (`nodejob` event): the common part of a start and an end."""
        return NodeJob(
            job_id=ev.job,
            cluster=self.cluster,
            hostname=self.hostname,
            start_time=start,
            user=ev.user,
            epoch=ev.epoch,
            **seen,
        )

    def lines(self, events: list[JobStarted | JobEnded], jobs: list[JobReading]) -> list[Line]:
        """The event lines for one sample's job changes; `jobs` supply the GPUs of starting jobs."""
        out: list[Line] = []
        if not events:
            return out
        by_key = {(j.job, j.epoch): j for j in jobs}
        cc_tags = {"cluster": self.cluster, "hostname": self.hostname, "origin": "node"}
        for ev in events:
            key = (ev.job, ev.epoch)
            if isinstance(ev, JobStarted):
                start = math.floor(ev.start_time)
                if len(self._started) >= _MAX_REMEMBERED:
                    self._started.pop(next(iter(self._started)))
                self._started[key] = start
                gpus = _gpus(by_key.get(key))
                hwthreads = list(ev.hwthreads)
                seen = self._node_job(
                    ev, start, hwthreads=hwthreads, accelerators=gpus, at_startup=ev.at_startup
                )
                out.append(node_job_line(seen, "start", start))
                if not self.cc_events or (ev.at_startup and not self.at_startup):
                    continue
                payload = StartJob(
                    job_id=ev.job,
                    cluster=self.cluster,
                    user=ev.user or "_user_unknown",
                    resources=[Resource(hostname=self.hostname, hwthreads=hwthreads, accelerators=gpus)],
                    num_nodes=1,
                    start_time=start,
                    num_hwthreads=len(hwthreads),
                    num_acc=len(gpus),
                    meta_data={} if ev.slurm else {"epoch": str(ev.epoch)},
                )
                out.append(job_event_line(payload, start, **cc_tags))
            else:
                start = self._started.pop(key, math.floor(ev.start_time))
                stop = max(start, math.floor(ev.time))
                ended = self._node_job(ev, start, stop_time=stop)
                out.append(node_job_line(ended, "end", stop))
                if self.cc_events:
                    stop_payload = StopJob(
                        job_id=ev.job, cluster=self.cluster, start_time=start, stop_time=stop
                    )
                    out.append(job_event_line(stop_payload, stop, **cc_tags))
        return out


def _gpus(job: JobReading | None) -> list[str]:
    if job is None:
        return []
    seen: dict[str, None] = {}
    for p in job.processes:
        for g in p.gpus:
            if g.uuid:
                seen[g.uuid] = None
    return list(seen)
