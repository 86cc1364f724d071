"""The jobs sink of the consumer runner: lines and job records in, running aggregates per (cluster, job),
one `jobsummary` event and one `job_summary` InfluxDB point out per finished job.

**Restart-safe with saved state.** Every message taken changes the aggregates in memory; `deliver` (the
runner calls it for each batch) saves the state (`kvstate`: the whole of it atomically to a local file, or,
for an active/standby pair, the entries that changed to the cluster's roles bucket under the lease's fence)
and only then lets the runner acknowledge the batch. So after a crash the saved state holds the effect of
the acknowledged messages, and JetStream redelivers the rest. Lines already saved that come again (a lost
ack) change nothing: the aggregates take a sample's lines by key and drop lines for samples already folded
(`schemas.jobsummary`). The aggregates of one job must be in one process (one active worker per cluster,
like the LP -> Sonar translator); a local file survives a NATS outage, which is exactly when the worker
must keep what it holds, while the bucket survives the worker's host (`[jobs] state`). A worker that took
over closes no job before it has caught up on its durable (`caught_up`).

**Closing.** `tick` (driven by `hpcbus.sinks`) looks every second for jobs that are due (`schemas.jobsummary.due`),
and `take` evicts the least recently active job the moment one more would pass `max_jobs` (so the bound
holds at all times, not only at the next tick); both move summaries to the state's outbox. A summary is
sent only once a saved state holds it (a crash never loses one, nor makes it twice), in batches
(`SEND_BATCH`: one InfluxDB write each): its event published on `<cluster>.events.jobsummary` (Nats-Msg-Id
from its content: a repeat after a crash is dropped by JetStream) and its point written (same tags and
timestamp: InfluxDB merges a repeat), then removed from the outbox. The state file is written at most every
`save_seconds`.

**Never wedged by one summary.** What a publish or a write raised means what `hpcbus.permanent.outcome`
says: transient trouble is raised (the runtime retries the tick or the delivery and counts it; the outbox
keeps what was not sent), while a summary refused for good (a point InfluxDB refuses, a `max-values-per-tag`
limit or a field type; an event no stream takes) is given up: handed to the runtime as a dead letter with
the far end's own reason (`settle`), counted (`refused_summaries`), and taken out of the outbox once the
runtime has stored it, so a restart never resumes it and every later summary flows. A batch InfluxDB
refuses in part is halved until the refused points are found.

**Bounded.** Beyond `max_summaries` waiting, a delivery sends the outbox before its input is acknowledged:
the runner stops fetching meanwhile, so a burst (or InfluxDB away) keeps its backlog in JetStream, not here.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar

import msgspec
from nats.aio.msg import Msg

from hpcbus.consumers.jobs.kvstate import FileStore, StateStore
from hpcbus.consumers.jobs.records import READ, add_event
from hpcbus.consumers.jobs.settings import JobsSettings
from hpcbus.contract import BadInput, DeadLetter, Settled, SinkBase
from hpcbus.counters import Counters
from hpcbus.influx.errors import Partial as PartialWrite
from hpcbus.influx.writer import Writer
from hpcbus.outlet import ORIGIN_HEADER, TRANSLATED, Outlet
from hpcbus.permanent import Transient, outcome
from hpcbus.retry import Stopping
from hpcbus.schemas import subjects
from hpcbus.schemas.jobsummary import (
    Closed,
    State,
    Summary,
    add_metric,
    close,
    decode_state,
    due,
    event_line,
    influx_point,
)
from hpcbus.schemas.lineprotocol import format_line, parse_payload
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.translate import msg_id
from hpcbus.settings import SettingsError
from hpcbus.statefile import state_directory

log = logging.getLogger("hpcbus.jobs")


SEND_BATCH = 1000
"""Summaries per InfluxDB write (and per round of concurrent publishes): 1,000 points are about 500 KB."""


SUMMARY_ITEMS = 5
"""What a summary `take` makes (an eviction) weighs in the runner's batch, in lines (`flush_lines`): such a
batch is cut sooner, so the summaries a burst makes between two sends stay near `max_summaries`."""


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
    evicted_jobs: int = 0
    """Of those, summarised early because one more would have passed `max_jobs` (`closed: evicted`)."""
    summaries: int = 0
    """Summaries published and written."""
    refused_summaries: int = 0
    """Summaries given up for good (a point InfluxDB refuses, an event no stream takes): dead-lettered with
    the reason (the runtime counts them stored in `deadlettered_merged`)."""
    pending_summaries: int = 0
    state_bytes: int = 0
    saves: int = 0


class StateFileError(Exception):
    """The state file exists but is not one this worker wrote."""


def load_state(path: Path, cluster: str, durable: str) -> State:
    """The saved state of `cluster` and `durable`, an empty one (theirs) when there is no file;
    `StateFileError` naming the file when it is no state file, `SettingsError` (one line, exit 2) when it
    belongs to another cluster or durable: its jobs' summaries would go to a cluster this worker does not
    serve. A file older than the owner fields is judged by the clusters of its jobs."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return State(cluster=cluster, durable=durable)
    try:
        state = decode_state(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateFileError(f"{path}: not a jobs state file ({exc}); move it away to start afresh") from None
    owner = (state.cluster, state.durable)
    if not state.cluster:
        others = sorted({j.cluster for j in state.jobs.values()} | {s.cluster for s in state.outbox.values()})
        owner = (others[0] if others else cluster, durable)
        if len(others) > 1:
            owner = (",".join(others), durable)
    if owner != (cluster, durable):
        raise SettingsError(
            f"[jobs] state_file {path} belongs to cluster {owner[0]!r}, durable {owner[1]!r}, not to cluster "
            f"{cluster!r}, durable {durable!r}: name another file, or move it away to start afresh"
        )
    state.cluster, state.durable = cluster, durable
    return state


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
        path: Path | StateStore,
        *,
        clock: Callable[[], float] = time.time,
        caught_up: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.outlet = outlet
        self.cluster = outlet.cluster
        self.writer = writer
        self.settings = settings
        self.name = name
        self.state = state
        self.store: StateStore = FileStore(path) if isinstance(path, Path) else path
        self.clock = clock
        self.caught_up = caught_up
        """None, or True once the input that was in the stream when this worker took over is taken: no job
        is closed before (a standby that takes over, `[jobs] state = "jetstream"`)."""
        self.thresholds = settings.thresholds()
        self.limits = settings.limits()
        self.timing = settings.timing()
        self.counters = JobsCounters()
        self._dirty = False
        self._saved_at = 0.0
        self._lock = asyncio.Lock()
        """Held while the state is changed by a tick or encoded."""
        self._sending = asyncio.Lock()
        self._taken = 0
        """Changes taken so far (a batch is the count at its `cut`) ..."""
        self._saved = 0
        """... and how many of them the state file holds: a delivery already covered returns at once."""
        self._unsaved: set[str] = set()
        """Outbox keys no saved state holds yet: not sent before it does."""
        self._saving: set[str] = set()
        self._published: set[str] = set()
        """Outbox keys whose event is out already (only the point is written again on a retry)."""
        self._dead: list[tuple[str, DeadLetter]] = []
        """Summaries given up, for the runtime to store (`settle`) ..."""
        self._given_up: set[str] = set()
        """... their keys (not sent again) ..."""
        self._handed: set[str] = set()
        """... and those the runtime has taken: out of the outbox at the next step, once they are stored."""
        self._lru: collections.deque[tuple[str, float]] = collections.deque()
        """Eviction candidates, least recently active first, as (key, its `active_at` then)."""
        self.what = "saving the state or sending job summaries"

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Apply the message's lines to the aggregates; `BadInput` names the lines refused (broken, or a
        record that does not hold: the runner reports and dead-letters the message, the rest is applied).
        A line that opens a job beyond `max_jobs` evicts the least recently active one first. The items:
        the lines used, and `SUMMARY_ITEMS` per summary made."""
        c = self.counters
        parsed = parse_payload(msg.data, now=int(time.time()), place=msg.subject)
        problems = list(parsed.errors)
        c.received_lines += len(parsed.lines)
        now = self.clock()
        state = self.state
        late = state.late_lines
        bound = self.timing.max_jobs
        evicted = c.evicted_jobs
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
            if len(state.jobs) > bound:
                self._evict(now)
        c.late_lines += state.late_lines - late
        c.used_lines += used
        if used or state.late_lines != late:
            self._dirty = True
            self._taken += 1
        items = used + SUMMARY_ITEMS * (c.evicted_jobs - evicted)
        if problems:
            raise BadInput(problems, items, count=len(parsed.errors) + refused_lines)
        return items

    def cut(self) -> int:
        """The batch is the changes taken so far: its delivery waits for a save that holds them."""
        return self._taken

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Save the state (which holds every message taken so far; a save after this batch was cut holds it
        already); with more than `max_summaries` waiting, send them too. Returning lets the runner
        acknowledge."""
        if not isinstance(batch, int) or batch > self._saved:
            await self.save(stopping)
        await self._hold_back(stopping)

    async def _hold_back(self, stopping: Stopping) -> None:
        """More than `max_summaries` waiting: send down to half of it before going on (the input waits)."""
        if self._waiting() > self.settings.max_summaries:
            await self.send(stopping, down_to=self.settings.max_summaries // 2)

    def gauges(self) -> None:
        self.counters.open_jobs = len(self.state.jobs)
        self.counters.pending_summaries = len(self.state.outbox)

    def settle(self) -> Settled:
        """The summaries given up since the last call, as dead letters for the runtime to store."""
        dead, self._dead = self._dead, []
        self._handed.update(key for key, _ in dead)
        return Settled(dead=[letter for _, letter in dead])

    async def start(self, stopping: Stopping) -> None:
        """Save at once: a state file that cannot be written is said now, not at the first job."""
        log.info(
            "%s: %d open jobs and %d summaries from %s",
            self.cluster,
            len(self.state.jobs),
            len(self.state.outbox),
            self.store.where,
        )
        await self.save(stopping, force=True)
        await self._hold_back(stopping)  # a large saved outbox goes out before more input comes

    async def close(self, stopping: Stopping) -> None:
        await self.save(stopping)

    # -- the state file -----------------------------------------------------------------------------------
    async def save(self, stopping: Stopping, *, force: bool = False) -> None:
        """Write the state if it changed (`force`: anyway, at once). Writes are at least `save_seconds`
        apart: a batch delivered sooner waits for the next write, which holds it too (its acknowledgement
        waits, never its effect). A failed write raises `Transient` whatever the error: the state file is
        the worker's, never a message's, so no message is dead-lettered for it (the runtime retries)."""
        async with self._lock:
            if not (self._dirty or force):
                return
            if not force:
                wait = self._saved_at + self.settings.save_seconds - time.monotonic()
                if wait > 0 and not stopping.is_set():
                    await stopping.sleep(wait)
            taken = self._taken
            self._saving, self._unsaved = self._unsaved, set()
            self._dirty = False  # a message taken while the state is written marks it again
            try:
                await self.store.save(self.state)  # takes what it writes before its first await
            except Transient:
                self._dirty = True
                self._unsaved |= self._saving
                raise
            finally:
                self._saving = set()
            self._saved = max(self._saved, taken)
            self._saved_at = time.monotonic()
            self.counters.state_bytes = self.store.size
            self.counters.saves += 1

    # -- closing jobs --------------------------------------------------------------------------------------
    async def tick(self, stopping: Stopping) -> None:
        """Every second: summarise the jobs that are due, then send what the outbox holds."""
        await self.step(stopping)

    async def step(self, stopping: Stopping) -> None:
        """Drop the summaries the runtime has dead-lettered, summarise what is due, save (a summary goes
        out only once saved), then send the outbox; transient trouble raises (the runtime retries the step,
        which goes on where it stopped: the outbox keeps what was not sent)."""
        async with self._lock:
            for key in self._handed:
                if self.state.outbox.pop(key, None) is not None:
                    self._dirty = True
                self._given_up.discard(key)
                self._published.discard(key)
            self._handed = set()
            now = self.clock()
            if self.caught_up is None or await self.caught_up():
                for key, why in due(self.state, now, self.timing):
                    self._close(key, why, now)
        await self.save(stopping)
        await self.send(stopping)

    def _close(self, key: str, why: Closed, now: float) -> None:
        """Summarise job `key` into the outbox (sent once a save holds it)."""
        summary = close(self.state, key, why, now, self.thresholds, self.limits)
        self._unsaved.add(key)
        self._dirty = True
        self.counters.closed_jobs += 1
        self.counters.evicted_jobs += why == "evicted"
        log.debug(
            "job %s of %s closed (%s): %d samples, flags %s",
            summary.job,
            summary.cluster,
            why,
            summary.samples,
            ",".join(summary.flags) or "none",
        )

    def _evict(self, now: float) -> None:
        """Summarise the least recently active jobs until `max_jobs` holds again. The candidates are
        sorted once and used until spent (a job touched since is skipped: it is no longer the least
        recently active), so a burst of new jobs costs one sort per `max_jobs` evictions, not one each."""
        jobs = self.state.jobs
        while len(jobs) > self.timing.max_jobs:
            if not self._lru:  # stable: among jobs active at the same moment, the first opened goes first
                ranked = sorted(jobs.items(), key=lambda kv: kv[1].active_at)
                self._lru.extend((key, j.active_at) for key, j in ranked[:-1])
                if not self._lru:
                    return
            key, at = self._lru.popleft()
            found = jobs.get(key)
            if found is not None and found.active_at == at:
                self._close(key, "evicted", now)

    # -- sending summaries ---------------------------------------------------------------------------------
    def _waiting(self) -> int:
        """Summaries waiting to be sent (those given up wait only for their dead letter)."""
        return len(self.state.outbox) - len(self._given_up)

    async def send(self, stopping: Stopping, down_to: int = 0) -> None:
        """Send the saved outbox until no more than `down_to` wait, `SEND_BATCH` summaries at a time
        (publish each event, write the batch's points in one request), each removed from the outbox once
        both are out. Transient trouble raises; a summary refused for good is given up (`_give_up`) and the
        rest goes on."""
        while not stopping.is_set():
            async with self._sending:  # per batch: a delivery's send and a tick's take turns
                if self._waiting() <= down_to:
                    return
                skip = self._unsaved | self._saving | self._given_up
                keys = list(itertools.islice((k for k in self.state.outbox if k not in skip), SEND_BATCH))
                if not keys:
                    return
                refusals: dict[str, list[str]] = {}
                try:
                    await self._publish(keys, refusals)
                    points = [(k, format_line(influx_point(self.state.outbox[k])) + "\n") for k in keys]
                    await self._write(points, refusals)
                finally:
                    for key, reasons in refusals.items():
                        self._give_up(key, reasons)
                async with self._lock:
                    for key in keys:
                        if key not in refusals:
                            self.state.outbox.pop(key, None)
                            self._published.discard(key)
                            self.counters.summaries += 1
                    self._dirty = True

    def _event(self, summary: Summary) -> tuple[str, bytes]:
        payload = (format_line(event_line(summary)) + "\n").encode()
        return subjects.jobsummary(summary.cluster, prefix=self.outlet.prefix), payload

    async def _publish(self, keys: list[str], refusals: dict[str, list[str]]) -> None:
        """Publish the events of `keys` not out yet, at once; a refusal for good is noted in `refusals`, the
        first transient failure raised once the others are done."""
        todo = [k for k in keys if k not in self._published]

        async def one(key: str) -> None:
            subject, payload = self._event(self.state.outbox[key])
            headers = {"Nats-Msg-Id": msg_id(subject, payload), ORIGIN_HEADER: TRANSLATED}
            await self.outlet.publish(subject, payload, headers)

        results = await asyncio.gather(*(one(k) for k in todo), return_exceptions=True)
        trouble: BaseException | None = None
        for key, result in zip(todo, results, strict=True):
            if result is None:
                self._published.add(key)
            elif isinstance(result, Exception) and not isinstance(found := outcome(result), Transient):
                refusals.setdefault(key, []).append(f"its event was not published: {found.reason}")
            elif trouble is None:
                trouble = result
        if trouble is not None:
            raise trouble

    async def _write(self, points: list[tuple[str, str]], refusals: dict[str, list[str]]) -> None:
        """Write `points` in one request. Refused for good or too large: all of them when InfluxDB says it
        dropped every one (or there is one), else each half again, so only the refused points are given up
        (a repeat of a stored point changes nothing). Transient trouble raises."""
        if not points:
            return
        try:
            await self.writer.write("".join(text for _, text in points), "ns")
        except Exception as exc:
            found = outcome(exc)
            if isinstance(found, Transient):
                raise
            dropped = exc.dropped if isinstance(exc, PartialWrite) else 0
            if len(points) == 1 or dropped >= len(points):
                for key, _ in points:
                    refusals.setdefault(key, []).append(
                        f"its job_summary point was not written: {found.reason}"
                    )
                return
            half = len(points) // 2
            await self._write(points[:half], refusals)
            await self._write(points[half:], refusals)

    def _give_up(self, key: str, reasons: list[str]) -> None:
        """The summary `key` can never be sent whole: a dead letter (its event line, the far end's reasons)
        for the runtime to store; taken out of the outbox once stored (`step`)."""
        summary = self.state.outbox.get(key)
        if summary is None or key in self._given_up:
            return
        self._given_up.add(key)
        self.counters.refused_summaries += 1
        subject, payload = self._event(summary)
        problems = [
            Problem(f"summary of job {summary.job} given up: {r}", subject, kind="undeliverable")
            for r in reasons
        ]
        self._dead.append((key, DeadLetter(subject, payload, problems, "dlq:" + msg_id(subject, payload))))


def state_path(template: str, cluster: str, several: bool, durable: str = "hpcbus-jobs") -> Path:
    """The state file of one cluster: "" = `jobs-<cluster>-<durable>.state` in the state directory
    (`hpcbus.statefile.state_directory`); `{cluster}` in the setting is replaced; with several clusters and
    no `{cluster}`, the cluster name is put before the suffix."""
    if not template:
        return state_directory() / f"jobs-{cluster}-{durable}.state"
    if "{cluster}" in template:
        return Path(template.replace("{cluster}", cluster))
    path = Path(template)
    if several:
        stem, suffix = os.path.splitext(path.name)
        return path.with_name(f"{stem}-{cluster}{suffix}")
    return path
