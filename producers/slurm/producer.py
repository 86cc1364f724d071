"""One poll + the state -> the lines to publish, per subject, in the mapping's forms (docs/mapping.md 6, 7).

* Job records: each sacct row becomes a Sonar `SlurmJob` (`schemas.slurm.sacct.to_slurm_job`), filtered by
  the state to what is new or changed, and the survivors of one poll travel as one JobsEnvelope in
  `slurm,function=sonar` events on `<cluster>.events.slurm` (`schemas.translate.jobs_to_lines`, which cuts a
  large envelope into valid parts). Jobs only squeue knows (held, or everything while slurmdbd is down) are
  added the same way.
* cc-backend events are built from the sacct *rows* (`schemas.slurm.ccevents`), not from the filtered
  records: a partial record lacks the nodes and times a start_job needs. start_job goes out the first time
  a job is seen started, stop_job the first time it is seen ended; a job that started and ended between two
  polls gets both, start first (cc-backend can only stop a job it knows). They are tagged `origin=sonar`
  like the events the translator derives from a jobs envelope, because they carry nothing the `slurm` event
  of the same poll does not: the reverse direction (`JobsAssembler`) must not count the job twice. Their
  line time is the job's start/end time rather than the poll's, so the same event after a restart without
  state is byte-identical and JetStream's duplicate window can drop it.
* The cluster envelope (sinfo) goes out when partitions or node states changed, and at least every
  `cluster_every` seconds; `schemas.translate.cluster_to_lines` adds cc-backend's `nodestate` event, which
  `route` puts on `<cluster>.events.nodestate`.
* Every node name goes out in the site's host-name form (`hostname_form`, docs/mapping.md 3): a sacct row's
  NodeList is renamed before anything is made of it (record, start_job `resources`, `slurmInfo`), squeue's
  records and the cluster envelope (so the `nodestate` event too) before they are compared with the state.
* With `[ccbackend]` subjects set, each start_job/stop_job line and the `nodestate` line also go to
  cc-backend's own subjects, in the form it reads there (`producers.ccbackend`: ns timestamps, one line per
  message). Every subject of the hpcbus tree carries the subject prefix (`[bus] subject_prefix`).

Building mutates the in-memory state (the outbox takes every message it is given); the service saves the
state to disk only when JetStream has acknowledged everything, `--once` never saves it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Final

import msgspec

from hpcbus import __version__
from hpcbus.producers.ccbackend import CcBackendRelay
from hpcbus.producers.slurm.poller import Poll
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import START_SENT, STOP_SENT, SlurmState, digest_of
from hpcbus.schemas.ccbackend import cc_job_state, job_event_line
from hpcbus.schemas.hostnames import host_list, rename_hosts, rename_job
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.ccevents import start_job, stop_job
from hpcbus.schemas.slurm.sacct import SacctRow, to_slurm_job
from hpcbus.schemas.slurm.values import format_timestamp
from hpcbus.schemas.sonar.types import (
    ClusterData,
    ClusterEnvelope,
    JobsAttributes,
    JobsData,
    JobsEnvelope,
    Metadata,
    SlurmJob,
)
from hpcbus.schemas.translate import batch, cluster_to_lines, jobs_to_lines, msg_id, route

__all__ = ["GAVE_UP", "PRODUCER", "Outgoing", "SlurmProducer"]

log = logging.getLogger("hpcbus.slurm")

PRODUCER: Final = "hpcbus"
GAVE_UP: Final = 4
"""cc flag: no start_job can be built for this job (no user, no nodes); not tried again every poll."""


class Outgoing(msgspec.Struct, kw_only=True):
    """What one poll publishes: lines per subject, in order, and counts for the log line."""

    lines: dict[str, list[Line]] = {}
    cc: list[tuple[str, Line]] = []
    """(cc-backend subject, line in its form): one message each, published with core NATS."""
    rows: int = 0
    """sacct rows and squeue-only jobs read."""
    records: int = 0
    """SlurmJob records published (new or changed)."""
    started: int = 0
    stopped: int = 0
    cluster: str = "unavailable"
    """`sent`, `unchanged` or `unavailable` (sinfo failed)."""
    problems: list[Problem] = []

    def messages(self) -> Iterator[tuple[str, bytes, str]]:
        """(subject, payload, Nats-Msg-Id) per NATS message, lines batched below the payload limit."""
        for subject, lines in self.lines.items():
            for payload in batch(lines):
                yield subject, payload, msg_id(subject, payload)
        for message in CcBackendRelay.messages(self.cc):
            yield message.subject, message.payload, message.msg_id

    def summary(self) -> str:
        return (
            f"{self.rows} rows, {self.records} records sent, {self.started} start_job, "
            f"{self.stopped} stop_job, cluster {self.cluster}, {len(self.problems)} problems"
        )


class SlurmProducer:
    """Turns polls into lines for one cluster, filtering through `state`."""

    def __init__(
        self,
        settings: SlurmSettings,
        cluster: str,
        state: SlurmState,
        *,
        prefix: str = "",
        relay: CcBackendRelay | None = None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.prefix = prefix
        """The subject prefix (`[bus] subject_prefix`)."""
        self.relay = relay
        """cc-backend's own subjects (None: off)."""
        self.state = state
        self.meta = Metadata(producer=PRODUCER, version=__version__)

    def window_start(self, now: datetime) -> datetime:
        """Where the next sacct window starts: an overlap before the end of the last successful one, or
        `lookback` before now when there is none (the overlap at least, if the clock went backwards)."""
        end = self.state.window_end
        latest = now - timedelta(seconds=self.settings.overlap)
        if not end:
            return now - timedelta(seconds=self.settings.lookback)
        start = datetime.fromtimestamp(end, now.tzinfo) - timedelta(seconds=self.settings.overlap)
        return min(start, latest)

    def build(self, poll: Poll) -> Outgoing:
        out = Outgoing(rows=len(poll.rows) + len(poll.queued), problems=list(poll.problems))
        now = int(poll.time.timestamp())
        state = self.state
        records: list[SlurmJob] = []
        job_lines: list[Line] = []
        s = self.settings
        form, domain = s.hostname_form, s.hostname_domain
        for row in poll.rows:
            if form != "as-is" and row.node_list:
                row = msgspec.structs.replace(row, node_list=host_list(row.node_list, form, domain))
            try:
                record = to_slurm_job(row)
            except ValueError as exc:
                out.problems.append(Problem(str(exc), place="sacct", line=row.line, kind="sacct"))
            else:
                part = state.changes(record, now)
                if part is not None:
                    records.append(part)
            if not row.step:
                self._cc_events(row, now, job_lines, out)
        for job in poll.queued:
            part = state.changes(rename_job(job, form, domain), now)
            if part is not None:
                records.append(part)
        out.records = len(records)

        lines: list[Line] = []
        if records:
            attributes = JobsAttributes(
                time=format_timestamp(poll.time), cluster=self.cluster, slurm_jobs=records
            )
            env = JobsEnvelope(meta=self.meta, data=JobsData(attributes=attributes))
            lines.extend(jobs_to_lines(env, cc_events=False))
        lines.extend(job_lines)
        if poll.cluster is not None:
            lines.extend(self._cluster(poll, now, out))

        if poll.sacct_ok:
            state.window_end = now
            state.prune(now, self.settings.forget_after)
        out.lines = route(lines, self.cluster, prefix=self.prefix)
        if self.relay is not None:
            out.cc = self.relay.lines(lines)
        return out

    def _cc_events(self, row: SacctRow, now: int, lines: list[Line], out: Outgoing) -> None:
        state = self.state
        job_id = row.job_id
        flags = state.cc(job_id)
        if flags & (STOP_SENT | GAVE_UP):
            return
        try:
            cc_job_state(row.state)
        except ValueError:
            return  # REQUEUED, RESIZING, ...: no cc-backend state, and not an end; look again next poll
        if not row.node_list:
            return  # never got nodes (pending, or cancelled while pending, when sacct still shows a Start)
        if not flags & START_SENT:
            try:
                start = start_job(row, self.cluster)
            except ValueError as exc:
                out.problems.append(
                    Problem(
                        f"no start_job: {exc}", place="sacct", line=row.line, kind="sacct", severity="warning"
                    )
                )
                state.mark(job_id, GAVE_UP, now)
                return
            if start is None:
                return
            lines.append(job_event_line(start, start.start_time, cluster=self.cluster, origin="sonar"))
            state.mark(job_id, START_SENT, now)
            out.started += 1
        try:
            stop = stop_job(row, self.cluster)
        except ValueError as exc:
            out.problems.append(
                Problem(f"no stop_job: {exc}", place="sacct", line=row.line, kind="sacct", severity="warning")
            )
            state.mark(job_id, GAVE_UP, now)
            return
        if stop is not None:
            lines.append(job_event_line(stop, stop.stop_time, cluster=self.cluster, origin="sonar"))
            state.mark(job_id, STOP_SENT, now)
            out.stopped += 1

    def _cluster(self, poll: Poll, now: int, out: Outgoing) -> list[Line]:
        assert poll.cluster is not None
        s = self.settings
        env = ClusterEnvelope(meta=self.meta, data=ClusterData(attributes=poll.cluster))
        env = rename_hosts(env, s.hostname_form, s.hostname_domain)
        assert env.data is not None
        attributes = env.data.attributes
        digest = digest_of((attributes.partitions, attributes.nodes))
        state = self.state
        if digest == state.cluster_digest and now - state.cluster_sent < self.settings.cluster_every:
            out.cluster = "unchanged"
            return []
        state.cluster_digest = digest
        state.cluster_sent = now
        out.cluster = "sent"
        return cluster_to_lines(env)
