"""The producer side of the runtime: sources polled on one loop, their messages sent through one outbox.

A producer is a `Source`: something that, when due, polls what it watches (a node's /proc, sacct, an
accounting file) and returns messages, and that may want to be told when the bus has acknowledged them (to
save a state file, to move a file offset). `serve` runs sources on a `hpcbus.service.Service`, which owns
the connection, the streams, the signals and the stop deadline; this module adds what producers share:

- one `Outbox` (ordered, JetStream-acknowledged, bounded, optionally spilled to disk) for all sources,
  which holds a message while its stream would acknowledge it and keep nothing (`hpcbus.interest`:
  `stream_discard = "new"` before any worker created its durable);
- commit after acknowledgement: a poll's `commit` runs once every message of that poll and of the polls
  before it has left the outbox, never earlier, so a state file never claims what a crash could still lose;
- back-pressure: a source with `max_pending` is not polled while that many of its polls wait for acks (the
  accounting file is the buffer, not memory);
- the stop: polling ends after the poll in hand, the outbox gets what is left of the grace period to be
  acknowledged, acknowledged polls are committed, and each source's `close` says what was left (kept in the
  spill directory when there is one).

A poll that fails is one trouble episode of its source (logged with its traceback the first time a cause
appears), retried through `hpcbus.retry.retry` (1 s, backing off to 10 s).

`once` is every producer's `--once`: the same polls, their messages written out (`rows`: one
`SUBJECT<TAB>LINE` per line) instead of published, and nothing committed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TextIO

import msgspec
from nats.aio.client import Client as NATS

from hpcbus.counters import summary
from hpcbus.interest import Interest
from hpcbus.keys import STATS_SECONDS
from hpcbus.outbox import Outbox, OutboxSettings
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopped, Stopping, Trouble, describe, retry
from hpcbus.schemas.message import Message
from hpcbus.service import STOP_GRACE, Service
from hpcbus.settings import BusSettings
from hpcbus.streams import StreamSpec

log = logging.getLogger("hpcbus.sources")


OUTBOX_REFRESH_SECONDS = 60.0
"""Seconds a producer takes an `interest` stream that had durables to still have them (`hpcbus.interest`):
2,000 node agents asking every publish would add a JetStream API request per sample; a durable is removed
only by hand, and that loses what it alone had not acknowledged anyway."""


class Poll(msgspec.Struct):
    """What one poll produced, and what to do once the bus has all of it."""

    messages: list[Message] = msgspec.field(default_factory=list)
    commit: Callable[[], None] | None = None


class Backlog(Protocol):
    """What a source may know about the outbox (its self-telemetry reports it)."""

    def __len__(self) -> int: ...

    @property
    def dropped(self) -> int: ...


class Source(Protocol):
    name: str
    """For log lines."""
    max_pending: int
    """Polls waiting for acknowledgement before this source is not polled any more (0 = no limit)."""
    wake: asyncio.Event
    """Set by the source (a control request changed its interval, ...) to have `due_in` asked again."""

    def due_in(self) -> float:
        """Seconds until the next poll is due (0: now)."""
        ...

    async def poll(self, backlog: Backlog) -> Poll: ...

    async def attach(self, nc: NATS) -> None:
        """Called on every new connection (subscriptions such as the control subjects)."""
        ...

    def close(self, unsent: int, kept: bool) -> None:
        """The last word: `unsent` messages were not acknowledged (`kept` in the spill directory or not)."""
        ...


class Telemetry(msgspec.Struct, frozen=True):
    """A source's self-telemetry: its name (`stype-id` of its `hpcbus_*` lines), cluster, and interval."""

    name: str
    cluster: str
    prefix: str = ""
    stats_seconds: float = STATS_SECONDS


class _Pending(msgspec.Struct):
    source: str
    seq: int
    commit: Callable[[], None] | None


