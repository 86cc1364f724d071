"""The jobs sink of the consumer runner: lines and job records in, running aggregates per (cluster, job),
one `jobsummary` event and one `job_summary` InfluxDB point out per finished job.

**Restart-safe with a state file.** Every message taken changes the aggregates in memory; `deliver` (the
runner calls it for each batch) writes the whole state atomically (`hpcbus.statefile`) and only then lets the
runner acknowledge the batch. So after a crash the file holds exactly the effect of the acknowledged
messages, and JetStream redelivers the rest. Lines already in the file that come again (a lost ack) change
nothing: the aggregates take a sample's lines by key and drop lines for samples already folded
(`schemas.jobsummary`). Why a file rather than a JetStream key-value bucket: the aggregates of one job must
be in one process anyway (one worker per cluster, like the LP -> Sonar translator), the state is one
document that must change together with the acknowledgements (a KV bucket would need one write per job and
still no transaction with the acks), and a local file survives a NATS outage, which is exactly when the
worker must keep what it holds.

**Closing.** `tick` (driven by `hpcbus.sinks`) looks every second for jobs that are due (`schemas.jobsummary.due`), moves
their summaries to the state's outbox and saves it; then publishes each summary on
`<cluster>.events.jobsummary` (Nats-Msg-Id from its content: a repeat after a crash is dropped by
JetStream) and writes its point (same tags and timestamp: InfluxDB merges a repeat), and only then removes it
from the outbox. While NATS or InfluxDB is away the outbox waits (retried with back-off) and the input keeps
flowing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import msgspec
from nats.aio.msg import Msg

from hpcbus.consumers.jobs.records import READ, add_event
from hpcbus.consumers.jobs.settings import JobsSettings
from hpcbus.counters import Counters
from hpcbus.influx.writer import Writer
from hpcbus.outlet import ORIGIN_HEADER, TRANSLATED, Outlet
from hpcbus.permanent import Permanent, Transient, outcome
from hpcbus.retry import Stopping, describe
from hpcbus.runner import BadInput, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.jobsummary import (
    State,
    Summary,
    add_metric,
    close,
    decode_state,
    due,
    encode_state,
    event_line,
    influx_point,
)
from hpcbus.schemas.lineprotocol import format_line, parse_payload
from hpcbus.schemas.translate import msg_id
from hpcbus.statefile import write_atomically

log = logging.getLogger("hpcbus.jobs")


class JobsCounters(Counters):
    """The standard counters (`rejected`: lines, said on the log and left to the InfluxDB worker to
    dead-letter) and the jobs'."""

    GAUGES: ClassVar[frozenset[str]] = Counters.GAUGES | {"open_jobs", "pending_summaries", "state_bytes"}

    received_lines: int = 0
    used_lines: int = 0
    """Lines that changed the aggregates (per-process, GPU, anchor and energy lines, job records)."""
    late_lines: int = 0
    """Lines for samples already folded or jobs already summarised: dropped, never counted twice."""
    open_jobs: int = 0
    closed_jobs: int = 0
    """Jobs summarised (each one DEBUG line; the periodic summary line counts them)."""
    summaries: int = 0
    """Summaries published and written."""
    pending_summaries: int = 0
    state_bytes: int = 0
    saves: int = 0


class StateFileError(Exception):
    """The state file exists but is not one this worker wrote."""


