"""The loop every consumer worker shares: pull from a durable JetStream consumer, hand each message to a
sink, and acknowledge the messages only after the sink says their batch is delivered.

At-least-once: while the sink cannot deliver (InfluxDB down), nothing is acked and the messages are kept
in progress (`+WPI`) so JetStream does not hand them to another worker meanwhile; a killed worker's unacked
messages are redelivered after `ack_wait`. Several workers bound to one durable split the load.
`core` mode subscribes without JetStream: at-most-once, documented as such.

A runner is a body of `hpcbus.service.Service`, which owns the connection, the signals and the stop
deadline. On SIGTERM/SIGINT a runner stops fetching and delivers and acks what is in hand until the deadline
(what cannot be delivered in time stays unacked and is redelivered later). A durable that cannot be bound
(its stream missing or without quorum) and fetches that fail are trouble episodes: one WARNING when it
starts, a summary while it lasts, one line when it ends.

**Errors no retry can cure** are told from transient ones in `hpcbus.permanent` (see there): a batch
that fails permanently or is too large is delivered again message by message, a `Partial` names the
messages that failed, and what fails alone is dead-lettered with the reason and acknowledged
(`hpcbus_undeliverable_messages`).

**Messages the stream discarded unread** are watched for by `hpcbus.discards.Watch` (see there), which
the runner asks before each fetch and tells what each fetch brought (`hpcbus_discarded_unread`).

**What a sink refuses** (`BadInput`, raised by `take`) is reported and dead-lettered here (`dead_letter`),
after the rest of its batch is delivered and before the batch is acknowledged, and **the counters** are the
runner's too (`hpcbus.counters`: received, delivered, retried, rejected, dead-lettered, pending; it says
exactly what a sink still counts itself), with the one-line summary and the self-telemetry (`report`). A
sink delivers and counts its extras, and never retries, acknowledges or dead-letters: `deliver` (and
`tick`, `close`, `start`) returns or raises, `hpcbus.permanent.outcome` says what the error means, and
`Runner.attempt` retries the transient ones through `hpcbus.retry.retry` (`retried`, `+WPI` for every
message in hand). A sink that merges messages (`holds_input`: the Sonar envelope assembler) hands each
message back through `Sink.settle` (`Settled`: delivered, returned at the stop, and the merged output it
rejected), and the runner holds, acknowledges, keeps alive and dead-letters them; a dead letter is stored
before anything settled with it is acknowledged.

The runner's parts live apart by role: its settings (`hpcbus.delivery`: `RunnerSettings`, the `[delivery]`
table), the sink contract (`hpcbus.contract`: `Sink`, `SinkBase`, `BadInput`, `Settled`, `Role`), and the
dead letters of refused input (`hpcbus.deadletters`); this module is the loop.

**The role gate** (`Role`): fetching and acknowledging pause while the process does not hold its role
(`held` False, until `taken` returns); the default (`AlwaysHeld`) always holds. An active/standby lease is
such a role.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError

from hpcbus.contract import AlwaysHeld, BadInput, Role, Settled, Sink, held_key
from hpcbus.counters import Counters, summary
from hpcbus.deadletters import Reject, dead_letter
from hpcbus.delivery import RunnerSettings
from hpcbus.discards import FULL_WAIT_SECONDS, Watch
from hpcbus.outlet import dedup_id
from hpcbus.peers import create_peers
from hpcbus.permanent import Permanent, TooLarge, Transient, outcome
from hpcbus.retry import Stopped, Stopping, Trouble, retry
from hpcbus.schemas.problems import Problem

log = logging.getLogger("hpcbus.runner")

UNAVAILABLE = frozenset({404, 408, 503})
"""JetStream API answers that mean "not yet" (stream missing, timeout, no quorum) rather than "not so"."""

EARLY_KEYS = 100_000
"""Settled keys kept for batches still being delivered (a bound: one whose batch then failed is forgotten)."""


class _Held(NamedTuple):
    msg: Msg
    """Without its payload (the runner only acknowledges it): memory stays small while it waits."""
    refused: bool
    """Dead-lettered already (refused in `take`): acknowledged when settled, not counted delivered."""


def _slim(msg: Msg) -> Msg:
    """`msg` without its payload and headers: enough to acknowledge it, nothing more kept in memory."""
    return Msg(msg._client, msg.subject, msg.reply, b"", None)


class Runner:
    """Fetch, fill a batch, deliver it. Up to `in_flight` batches are delivered while the next one fills,
    so the sink's far end (InfluxDB) and this process work at the same time; a slow or failing delivery
    stops the fetching (back-pressure) instead of growing anything."""

    def __init__(
        self,
        nc: NATS,
        settings: RunnerSettings,
        stream: str,
        subjects: list[str],
        sink: Sink,
        stopping: Stopping | None = None,
        role: Role | None = None,
    ) -> None:
        self.nc = nc
        self.role: Role = role or AlwaysHeld()
        self.settings = settings
        self.stream = stream
        self.subjects = subjects
        self.sink = sink
        self.stopping = stopping or Stopping()
        self._in_hand: list[Msg] = []
        self._items = 0
        self._oldest = 0.0
        self._delivering: collections.deque[tuple[asyncio.Task[None], list[Msg]]] = collections.deque()
        self._alone: collections.deque[Msg] = collections.deque()
        """Messages of a batch that failed permanently, to be delivered again one by one."""
        self._rejects: list[Reject] = []
        """The refused messages of the batch being filled."""
        self._undeliverable_episode = 0
        """Messages dead-lettered as undeliverable since the last delivery that worked (0: none)."""
        self.watch = Watch(stream, settings.durable, subjects, self._discarded_unread)
        self._held: dict[str, _Held] = {}
        """Messages of delivered batches a sink holds (`holds_input`), by `held_key`, until settled."""
        self._settling = Settled()
        """What the sink settled that is not carried out yet (a stop came first)."""
        self._settle_lock = asyncio.Lock()
        self.trouble = Trouble(log, f"{settings.durable or 'worker'}: {sink.what}")
        """Deliveries (and ticks, closes) retried: one episode while the far end does not take them."""

    @property
    def counters(self) -> Counters:
        """The worker's counters: the sink's struct (standard ones and its extras), counted here."""
        return self.sink.counters

    def _discarded_unread(self, gone: int) -> None:
        """Count `gone` messages the watch found discarded unread (and reported by this worker)."""
        self.counters.discarded_unread += gone

    async def _still_working(self) -> None:
        """Tell JetStream the messages in hand (delivering and filling) are not forgotten: `+WPI`."""
        held = [msg for _, msgs in self._delivering for msg in msgs]
        for msg in (*held, *self._in_hand, *self._alone, *(h.msg for h in self._held.values())):
            if msg.reply:
                try:
                    await msg.in_progress()
                except Exception as exc:  # connection down: redelivery will cover it
                    log.debug("in_progress failed: %s", exc)
                    return

    async def retrying(self) -> None:
        """Before each retry of a delivery, tick or close: counted in `retried`, and the messages in hand
        kept alive."""
        self.counters.retried += 1
        await self._still_working()

    async def attempt(self, op: Callable[[], Awaitable[None]]) -> bool:
        """`await op()` (a sink's `deliver`, `tick` or `close`) until it returns, retrying through `retry`
        what `hpcbus.permanent.outcome` calls transient; False when the stop deadline came first. Raises
        the other outcomes (`TooLarge`, `Permanent`, `Partial`), typed."""

        async def once() -> None:
            try:
                await op()
            except Stopped:
                raise
            except Exception as exc:
                found = outcome(exc)
                if found is exc:
                    raise
                raise found from exc

        try:
            await retry(
                once,
                trouble=self.trouble,
                stopping=self.stopping,
                cap=self.sink.retry_cap,
                retry_on=Transient,
                wait_hint=lambda exc: exc.retry_after if isinstance(exc, Transient) else 0.0,
                on_retry=self.retrying,
            )
        except Stopped:
            return False
        return True

    async def _deliver_and_ack(self, batch: object, msgs: list[Msg], rejects: list[Reject]) -> None:
        """Deliver (retried: `attempt`), then dead-letter the refused messages (`dead_letter`), then
        acknowledge; a batch too large or failing permanently is handled as `hpcbus.permanent` says (its
        refused messages' problems go with their dead letter as undeliverable, one dead letter per message).
        Stopping first: nothing is acknowledged, JetStream redelivers."""
        try:
            ok = await self.attempt(lambda: self.sink.deliver(batch, self.stopping))
        except (TooLarge, Permanent) as exc:
            culprits = exc.msgs if isinstance(exc, Permanent) else None
            if culprits is None and len(msgs) > 1:
                self._alone.extend(msgs)  # which one? each is delivered again on its own
                return
            culprits = msgs if culprits is None else culprits
            reasons = exc.reasons if isinstance(exc, Permanent) else {}
            found = {key: list(p) for key, p in (exc.problems if isinstance(exc, Permanent) else {}).items()}
            bad = {id(m) for m in culprits}
            others = [r for r in rejects if id(r.msg) not in bad]
            for reject in rejects:
                if id(reject.msg) in bad:
                    found.setdefault(id(reject.msg), []).extend(reject.problems)
                    await self.sink.outlet.report_problems(reject.problems)
            if not await dead_letter(self.sink.outlet, others, self.counters, self.stopping):
                return  # stopping before the dead letters were stored: all stay unacked
            for msg in culprits:
                if not await self._undeliverable(
                    msg, reasons.get(id(msg), exc.reason), found.get(id(msg), [])
                ):
                    return  # stopping before the dead letter was stored: all stay unacked
            kept = [m for m in msgs if id(m) not in bad]
            await self._delivered(kept, {id(r.msg) for r in rejects if id(r.msg) not in bad})
            return
        if not ok:
            log.warning(
                "%s: stopping with an undelivered batch; it stays unacked and will be redelivered",
                self.settings.durable or "worker",
            )
            return
        self._end_undeliverable_episode()
        refused_ids = {id(r.msg) for r in rejects}
        if not await dead_letter(self.sink.outlet, rejects, self.counters, self.stopping):
            return  # stopping first: the whole batch stays unacked and is redelivered
        await self._delivered(msgs, refused_ids)

    async def _delivered(self, msgs: list[Msg], refused: set[int]) -> None:
        """`msgs` are delivered (those `refused` by `take` dead-lettered already): acknowledged and counted,
        or, for a sink that holds its input, held until it settles them (`settle`)."""
        if not self.sink.holds_input:
            await self._ack(msgs)
            self.counters.delivered += len(msgs) - len(refused)  # `refused` are some of `msgs`
            return
        for msg in msgs:
            if held_key(msg):
                self._held[held_key(msg)] = _Held(_slim(msg), id(msg) in refused)
            else:  # core mode: nothing to acknowledge, delivered with its batch
                self.counters.delivered += id(msg) not in refused
        await self.settle()

    async def settle(self) -> bool:
        """Carry out what the sink settled (`Sink.settle`, after each delivery, tick and close): store the
        merged output it rejected, then acknowledge the held messages it delivered (a dead letter is
        stored before anything settled with it is acknowledged) and hand back (`-NAK`) what it returns.
        False when the stop came first: the rest stays unacknowledged (redelivered later)."""
        async with self._settle_lock:
            news = self.sink.settle()
            work = self._settling
            work.done += [key for key in news.done if key]  # "": core mode, nothing to acknowledge
            work.dead += news.dead
            work.returned += [key for key in news.returned if key]
            reports, work.reports = work.reports + news.reports, []
            for level in ("error", "warning"):
                said = [p for p in reports if (p.severity == "error") == (level == "error")]
                if said:
                    await self.sink.outlet.report_problems(said, level)
            while work.dead:
                dead = work.dead[0]
                if not dead.reported:
                    await self.sink.outlet.report_problems(dead.problems)
                    dead.reported = True
                if not await self.sink.outlet.store_deadletter(
                    dead.subject, dead.payload, dead.problems, dead.dedup_id, self.stopping
                ):
                    return False
                self.counters.deadlettered_merged += 1
                work.dead.pop(0)
            # once each: a message of a batch that failed as a whole is taken again, and a sink holding its
            # input may then settle its key twice
            found = [key for key in dict.fromkeys(work.done) if key in self._held]
            # a key not held yet: settled by a tick while its batch is still being delivered (kept for then)
            work.done = [key for key in work.done if key not in self._held][-EARLY_KEYS:]
            done = [self._held.pop(key) for key in found]
            await self._ack([h.msg for h in done])
            self.counters.delivered += sum(not h.refused for h in done)
            returned = [self._held.pop(key) for key in work.returned if key in self._held]
            work.returned = []
            for held in returned:
                with contextlib.suppress(Exception):  # connection down: redelivered after ack_wait
                    await held.msg.nak()
            self.counters.returned_messages += len(returned)
            return True

    async def hold_role(self) -> bool:
        """Wait until this process holds its role (`Role`), keeping the messages in hand alive meanwhile;
        False when stopping came first."""
        if self.role.held:
            return True
        name = self.settings.durable or "worker"
        log.info("%s: the role is not held; fetching and acknowledging pause", name)
        while not self.role.held and not self.stopping.is_set():
            taken = asyncio.ensure_future(self.role.taken())
            stop = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait(
                {taken, stop}, timeout=self.settings.ack_wait / 3, return_when=asyncio.FIRST_COMPLETED
            )
            for task in (taken, stop):
                task.cancel()
            if not self.role.held:
                await self._still_working()
        if self.role.held:
            log.info("%s: the role is held again; fetching and acknowledging", name)
        return self.role.held

    async def _ack(self, msgs: list[Msg]) -> None:
        """`+ACK` each, once the role is held (stopping first: they stay unacked, JetStream redelivers)."""
        if not msgs or not await self.hold_role():
            return
        for msg in msgs:
            if msg.reply:
                try:
                    await msg.ack()
                except (
                    Exception
                ) as exc:  # lost ack: the message comes again, and writing it twice is harmless
                    log.warning("ack failed (%s); the message will be redelivered", exc)

    async def _undeliverable(self, msg: Msg, reason: str, also: list[Problem] | None = None) -> bool:
        """Dead-letter `msg` with `reason` (and `also`, other problems the sink found in it) and acknowledge
        it; False when stopping came first (unacked). The first of an episode is a WARNING; the others are
        counted and said when the episode ends."""
        problem = Problem(f"can never be delivered: {reason}", msg.subject, kind="undeliverable")
        also = [problem, *(also or [])]
        if not await self.sink.outlet.store_deadletter(
            msg.subject, msg.data, also, dedup_id(msg), self.stopping
        ):
            return False
        self.counters.undeliverable_messages += 1
        self.counters.deadlettered += 1
        if not self._undeliverable_episode:
            log.warning(
                "%s: a message from %s can never be delivered (%s); dead-lettered, and so is every other such "
                "message until a delivery works again (counted in hpcbus_undeliverable_messages)",
                self.settings.durable or "worker",
                msg.subject,
                reason,
            )
        self._undeliverable_episode += 1
        await self._ack([msg])
        return True

    def _end_undeliverable_episode(self) -> None:
        if self._undeliverable_episode:
            log.info(
                "%s: delivering again; %d undeliverable message%s dead-lettered meanwhile",
                self.settings.durable or "worker",
                self._undeliverable_episode,
                "" if self._undeliverable_episode == 1 else "s",
            )
            self._undeliverable_episode = 0

    async def _deliver_alone(self) -> None:
        """Deliver each message of a batch that failed permanently on its own (the batch being filled is
        sealed first, so nothing else rides along)."""
        while self._alone:
            await self._start_delivery()
            self._take(self._alone.popleft(), again=True)
            await self._start_delivery()

    async def _finish_oldest(self) -> None:
        task, _ = self._delivering[0]
        await task
        self._delivering.popleft()

    async def _start_delivery(self) -> None:
        while len(self._delivering) >= max(1, self.settings.in_flight):
            await self._finish_oldest()
        if not self._in_hand:
            return
        msgs, self._in_hand, self._items = self._in_hand, [], 0
        rejects, self._rejects = self._rejects, []
        batch = self.sink.cut()
        self._delivering.append((asyncio.create_task(self._deliver_and_ack(batch, msgs, rejects)), msgs))
        # Let the delivery run up to its first wait (the request is on its way) before the next batch is
        # filled: a fetch brings many batches' worth of messages, and without this the far end would get
        # nothing until `in_flight` batches were filled, then all of them at once.
        await asyncio.sleep(0)

    async def _drain(self) -> None:
        """Deliver what is in hand; a batch failing permanently meanwhile queues its messages to be
        delivered one by one, and those are delivered too."""
        await self._start_delivery()
        while self._alone or self._delivering:
            await self._deliver_alone()
            await self._start_delivery()
            while self._delivering:
                await self._finish_oldest()

    def _take(self, msg: Msg, *, again: bool = False) -> None:
        """Hand `msg` to the sink (`again`: a message of a batch that failed permanently, counted already:
        by the runner and by the sink's `take`, whose counts are undone, so each message counts once)."""
        if not self._in_hand:
            self._oldest = time.monotonic()
        self._in_hand.append(msg)
        counted = msgspec.structs.asdict(self.counters) if again else None
        self.counters.received += 1
        try:
            self._items += self.sink.take(msg)
        except BadInput as exc:
            self._items += exc.items
            self.counters.rejected += exc.count
            self._rejects.append(Reject(msg, exc.problems))
        finally:
            if counted is not None:
                for name, value in counted.items():
                    setattr(self.counters, name, value)

    def _due(self) -> bool:
        return bool(self._in_hand) and (
            self._items >= self.settings.flush_lines
            or time.monotonic() - self._oldest >= self.settings.flush_seconds
        )

    async def run(self, *, final_report: bool = True) -> None:
        """Fetch and deliver until stopping; then the last summary and self-telemetry, unless `final_report`
        is False: `hpcbus.sinks` says them itself after the sink's `close`, which still counts."""
        stats = asyncio.create_task(self._stats_loop())
        try:
            if self.settings.mode == "core":
                await self._run_core()
            else:
                await self._run_jetstream()
        except asyncio.CancelledError:  # the role lost, the connection gone: nothing more is delivered
            for task, _ in self._delivering:
                task.cancel()
            raise
        finally:
            stats.cancel()
            if final_report:
                await self.report()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_seconds)
            await self.report()

    async def report(self) -> None:
        """The one-line summary and the self-telemetry (`hpcbus_<counter>`), every `stats_seconds` and at the
        end: the only place a worker's counters are said."""
        self.watch.say()
        c = self.counters
        delivering = sum(len(msgs) for task, msgs in self._delivering if not task.done())
        held = len(self._in_hand) + delivering + len(self._alone)
        held += sum(not h.refused for h in self._held.values())
        c.pending = held + self.sink.holding()
        dropped = None if self.stopping.is_set() else await self.sink.outlet.deadletter_dropped()
        if dropped is not None:  # a gauge: the last one said stands at the stop
            c.deadletter_stream_dropped = dropped
        self.sink.gauges()
        c.running = 0 if self.stopping.is_set() else 1  # said once more at the end: `status` sees it stop
        name = self.settings.durable or "worker"
        log.info("%s", summary(name, c))
        await self.sink.outlet.telemetry(name, c)

    async def _run_jetstream(self) -> None:
        js = self.nc.jetstream()
        durable = self.settings.durable
        config = ConsumerConfig(
            durable_name=durable,
            filter_subjects=self.subjects,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.settings.ack_wait,
            max_ack_pending=self.settings.max_ack_pending,
            max_deliver=-1,
        )

        async def bind() -> JetStreamContext.PullSubscription:
            try:
                await js.add_consumer(self.stream, config)
            except APIError as exc:
                if exc.code in UNAVAILABLE:
                    raise  # no stream (yet), no quorum: retried
                log.warning(  # exists with another config: use it as the operator left it
                    "consumer %s on %s: %s; using the existing one", durable, self.stream, exc.description
                )
            await create_peers(self.nc, js, self.stream, config, self.settings.peers, self.settings.durable)
            return await js.pull_subscribe_bind(durable=durable, stream=self.stream)

        binding = Trouble(log, f"consumer {durable} on stream {self.stream}")
        try:
            psub = await retry(bind, trouble=binding, stopping=self.stopping, base=1.0, cap=10.0)
        except Stopped:
            return
        log.info("consuming %s (stream %s, durable %s)", ", ".join(self.subjects), self.stream, durable)
        await self.watch.check(js)
        fetching = Trouble(log, f"fetch from stream {self.stream} (durable {durable})")
        while not self.stopping.is_set():
            wait = self.settings.flush_seconds
            if self._in_hand:
                wait = max(0.05, self.settings.flush_seconds - (time.monotonic() - self._oldest))
            await self._deliver_alone()
            if self.stopping.is_set():
                break
            await self.watch.check(js)
            if self.watch.lagging and self.watch.full:
                # Every ack slot of the durable is taken: a fetch now would wait in the server until one is
                # free, and a discard meanwhile would pass between the check and the delivery unseen.
                await self.stopping.sleep(min(wait, FULL_WAIT_SECONDS))
                if self._due():
                    await self._start_delivery()
                continue
            if not await self.hold_role():
                break

            async def fetch(wait: float = wait) -> list[Msg]:
                if self.stopping.is_set():
                    return []
                try:
                    return await psub.fetch(self.settings.fetch_batch, timeout=wait)
                except (TimeoutError, NatsTimeout):
                    return []  # nothing to fetch; NATS' own absence is the connection's trouble

            try:  # stream unavailable, no quorum, disconnected: retried
                msgs = await retry(fetch, trouble=fetching, stopping=self.stopping, base=0.5, cap=5.0)
            except Stopped:
                break
            await self.watch.follow(msgs)
            for msg in msgs:
                self._take(msg)
                if self._items >= self.settings.flush_lines:
                    await self._start_delivery()  # batches stay near flush_lines, whatever a fetch brings
            if self._due():
                await self._start_delivery()
        await self._drain()
        with contextlib.suppress(Exception):  # a closed connection has nothing to unsubscribe from
            await psub.unsubscribe()

    async def _run_core(self) -> None:
        queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=10_000)

        async def on_msg(msg: Msg) -> None:
            await queue.put(msg)

        subs = [await self.nc.subscribe(subject, cb=on_msg) for subject in self.subjects]
        log.info("consuming %s (core NATS: at-most-once)", ", ".join(self.subjects))
        while not self.stopping.is_set():
            await self._deliver_alone()
            if not await self.hold_role():
                break
            try:
                msg = await asyncio.wait_for(queue.get(), timeout=self.settings.flush_seconds)
                self._take(msg)
            except TimeoutError:
                pass
            if self._due():
                await self._start_delivery()
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        while not queue.empty():
            self._take(queue.get_nowait())
        await self._drain()