class SourceLoop:
    """Sources, the outbox between them and the bus, and the commits."""

    def __init__(
        self,
        sources: Sequence[Source],
        outbox: OutboxSettings,
        stopping: Stopping,
        *,
        core_subjects: Iterable[str] = (),
        streams: Sequence[StreamSpec] = (),
        telemetry: Telemetry | None = None,
    ) -> None:
        self.sources = list(sources)
        self.stopping = stopping
        self.telemetry = telemetry
        """Where and how often the outbox's counters are said (None: not at all, as for the node agent, whose
        every sample carries its backlog)."""
        self.outbox = Outbox(
            outbox,
            on_progress=self._commit,
            core_subjects=core_subjects,
            interest=Interest(streams, refresh=OUTBOX_REFRESH_SECONDS),
        )
        self._pending: collections.deque[_Pending] = collections.deque()
        self._progress = asyncio.Event()
        self._polling: list[asyncio.Task[None]] = []

    def _commit(self) -> None:
        done = self.outbox.done_through
        while self._pending and self._pending[0].seq <= done:
            commit = self._pending.popleft().commit
            if commit is not None:
                try:
                    commit()
                except Exception as exc:  # a state file that cannot be written: said, not fatal
                    log.error("commit failed: %s", describe(exc))
        self._progress.set()

    def _waiting(self, source: Source) -> int:
        return sum(1 for p in self._pending if p.source == source.name)

    async def _poll_loop(self, source: Source) -> None:
        trouble = Trouble(log, f"{source.name}: poll")
        seen: set[str] = set()
        while not self.stopping.is_set():
            if source.max_pending and self._waiting(source) >= source.max_pending:
                self._progress.clear()
                await _first(self.stopping.wait(), self._progress.wait(), timeout=1.0)
                continue
            delay = source.due_in()
            if delay > 0:
                source.wake.clear()
                await _first(self.stopping.wait(), source.wake.wait(), timeout=delay)
                continue
            try:
                poll = await retry(
                    lambda: self._poll_once(source, seen),
                    trouble=trouble,
                    stopping=self.stopping,
                    base=1.0,
                    cap=10.0,
                )
            except Stopped:
                break
            for m in poll.messages:
                self.outbox.put(m.subject, m.payload, m.msg_id)
            self._pending.append(_Pending(source.name, self.outbox.last_seq, poll.commit))
            self._commit()

    async def _poll_once(self, source: Source, seen: set[str]) -> Poll:
        """One poll, bounded by the stop (`Stopped` when it was cut short); a failure is logged with its
        traceback the first time its cause appears, then raised for `retry`."""
        polling = asyncio.ensure_future(source.poll(self.outbox))
        if not await self._finish(polling):
            raise Stopped(f"{source.name}: the poll in hand was cut short by the stop")
        exc = polling.exception()
        if exc is not None:
            cause = describe(exc)
            if cause not in seen and len(seen) < 100:
                seen.add(cause)
                log.error("%s: poll failed", source.name, exc_info=exc)
            raise exc
        return polling.result()

    async def _finish(self, polling: asyncio.Future[Poll]) -> bool:
        """Wait for a poll; once stopping, give it half of what is left of the grace period, then cancel it.
        True when it finished (successfully or not)."""
        if not self.stopping.is_set():
            await _first(polling, self.stopping.wait(), timeout=float("inf"), keep=polling)
        if not polling.done():
            await asyncio.wait({polling}, timeout=max(0.0, self.stopping.remaining() / 2))
        if polling.done():
            return True
        polling.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await polling
        return False

    def start(self) -> None:
        self._polling = [asyncio.create_task(self._poll_loop(s), name=s.name) for s in self.sources]

    async def publish(self, nc: NATS) -> None:
        """The service body: attach the sources, publish until stopping, then flush within the deadline."""
        for source in self.sources:
            await source.attach(nc)
        sender = asyncio.create_task(self.outbox.run(nc), name="outbox")
        t = self.telemetry  # said through one outlet a connection, not one made per report
        outlet = None if t is None else Outlet(nc, t.cluster, jetstream=True, prefix=t.prefix)
        stats = None if outlet is None else asyncio.create_task(self._stats_loop(outlet), name="stats")
        try:
            await self.stopping.wait()
            await asyncio.wait(self._polling, timeout=max(0.0, self.stopping.remaining() - 1.0))
            if len(self.outbox) and nc.is_connected:
                await self.outbox.flush(self.stopping.remaining() - 0.7)
        finally:
            for task in (sender, stats):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if outlet is not None:
                await self.report(outlet)

    async def _stats_loop(self, outlet: Outlet) -> None:
        assert self.telemetry is not None
        while not await self.stopping.sleep(self.telemetry.stats_seconds):
            await self.report(outlet)

    async def report(self, outlet: Outlet) -> None:
        """The one-line summary and the self-telemetry (`hpcbus_<counter>` lines, as every worker's: the same
        counters, `hpcbus.counters`), every `stats_seconds` and at the end."""
        assert self.telemetry is not None
        self.outbox.gauges()
        self.outbox.counters.running = 0 if self.stopping.is_set() else 1
        log.info("%s", summary(self.telemetry.name, self.outbox.counters))
        if outlet.nc.is_connected:
            await outlet.telemetry(self.telemetry.name, self.outbox.counters)

    async def drop(self) -> None:
        """End the polls without committing anything or closing the sources (a role lost: what is queued is
        the new holder's to send, `hpcbus.heldsources`)."""
        for task in self._polling:
            task.cancel()
        await asyncio.gather(*self._polling, return_exceptions=True)

    async def finish(self) -> None:
        for task in self._polling:
            task.cancel()
        await asyncio.gather(*self._polling, return_exceptions=True)
        self._commit()
        kept = bool(self.outbox.settings.spill_dir)
        for source in self.sources:
            source.close(len(self.outbox), kept)