def load_state(path: Path) -> State:
    """The saved state, an empty one when there is no file; `StateFileError` naming the file otherwise."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return State()
    try:
        return decode_state(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateFileError(f"{path}: not a jobs state file ({exc}); move it away to start afresh") from None


class JobsSink(SinkBase):
    """One cluster's jobs worker (see the module docstring)."""

    tick_seconds = 1.0
    """How often due jobs are looked for (`tick`)."""

    def __init__(
        self,
        outlet: Outlet,
        writer: Writer,
        settings: JobsSettings,
        name: str,
        state: State,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.outlet = outlet
        self.cluster = outlet.cluster
        self.writer = writer
        self.settings = settings
        self.name = name
        self.state = state
        self.path = path
        self.clock = clock
        self.thresholds = settings.thresholds()
        self.limits = settings.limits()
        self.timing = settings.timing()
        self.counters = JobsCounters()
        self._dirty = False
        self._saved_at = 0.0
        self._lock = asyncio.Lock()
        self.what = "saving the state or sending job summaries"

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Apply the message's lines to the aggregates; `BadInput` names the lines refused (broken, or a
        record that does not hold: the runner reports and dead-letters the message, the rest is applied)."""
        c = self.counters
        parsed = parse_payload(msg.data, now=int(time.time()), place=msg.subject)
        problems = list(parsed.errors)
        c.received_lines += len(parsed.lines)
        now = self.clock()
        state = self.state
        late = state.late_lines
        used = refused_lines = 0
        for line in parsed.lines:
            fields = line.fields
            if "value" in fields:
                used += add_metric(state, self.cluster, line, now, self.limits)
            elif "event" in fields and line.measurement in READ:
                refused = add_event(state, self.cluster, line, now, self.limits, msg.subject)
                problems.extend(refused)
                refused_lines += bool(refused)
                used += not refused
        c.late_lines += state.late_lines - late
        c.used_lines += used
        if used or state.late_lines != late:
            self._dirty = True
        if problems:
            raise BadInput(problems, used, count=len(parsed.errors) + refused_lines)
        return used

    def cut(self) -> None:
        """Nothing to seal: the aggregates outlive any batch; `deliver` saves them."""

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Save the state (which holds every message taken so far); returning lets the runner acknowledge."""
        await self.save(stopping)

    def gauges(self) -> None:
        self.counters.open_jobs = len(self.state.jobs)
        self.counters.pending_summaries = len(self.state.outbox)

    async def start(self, stopping: Stopping) -> None:
        """Save at once: a state file that cannot be written is said now, not at the first job."""
        log.info("%s: %d open jobs from %s", self.cluster, len(self.state.jobs), self.path)
        await self.save(stopping, force=True)

    async def close(self, stopping: Stopping) -> None:
        await self.save(stopping)

    # -- the state file -----------------------------------------------------------------------------------
    async def save(self, stopping: Stopping, *, force: bool = False) -> None:
        """Write the state if it changed (`force`: anyway, at once). Writes are at least `save_seconds`
        apart: a batch delivered sooner waits for the next write, which holds it too (its acknowledgement
        waits, never its effect). A failed write raises `Transient` whatever the error: the state file is
        the worker's, never a message's, so no message is dead-lettered for it (the runtime retries)."""
        async with self._lock:
            if not force:
                wait = self._saved_at + self.settings.save_seconds - time.monotonic()
                if wait > 0 and not stopping.is_set():
                    await stopping.sleep(wait)
            if not (self._dirty or force):
                return
            data = encode_state(self.state)
            self._dirty = False  # a message taken while the file is written marks it again
            try:
                await asyncio.to_thread(write_atomically, self.path, data)
            except OSError as exc:
                self._dirty = True
                raise Transient(f"saving {self.path}: {describe(exc)}") from exc
            self._saved_at = time.monotonic()
            self.counters.state_bytes = len(data)
            self.counters.saves += 1

    # -- closing jobs --------------------------------------------------------------------------------------
    async def tick(self, stopping: Stopping) -> None:
        """Every second: summarise the jobs that are due, then send what the outbox holds."""
        await self.step(stopping)

    async def step(self, stopping: Stopping) -> None:
        """Summarise what is due (saved at once: the outbox must survive a crash), then send the outbox; a
        failure raises (the runtime retries the step, which goes on where it stopped: the outbox keeps
        what was not sent)."""
        closed = False
        async with self._lock:
            now = self.clock()
            for key, why in due(self.state, now, self.timing):
                summary = close(self.state, key, why, now, self.thresholds, self.limits)
                self.counters.closed_jobs += 1
                log.debug(
                    "job %s of %s closed (%s): %d samples, flags %s",
                    summary.job,
                    summary.cluster,
                    why,
                    summary.samples,
                    ",".join(summary.flags) or "none",
                )
                closed = self._dirty = True
        if closed:
            await self.save(stopping, force=True)
        sent = False
        try:
            for key, summary in list(self.state.outbox.items()):
                await self._send(summary)
                async with self._lock:
                    self.state.outbox.pop(key, None)
                    self._dirty = sent = True
                self.counters.summaries += 1
        finally:
            if sent:
                await self.save(stopping, force=True)

    async def _send(self, summary: Summary) -> None:
        """Publish the event and write the point; what fails is raised. A point InfluxDB refuses for good
        (`hpcbus.permanent.outcome`) is reported once, not retried forever: the event is out already."""
        payload = (format_line(event_line(summary)) + "\n").encode()
        subject = subjects.jobsummary(summary.cluster, prefix=self.outlet.prefix)
        headers = {"Nats-Msg-Id": msg_id(subject, payload), ORIGIN_HEADER: TRANSLATED}
        await self.outlet.publish(subject, payload, headers)
        try:
            await self.writer.write(format_line(influx_point(summary)) + "\n", "ns")
        except Exception as exc:
            if not isinstance(outcome(exc), Permanent):
                raise
            log.error("InfluxDB refused the summary of job %s: %s", summary.job, exc)


def state_path(template: str, cluster: str, several: bool) -> Path:
    """The state file of one cluster: `{cluster}` in the setting is replaced; with several clusters and no
    `{cluster}`, the cluster name is put before the suffix."""
    if "{cluster}" in template:
        return Path(template.replace("{cluster}", cluster))
    path = Path(template)
    if several:
        stem, suffix = os.path.splitext(path.name)
        return path.with_name(f"{stem}-{cluster}{suffix}")
    return path
