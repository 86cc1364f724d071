"""Job starts and ends seen on this node as cc-backend `start_job` / `stop_job` events.

cc-backend learns about jobs only from these events (`<cluster>.events.job`, `job,function=start_job`). The
node sees a job the moment its first process appears, so it can tell cc-backend without any access to the
batch system. What the node cannot know, and how that is handled:

- **Its share of a multi-node job only.** Each node sends `resources` = itself, `numNodes` = 1. cc-backend
  keeps the first start of a (jobId, cluster) and rejects later ones as duplicates, so for multi-node jobs the
  authoritative start comes from `hpcbus produce slurm` on the master (all nodes, accounts, partitions); run
  the node producer with `job_events = "none"` where that one runs, or accept one-node job records.
- **The final state.** A node sees processes vanish, not why; `jobState` is left out, which cc-backend reads
  as `completed`.
- **The exact start.** `startTime` is the earliest start of the job's processes on this node, whole seconds;
  the stop event repeats the start time it announced (remembered per job), because cc-backend finds the job
  to stop by (jobId, cluster, startTime).
- `accelerators` are the uuids (the GPU `type-id` on the bus, docs/mapping.md section 3) of the cards the
  job's processes use at the moment the start is noticed; a job that has not opened its GPU yet has none.
  `hwthreads` are not known from /proc and are left empty.

Events carry `origin=node` (readers can tell them from the Slurm producer's) and the event's own time
(start or stop) as the line timestamp, so an agent restarted within JetStream's duplicate window republishes
byte-identical payloads that the stream drops.
"""

from __future__ import annotations

import math

from producers.node.jobs import JobEnded, JobReading, JobStarted
from schemas.ccbackend import Resource, StartJob, StopJob, job_event_line
from schemas.lineprotocol import Line

__all__ = ["JobEvents"]

_MAX_REMEMBERED = 100_000


class JobEvents:
    """Turns the collector's JobStarted/JobEnded into event lines; remembers announced start times."""

    def __init__(self, cluster: str, hostname: str, *, at_startup: bool = True):
        self.cluster = cluster
        self.hostname = hostname
        self.at_startup = at_startup
        """Also announce jobs found running when the agent starts (cc-backend drops repeated starts)."""
        self._started: dict[tuple[int, int], int] = {}

    def lines(self, events: list[JobStarted | JobEnded], jobs: list[JobReading]) -> list[Line]:
        """The event lines for one sample's job changes; `jobs` supply the GPUs of starting jobs."""
        out: list[Line] = []
        if not events:
            return out
        by_key = {(j.job, j.epoch): j for j in jobs}
        tags = {"cluster": self.cluster, "hostname": self.hostname, "origin": "node"}
        for ev in events:
            key = (ev.job, ev.epoch)
            if isinstance(ev, JobStarted):
                if ev.at_startup and not self.at_startup:
                    continue
                start = math.floor(ev.start_time)
                if len(self._started) >= _MAX_REMEMBERED:
                    self._started.pop(next(iter(self._started)))
                self._started[key] = start
                gpus = _gpus(by_key.get(key))
                payload = StartJob(
                    job_id=ev.job,
                    cluster=self.cluster,
                    user=ev.user or "_user_unknown",
                    resources=[Resource(hostname=self.hostname, accelerators=gpus)],
                    num_nodes=1,
                    start_time=start,
                    num_acc=len(gpus),
                    meta_data={} if ev.slurm else {"epoch": str(ev.epoch)},
                )
                out.append(job_event_line(payload, start, **tags))
            else:
                start = self._started.pop(key, math.floor(ev.start_time))
                stop = max(start, math.floor(ev.time))
                stop_payload = StopJob(job_id=ev.job, cluster=self.cluster, start_time=start, stop_time=stop)
                out.append(job_event_line(stop_payload, stop, **tags))
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