async def _first(*aws: Awaitable[object], timeout: float, keep: asyncio.Future[Poll] | None = None) -> None:
    """Wait until one of `aws` is done or `timeout` passed; cancel the others (except `keep`)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(
            tasks,
            timeout=None if timeout == float("inf") else max(0.0, timeout),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for t in tasks:
            if t is not keep:
                t.cancel()


async def serve(
    bus: BusSettings,
    name: str,
    sources: Sequence[Source],
    outbox: OutboxSettings,
    streams: Sequence[StreamSpec] = (),
    *,
    stopping: asyncio.Event | None = None,
    grace: float = STOP_GRACE,
    on_loop: Callable[[SourceLoop], None] | None = None,
    core_subjects: Iterable[str] = (),
    telemetry: Telemetry | None = None,
) -> int:
    """Run `sources` until SIGTERM/SIGINT (or, when given, until `stopping` is set: then no signal
    handlers are installed); the exit status. `on_loop` sees the loop before it starts (its outbox).
    `core_subjects`: subjects no stream captures, published with core NATS (`hpcbus.outbox`)."""
    service = Service(bus, name, streams=streams, stopping=Stopping(min(grace, STOP_GRACE)))
    loop = SourceLoop(
        sources,
        outbox,
        service.stopping,
        core_subjects=core_subjects,
        streams=service.streams,
        telemetry=telemetry,
    )
    if on_loop is not None:
        on_loop(loop)
    bridge = None
    if stopping is not None:
        bridge = asyncio.create_task(follow(stopping, service.stopping))
    loop.start()
    try:
        return await service.run(loop.publish, signals=stopping is None)
    finally:
        service.stopping.set()
        await loop.finish()
        if bridge is not None:
            bridge.cancel()


async def follow(source: asyncio.Event, target: asyncio.Event) -> None:
    """Set `target` once `source` is set: a caller's stop event driving a service's (tests, embedding)."""
    await source.wait()
    target.set()


class _NoBacklog:
    """The backlog of `once`: nothing is queued, nothing was dropped."""

    dropped = 0

    def __len__(self) -> int:
        return 0


async def once(sources: Sequence[Source], write: Callable[[Message], None]) -> None:
    """`--once`: poll each source, again while it has more at hand (`due_in() <= 0`: an accounting file
    behind its end), and hand every message to `write`. Nothing reaches the bus and no poll is committed,
    so a state file is never advanced: a try on a live system has no side effects."""
    backlog = _NoBacklog()
    for source in sources:
        while True:
            for message in (await source.poll(backlog)).messages:
                write(message)
            if source.due_in() > 0:
                break


def rows(out: TextIO) -> Callable[[Message], None]:
    """A `once` writer: each line of a message as `SUBJECT<TAB>LINE`, so `cut -f2` gives plain line protocol
    and `grep` selects a subject."""

    def write(message: Message) -> None:
        for line in message.payload.decode().splitlines():
            out.write(f"{message.subject}\t{line}\n")

    return write
