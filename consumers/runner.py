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

**Errors no retry can cure.** Retrying forever is right for a service that is down and wrong for a message
that can never be delivered (a file name too long, a permission refused, a value the sink can never store):
one such message would halt the worker for good. `permanent` is the one place that tells the two apart (a
sink's `Permanent`, or an `OSError` whose errno no retry changes). A batch that fails permanently is delivered
again message by message, and each message that fails again on its own is dead-lettered with the reason and
acknowledged, so the good messages of that batch are delivered and everything behind them flows. Such
messages are counted (`hpcbus_undeliverable_messages`) and logged once per episode, not once per message.

**Messages the stream discarded unread.** A stream at its limits with `discard: old` drops its oldest
messages, read or not; a durable that lagged behind (no worker, a sink down, a sink slower than the
publishers) would then skip them without a trace: the server moves the durable past them at its next fetch.
Three ways find them:

- the check: the stream's first sequence past the durable's last delivered one (every sequence in between
  was stored and is gone without ever being delivered to this durable). It runs before every fetch while
  the durable lags (the last check or the last fetched message said messages were waiting, or a discard was
  found), otherwise at most once a second (two JetStream API requests). While the durable lags with every
  ack slot taken (`max_ack_pending`) and the stream is at its limits, the worker checks again (every
  `FULL_WAIT_SECONDS`) instead of fetching: a fetch would wait in the server, and a discard meanwhile
  would pass between the check and the delivery;
- the fetched messages: a new message whose consumer sequence follows the last delivery this worker knows
  of (from the check or its previous fetch: no delivery to anyone in between) but whose stream sequence
  jumps skipped exactly the sequences in between;
- for workers sharing the durable, while it lags: each records its runs of deliveries (consecutive consumer
  sequences) in the shared entry of `consumers.discards`; a run next to another worker's in consumer
  sequence with a jump in stream sequence skipped exactly the sequences in between.

A gap between two deliveries alone is no proof (workers share a durable, a filter skips other subjects),
hence the consumer sequence. The worker logs a WARNING naming the stream, the durable and the count (then
at most one a minute, summing what came meanwhile) and counts it (`hpcbus_discarded_unread`). The reported
ranges live in the shared entry too, so a discard is counted by exactly one worker of the durable. The count
is exact when the durable reads every subject of the stream (a discard right beside a redelivery, or just
as the durable starts to lag, can still go unseen by the last two ways; the check sees what is still
behind the durable). When the stream also holds other subjects it is an upper bound (what is gone cannot be
asked for its subject; only the check is used): the WARNING says "up to", and is given only when the
durable had messages waiting (`num_pending`) at this check and at the one before (or at the first check),
since a sparse durable on a busy stream always trails its first sequence. A stream with `interest` retention
(`stream_discard = "new"`) discards nothing a durable has not acknowledged, so it is not checked
(docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError

from consumers.discards import Ledger
from consumers.outlet import Outlet, dedup_id
from hpcbus.options import Section
from hpcbus.retry import Stopped, Stopping, Trouble, describe, retry
from schemas.problems import Problem

log = logging.getLogger("hpcbus.runner")

UNAVAILABLE = frozenset({404, 408, 503})
"""JetStream API answers that mean "not yet" (stream missing, timeout, no quorum) rather than "not so"."""


PERMANENT_ERRNOS = frozenset(
    {
        errno.ENAMETOOLONG,  # the name is too long for the file system
        errno.EACCES,  # permission refused (each: under a tree root that can be written, see `permanent`)
        errno.EPERM,
        errno.EROFS,  # a read-only file system
        errno.EINVAL,  # a name or argument the file system refuses
        errno.ENOTDIR,  # a file where a directory should be
        errno.EISDIR,
        errno.EEXIST,  # (from mkdir) something that is not a directory in the way
        errno.ELOOP,
        errno.EFBIG,  # the file is at the largest size this system allows
    }
)
"""`OSError` numbers that no retry cures: the name, the path or the permission is wrong, not the moment.
Transient on purpose: ENOSPC and EDQUOT (space comes back), EIO, EMFILE/ENFILE, EAGAIN, EINTR, ENOMEM."""


GAP_CHECK_SECONDS = 1.0
"""Least seconds between two checks for messages the stream discarded unread (two JetStream API requests)
while the durable is not lagging; a lagging one is checked before every fetch."""

FULL_WAIT_SECONDS = 0.2
"""While the durable lags with every ack slot taken and the stream is at its limits, check again after this
long instead of fetching (two JetStream API requests each time)."""

AT_LIMITS = 0.9
"""A stream holding this share of its `max_bytes` or `max_msgs` is at its limits: it may discard soon."""

DISCARD_WARNING_SECONDS = 60.0
"""Least seconds between two WARNINGs about discarded messages; what comes meanwhile is summed."""


class Permanent(Exception):
    """An error no retry can cure; a sink raises it from `deliver`.

    `msgs` None: the batch failed as a whole and the sink cannot say which message caused it: the runner
    delivers each message of the batch again on its own and dead-letters the ones that fail again. A list:
    every other message of the batch is delivered, these failed: the runner dead-letters them, each with
    its own reason from `reasons` (by `id(msg)`; `reason` otherwise) and the `problems` the sink found in it
    besides (by `id(msg)`: one dead letter per message, since a second with the same dedup id is dropped)."""

    def __init__(
        self,
        reason: str,
        msgs: list[Msg] | None = None,
        *,
        reasons: dict[int, str] | None = None,
        problems: dict[int, list[Problem]] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.msgs = msgs
        self.reasons = reasons or {}
        self.problems = problems or {}


def writable(root: Path) -> bool:
    """True when a file can be created in directory `root` (created if missing): a probe file, made and
    removed, since `os.access` says yes to root for an immutable directory or a read-only `/sys`."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=root, prefix=".hpcbus-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError:
        return False
    return True


def permanent(exc: BaseException, root: Path | None = None) -> str | None:
    """The reason why `exc` (or an exception it was raised from) can never succeed on retry; None when
    retrying may help. The one place that tells the two apart.

    `root`: the tree the failed item lives in. Such an error (a permission refused, ENOTDIR, ...) is the
    item's own only when `root` can still be written; otherwise the whole tree is refused (a read-only
    remount, a root owned by someone else or replaced by a file) and every message would fail alike:
    transient, retried (the worker stalls, one WARNING per episode) instead of dead-lettering the whole
    flow. Without `root` such an error is permanent."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, Permanent):
            return seen.reason
        if isinstance(seen, OSError) and seen.errno in PERMANENT_ERRNOS:
            if root is not None and not writable(root):
                return None  # the whole tree refuses (a permission, a read-only remount, a file as root)
            return describe(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def covers(filters: list[str], subject: str) -> bool:
    """True when every subject `subject` (a stream's subject, wildcards allowed) matches is matched by one
    of `filters` (a durable's filter subjects)."""

    def one(f: list[str], s: list[str]) -> bool:
        for i, token in enumerate(f):
            if token == ">":
                return len(s) > i
            if i >= len(s) or s[i] == ">":
                return False
            if token != "*" and token != s[i]:
                return False
        return len(f) == len(s)

    tokens = subject.split(".")
    return any(one(f.split("."), tokens) for f in filters)


class RunnerCounters(msgspec.Struct):
    """What the runner itself counts, published with the sink's self-telemetry (same `stype-id`)."""

    undeliverable_messages: int = 0
    """Messages that failed with an error no retry cures: dead-lettered with the reason, acknowledged."""
    discarded_unread: int = 0
    """Messages the stream discarded before this durable delivered them (an upper bound when the stream
    also holds subjects the durable does not read: see the module docstring)."""


class RunnerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: Literal["jetstream", "core"] = "jetstream"
    """`jetstream` (durable, at-least-once) or `core` (plain subscription, at-most-once)."""
    durable: str = ""
    """Durable consumer name; workers with the same name share the work."""
    fetch_batch: int = 200
    """Messages asked for per pull."""
    ack_wait: float = 30.0
    """Seconds JetStream waits for an ack before redelivering: how long a killed worker's messages wait
    before another worker gets them. A worker that is slow but alive extends it with `+WPI`."""
    max_ack_pending: int = 1000
    """Unacked messages allowed across all workers of the durable."""
    in_flight: int = 3
    """Batches being delivered at once while the next one fills (InfluxDB works on one while it receives
    the next); memory holds at most `in_flight + 1` batches, and a slow sink stops the fetching."""
    flush_lines: int = 5000
    """Deliver when this many items are waiting ..."""
    flush_seconds: float = 1.0
    """... or when the oldest waiting item is this old."""
    stats_seconds: float = 60.0
    """Interval of the one-line summary and the self-telemetry metrics."""


def delivery_section(
    durable: str,
    table: str = "delivery",
    *,
    notes: dict[str, str] | None = None,
    defaults: dict[str, object] | None = None,
) -> Section:
    """The `[delivery]` table of a consumer command (its `RunnerSettings`), with the command's own durable
    name as the default (and `defaults`, for a command that changes others); `table` for a command whose
    table has another name (shown as "delivery")."""
    return Section(
        table,
        RunnerSettings,
        title="delivery",
        defaults={"durable": durable, **(defaults or {})},
        metavars={"durable": "NAME", "ack_wait": "S", "flush_seconds": "S"},
        notes=notes or {},
    )


class Sink(Protocol):
    """What a worker does with messages.

    `take` adds a message to the batch being filled and returns how many items it added; `cut` seals that
    batch and starts a new one; `deliver` delivers a sealed batch (True: done, its messages get acked;
    False: stopping before it could, they stay unacked and are redelivered later; `Permanent`, or an error
    `permanent` recognises: see there). A sink retries transient errors itself and never raises them.
    """

    outlet: Outlet
    """Where the sink's dead letters and self-telemetry go; the runner's go there too."""

    def take(self, msg: Msg) -> int: ...

    def cut(self) -> object: ...

    async def deliver(
        self, batch: object, still_working: Callable[[], Awaitable[None]], stopping: Stopping
    ) -> bool: ...

    async def report(self) -> None: ...


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
    ) -> None:
        self.nc = nc
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
        self.counters = RunnerCounters()
        self._undeliverable_episode = 0
        """Messages dead-lettered as undeliverable since the last delivery that worked (0: none)."""
        self._checked = -math.inf
        self._lagging = False
        """The last check found messages waiting (`num_pending`) or a discard: check before every fetch."""
        self._pending: bool | None = None
        """The durable had messages waiting at the last check (None: no check yet)."""
        self._exact = False
        """The durable reads every subject of the stream: a discard is counted exactly."""
        self._mark: tuple[int, int | None] | None = None
        """(consumer sequence, stream sequence) of the last delivery this worker knows of; the stream
        sequence is None when deliveries to other workers came between."""
        self._ledger: Ledger | None = None
        self._full = False
        """Every ack slot of the durable was taken at the last check (`max_ack_pending`), the stream at its
        limits."""
        self._discard_warned = -math.inf
        self._discard_quiet: list[tuple[int, int, int]] = []
        """Discards (count, first sequence, last sequence) found since the last WARNING, not yet said."""
        self._limits: tuple[object, object] = (None, None)
        """The stream's max_bytes and max_age at the last check, for the WARNING."""

    async def _still_working(self) -> None:
        """Tell JetStream the messages in hand (delivering and filling) are not forgotten: `+WPI`."""
        held = [msg for _, msgs in self._delivering for msg in msgs]
        for msg in (*held, *self._in_hand, *self._alone):
            if msg.reply:
                try:
                    await msg.in_progress()
                except Exception as exc:  # connection down: redelivery will cover it
                    log.debug("in_progress failed: %s", exc)
                    return

    async def _deliver_and_ack(self, batch: object, msgs: list[Msg]) -> None:
        try:
            ok = await self.sink.deliver(batch, self._still_working, self.stopping)
        except Exception as exc:
            reason = permanent(exc)
            if reason is None:
                raise
            culprits = exc.msgs if isinstance(exc, Permanent) and exc.msgs is not None else None
            if culprits is None and len(msgs) > 1:
                self._alone.extend(msgs)  # which one? each is delivered again on its own
                return
            culprits = msgs if culprits is None else culprits
            reasons = exc.reasons if isinstance(exc, Permanent) else {}
            found = exc.problems if isinstance(exc, Permanent) else {}
            for msg in culprits:
                if not await self._undeliverable(msg, reasons.get(id(msg), reason), found.get(id(msg), [])):
                    return  # stopping before the dead letter was stored: all stay unacked
            bad = {id(m) for m in culprits}
            await self._ack([m for m in msgs if id(m) not in bad])
            return
        if ok:
            self._end_undeliverable_episode()
            await self._ack(msgs)

    async def _ack(self, msgs: list[Msg]) -> None:
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
        if not await self.sink.outlet.deadletter(
            msg.subject, msg.data, [problem, *(also or [])], dedup_id(msg), self.stopping
        ):
            return False
        self.counters.undeliverable_messages += 1
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
            self._take(self._alone.popleft())
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
        batch = self.sink.cut()
        self._delivering.append((asyncio.create_task(self._deliver_and_ack(batch, msgs)), msgs))
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

    def _take(self, msg: Msg) -> None:
        if not self._in_hand:
            self._oldest = time.monotonic()
        self._in_hand.append(msg)
        self._items += self.sink.take(msg)

    def _due(self) -> bool:
        return bool(self._in_hand) and (
            self._items >= self.settings.flush_lines
            or time.monotonic() - self._oldest >= self.settings.flush_seconds
        )

    async def run(self) -> None:
        stats = asyncio.create_task(self._stats_loop())
        try:
            if self.settings.mode == "core":
                await self._run_core()
            else:
                await self._run_jetstream()
        finally:
            stats.cancel()
            await self.sink.report()
            await self._report()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_seconds)
            await self.sink.report()
            await self._report()

    async def _report(self) -> None:
        self._say_discards()
        c = self.counters
        if c.undeliverable_messages or c.discarded_unread:
            log.info(
                "%s: %d undeliverable messages dead-lettered, %d messages discarded by the stream unread",
                self.settings.durable or "worker",
                c.undeliverable_messages,
                c.discarded_unread,
            )
        await self.sink.outlet.telemetry(self.settings.durable or "worker", c)

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
            return await js.pull_subscribe_bind(durable=durable, stream=self.stream)

        binding = Trouble(log, f"consumer {durable} on stream {self.stream}")
        try:
            psub = await retry(bind, trouble=binding, stopping=self.stopping, base=1.0, cap=10.0)
        except Stopped:
            return
        log.info("consuming %s (stream %s, durable %s)", ", ".join(self.subjects), self.stream, durable)
        await self._check_discarded(js)
        fetching = Trouble(log, f"fetch from stream {self.stream} (durable {durable})")
        while not self.stopping.is_set():
            wait = self.settings.flush_seconds
            if self._in_hand:
                wait = max(0.05, self.settings.flush_seconds - (time.monotonic() - self._oldest))
            await self._deliver_alone()
            if self.stopping.is_set():
                break
            await self._check_discarded(js)
            if self._lagging and self._full:
                # Every ack slot of the durable is taken: a fetch now would wait in the server until one is
                # free, and a discard meanwhile would pass between the check and the delivery unseen.
                await self.stopping.sleep(min(wait, FULL_WAIT_SECONDS))
                if self._due():
                    await self._start_delivery()
                continue
            try:
                msgs = await psub.fetch(self.settings.fetch_batch, timeout=wait)
                fetching.ok()
            except (TimeoutError, NatsTimeout):
                msgs = []  # nothing to fetch (while connected); NATS' own absence is the connection's trouble
                if self.nc.is_connected:
                    fetching.ok()
            except Exception as exc:  # stream unavailable, no quorum, disconnected: try again shortly
                fetching.failed(exc)
                await self.stopping.sleep(0.5)
                msgs = []
            await self._follow(msgs)
            for msg in msgs:
                self._take(msg)
                if self._items >= self.settings.flush_lines:
                    await self._start_delivery()  # batches stay near flush_lines, whatever a fetch brings
            if self._due():
                await self._start_delivery()
        await self._drain()
        with contextlib.suppress(Exception):  # a closed connection has nothing to unsubscribe from
            await psub.unsubscribe()

    async def _check_discarded(self, js: JetStreamContext) -> None:
        """Before a fetch (every time while the durable lags, otherwise at most every `GAP_CHECK_SECONDS`):
        did the stream discard messages this durable had not yet delivered? The stream's first sequence past
        the durable's last delivered one is the proof (a gap between two deliveries is none: workers share a
        durable, a filter skips other subjects); the sequences in between are counted before the fetch that
        would move the durable past them. A discard between this check and the fetch is found by `_follow`."""
        now = time.monotonic()
        if not self._lagging and now - self._checked < GAP_CHECK_SECONDS:
            return
        self._checked = now
        durable = self.settings.durable
        try:
            # The stream first: what was gone then and still undelivered after it was never delivered (the
            # other order would count messages another worker fetched between the two as discarded).
            stream = await js.stream_info(self.stream)
            consumer = await js.consumer_info(self.stream, durable)
        except Exception as exc:  # the fetch that follows reports an unavailable stream
            log.debug("discard check of %s skipped: %s", self.stream, exc)
            self._mark, self._full = None, False
            return
        if str(getattr(stream.config.retention, "value", stream.config.retention)) == "interest":
            self._lagging, self._mark, self._full = False, None, False
            return  # messages leave when every durable has acknowledged them: the gap is others' subjects
        if self._ledger is None:
            self._ledger = Ledger(js, self.stream, durable, stream.config.num_replicas or 1)
        self._limits = (stream.config.max_bytes, stream.config.max_age)
        self._exact = all(covers(self.subjects, subject) for subject in stream.config.subjects or [])
        delivered = consumer.delivered.stream_seq if consumer.delivered else 0
        first = int(stream.state.first_seq or 0)
        waiting = bool(consumer.num_pending)
        most = consumer.config.max_ack_pending if consumer.config else None
        config, state = stream.config, stream.state
        at_limits = bool(
            (config.max_bytes and config.max_bytes > 0 and state.bytes >= AT_LIMITS * config.max_bytes)
            or (config.max_msgs and config.max_msgs > 0 and state.messages >= AT_LIMITS * config.max_msgs)
        )
        self._full = at_limits and bool(most and most > 0 and (consumer.num_ack_pending or 0) >= most)
        before, self._pending = self._pending, waiting
        # Lagging: something of ours waits, or (reading every subject) a discard passed the durable; a gap
        # alone on a shared stream is mostly other subjects (a sparse durable trails its first sequence).
        self._lagging = waiting or (self._exact and first > delivered + 1)
        self._mark = (consumer.delivered.consumer_seq if consumer.delivered else 0, max(delivered, first - 1))
        if first <= delivered + 1:
            return
        if not self._exact and not (waiting and before is not False):
            return  # nothing of ours waiting now and at the check before: the gap holds other subjects
        await self._discarded(delivered + 1, first - 1, int(stream.state.last_seq or 0))

    async def _follow(self, msgs: list[Msg]) -> None:
        """Find a discard between the last check (or fetch) and this fetch from the fetched messages: a new
        message whose consumer sequence follows the last delivery this worker knows of (none to anyone in
        between) skipped exactly the stream sequences between the two. Only where the durable reads every
        subject: otherwise the skipped sequences may be other subjects."""
        gaps: list[tuple[int, int]] = []
        runs: list[list[int]] = []
        for msg in msgs:
            try:
                meta = msg.metadata
            except Exception:  # not a JetStream message
                self._mark = None
                continue
            cseq, sseq = meta.sequence.consumer, meta.sequence.stream
            new = meta.num_delivered == 1
            if meta.num_pending:  # more waits behind it: lagging, without asking
                self._lagging = True
            if new and runs and runs[-1][2] + 1 == cseq:
                runs[-1][2:] = [cseq, sseq]
            elif new:
                runs.append([cseq, sseq, cseq, sseq])
            mark, self._mark = self._mark, (cseq, sseq if new else None)
            if mark is None or cseq != mark[0] + 1:
                continue  # deliveries to other workers came between: the check covers those
            if not new:
                self._mark = mark if mark[1] is None else (cseq, mark[1])  # a redelivery moves nothing
                continue
            if self._exact and mark[1] is not None and sseq > mark[1] + 1:
                gaps.append((mark[1] + 1, sseq - 1))
        for lo, hi in gaps:
            self._lagging = True
            await self._discarded(lo, hi, None)
        if self._exact and self._lagging and runs and self._ledger is not None:
            # Workers sharing the durable: a discard between another worker's deliveries and these.
            try:
                between = await self._ledger.follow([(a, b, c, d) for a, b, c, d in runs])
            except Exception as exc:  # the check covers what this misses
                log.debug("recording deliveries of %s failed: %s", self.settings.durable, exc)
                return
            if between:
                await self._count(between)

    async def _discarded(self, lo: int, hi: int, last_seq: int | None) -> None:
        """Count and say the part of sequences `lo..hi`, gone unread, that no worker of the durable has
        reported yet."""
        assert self._ledger is not None
        await self._count(await self._ledger.claim(lo, hi, last_seq))

    async def _count(self, new: list[tuple[int, int]]) -> None:
        """Count and say sequence ranges `new`, gone unread, reported by this worker."""
        if not new:
            return
        gone = sum(b - a + 1 for a, b in new)
        self.counters.discarded_unread += gone
        self._discard_quiet.append((gone, min(a for a, _ in new), max(b for _, b in new)))
        if time.monotonic() - self._discard_warned >= DISCARD_WARNING_SECONDS:
            self._say_discards()

    def _say_discards(self) -> None:
        if not self._discard_quiet:
            return
        gone = sum(n for n, _, _ in self._discard_quiet)
        lo, hi = self._discard_quiet[0][1], self._discard_quiet[-1][2]
        times = len(self._discard_quiet)
        self._discard_quiet = []
        self._discard_warned = time.monotonic()
        max_bytes, max_age = self._limits
        log.warning(
            "stream %s discarded %s%d message%s (sequences %d..%d%s) before durable %s had them: the stream was "
            "at its limits (max_bytes %s, max_age %s s) while this durable lagged; lost to it%s (counted in "
            "hpcbus_discarded_unread)",
            self.stream,
            "" if self._exact else "up to ",
            gone,
            "" if gone == 1 else "s",
            lo,
            hi,
            "" if times == 1 else f", in {times} discards over the last minute",
            self.settings.durable,
            max_bytes,
            max_age,
            ""
            if self._exact
            else "; the stream also holds subjects this durable does not read, so some were not its",
        )

    async def _run_core(self) -> None:
        queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=10_000)

        async def on_msg(msg: Msg) -> None:
            await queue.put(msg)

        subs = [await self.nc.subscribe(subject, cb=on_msg) for subject in self.subjects]
        log.info("consuming %s (core NATS: at-most-once)", ", ".join(self.subjects))
        while not self.stopping.is_set():
            await self._deliver_alone()
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
