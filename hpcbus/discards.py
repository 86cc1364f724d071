"""Messages the stream discarded unread: the watch each worker keeps (`Watch`), and the record of discards
the workers of a durable share (`Ledger`).

A stream at its limits with `discard: old` drops its oldest messages, read or not; a durable that lagged
behind (no worker, a sink down, a sink slower than the publishers) would then skip them without a trace:
the server moves the durable past them at its next fetch.
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
  sequences) in the shared entry (`Ledger`, below); a run next to another worker's in consumer
  sequence with a jump in stream sequence skipped exactly the sequences in between.

A durable's first start is a discard like the others: created on a stream whose first sequence is past 1
(what a gateway or a producer published before any worker ran, at the stream's limits), it never had
sequences 1 .. first-1. The server shows a new durable as "delivered" up to where it starts, so while it
has delivered nothing (consumer sequence 0) the check counts from sequence 1, with its own WARNING ("before
durable ... had any"); workers starting together on it count it once, and a restart does not count it again
(the ledger holds the range, and once it delivered the server's position is a delivery). Only for a durable
that reads from the stream's start (`deliver_policy` all, what the runner creates).

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
(`stream_discard = "new"`) discards nothing a durable has not acknowledged, so it is not checked; before its
first durable exists it keeps nothing at all, and the entries refuse to publish then (`hpcbus.interest`,
docs/scaling.md).

The shared record (`Ledger`): workers bound to one durable all see the same discard (the stream's first
sequence past the durable's last delivered one); counted by each, a loss of 238 messages read as 476. The reported ranges therefore live in a
JetStream key-value entry (bucket `<stream>_discards`, key: the durable) that every worker updates with
compare-and-set on its revision: of two workers claiming the same range, exactly one gets it. The entry
also holds the latest runs of deliveries of each worker (consecutive consumer sequences), so that a discard
between one worker's delivery and the next worker's is found (`between_runs`). Where the
bucket cannot be used (an identity without its permissions, a server without JetStream KV) the ranges are
kept in this process only, said once as a WARNING: each worker of the durable then counts a shared discard.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from hpcbus.streams import discards_bucket, interest_retention

log = logging.getLogger("hpcbus.runner")

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


def from_the_start(consumer: ConsumerInfo) -> bool:
    """Does the durable read the stream from its first message (`deliver_policy` all, what the runner
    creates)? One an operator made to start later never had what went before its start."""
    policy = consumer.config.deliver_policy if consumer.config else None
    return policy is None or str(getattr(policy, "value", policy)) == "all"


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


KEPT_RANGES = 32
"""Ranges kept per durable: a discard is reported within seconds, so only the latest can be claimed again."""

Range = tuple[int, int]


def subtract(ranges: list[Range], lo: int, hi: int) -> list[Range]:
    """The parts of `lo..hi` (inclusive) that no range of `ranges` (sorted, disjoint) covers."""
    out: list[Range] = []
    at = lo
    for a, b in ranges:
        if b < at:
            continue
        if a > hi:
            break
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
        if at > hi:
            return out
    if at <= hi:
        out.append((at, hi))
    return out


def merge(ranges: list[Range], new: list[Range]) -> list[Range]:
    """`ranges` with `new` added, sorted, adjacent ones joined, only the latest `KEPT_RANGES`."""
    out: list[Range] = []
    for a, b in sorted([*ranges, *new]):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out[-KEPT_RANGES:]


Run = tuple[int, int, int, int]
"""Deliveries of consecutive consumer sequences, all new (not redeliveries), to one worker: (first consumer
sequence, its stream sequence, last consumer sequence, its stream sequence)."""

KEPT_RUNS = 64
"""Runs kept per durable: enough for the fetches of every worker over the last seconds."""


class State(msgspec.Struct, forbid_unknown_fields=True):
    """The shared entry: ranges reported, and the latest runs of deliveries of the durable's workers."""

    ranges: list[Range] = msgspec.field(default_factory=list)
    runs: list[Run] = msgspec.field(default_factory=list)


def between_runs(runs: list[Run], new: Run) -> list[Range]:
    """Stream sequences skipped between `new` and a run of another worker next to it in consumer sequence:
    no delivery came between the two, so the sequences between their stream sequences were never
    delivered to this durable (the durable reads every subject)."""
    gaps: list[Range] = []
    c1, s1, c2, s2 = new
    for p1, q1, p2, q2 in runs:
        if p2 + 1 == c1 and s1 > q2 + 1:
            gaps.append((q2 + 1, s1 - 1))
        if c2 + 1 == p1 and q1 > s2 + 1:
            gaps.append((s2 + 1, q1 - 1))
    return gaps


class Ledger:
    """The ranges of stream `stream` reported for durable `durable` (see the module docstring)."""

    def __init__(self, js: JetStreamContext, stream: str, durable: str, replicas: int = 1) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.replicas = replicas
        self._kv: KeyValue | None = None
        self._local = State()
        self._shared = True

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            name = discards_bucket(self.stream)
            try:
                self._kv = await self.js.key_value(name)
            except BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=name, history=1, replicas=self.replicas, storage=StorageType.FILE
                )
                try:
                    self._kv = await self.js.create_key_value(config)
                except Exception:  # another worker created it meanwhile (with other settings)
                    self._kv = await self.js.key_value(name)
        return self._kv

    async def claim(self, lo: int, hi: int, last_seq: int | None = None) -> list[Range]:
        """Mark `lo..hi` as reported and return the parts no worker of the durable had reported before.
        `last_seq`: the stream's last sequence now; a kept range beyond it means the stream was recreated
        (its sequences restarted), and what was kept is dropped."""
        return await self._change(lambda state: claim_ranges(state, [(lo, hi)], last_seq))

    async def follow(self, runs: list[Run]) -> list[Range]:
        """Record this worker's `runs` of deliveries; return the sequences skipped between them and the
        runs of the durable's other workers next to them, not reported before (they are marked reported)."""

        def change(state: State) -> tuple[State, list[Range]]:
            gaps: list[Range] = []
            for run in runs:
                gaps += between_runs(state.runs, run)
            state = State(state.ranges, sorted([*state.runs, *runs])[-KEPT_RUNS:])
            return claim_ranges(state, gaps, None)

        return await self._change(change, always=True)

    async def _change(
        self, change: Callable[[State], tuple[State, list[Range]]], *, always: bool = False
    ) -> list[Range]:
        if self._shared:
            try:
                return await self._change_shared(change, always)
            except Exception as exc:
                self._shared = False
                log.warning(
                    "stream %s, durable %s: the key-value bucket %s that lets workers of one durable report a "
                    "discard once cannot be used (%s); this worker keeps its own record, so each worker of "
                    "the durable counts a discard they share",
                    self.stream,
                    self.durable,
                    discards_bucket(self.stream),
                    exc,
                )
        self._local, new = change(self._local)
        return new

    async def _change_shared(
        self, change: Callable[[State], tuple[State, list[Range]]], always: bool
    ) -> list[Range]:
        kv = await self._bucket()
        for _ in range(50):
            try:
                entry = await kv.get(self.durable)
                revision = entry.revision or 0
                try:
                    state = msgspec.json.decode(entry.value or b"{}", type=State)
                except msgspec.DecodeError:  # written by another version: start afresh
                    state = State()
            except KeyDeletedError as exc:
                state, revision = State(), exc.entry.revision if exc.entry else 0
            except KeyNotFoundError:
                state, revision = State(), 0
            state, new = change(state)
            if not new and not always:
                return []
            try:
                await kv.update(self.durable, msgspec.json.encode(state), last=revision)
            except KeyWrongLastSequenceError:
                continue  # another worker changed it meanwhile: read again
            return new
        raise RuntimeError("the entry kept changing under 50 attempts")


def claim_ranges(state: State, claims: list[Range], last_seq: int | None) -> tuple[State, list[Range]]:
    """`state` with `claims` marked reported, and the parts of them not reported before. A kept range past
    `last_seq` (the stream's last sequence now) means the stream was recreated: what was kept is dropped."""
    ranges = state.ranges
    if last_seq is not None and ranges and ranges[-1][1] > last_seq:
        ranges, state = [], State()
    new: list[Range] = []
    for lo, hi in claims:
        fresh = subtract(ranges, lo, hi)
        ranges = merge(ranges, fresh)
        new += fresh
    return State(ranges, state.runs), new


class Watch:
    """The watch of one worker of durable `durable` (reading `subjects` of stream `stream`) for messages the
    stream discarded unread (see the module docstring); `counted` is told how many it found, each time.
    The runner calls `check` before each fetch, `follow` with what each fetch brought, and `say` with its
    summary."""

    def __init__(
        self, stream: str, durable: str, subjects: list[str], counted: Callable[[int], None]
    ) -> None:
        self.stream = stream
        self.durable = durable
        self.subjects = subjects
        self._counted = counted
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

    @property
    def lagging(self) -> bool:
        """The durable lags (the last check or fetch said messages were waiting, or a discard was found)."""
        return self._lagging

    @property
    def full(self) -> bool:
        """Every ack slot of the durable was taken at the last check, the stream at its limits."""
        return self._full

    async def check(self, js: JetStreamContext) -> None:
        """Before a fetch (every time while the durable lags, otherwise at most every `GAP_CHECK_SECONDS`):
        did the stream discard messages this durable had not yet delivered? The stream's first sequence past
        the durable's last delivered one is the proof (a gap between two deliveries is none: workers share a
        durable, a filter skips other subjects); the sequences in between are counted before the fetch that
        would move the durable past them. A discard between this check and the fetch is found by `follow`."""
        now = time.monotonic()
        if not self._lagging and now - self._checked < GAP_CHECK_SECONDS:
            return
        self._checked = now
        durable = self.durable
        try:
            # The stream first: what was gone then and still undelivered after it was never delivered (the
            # other order would count messages another worker fetched between the two as discarded).
            stream = await js.stream_info(self.stream)
            consumer = await js.consumer_info(self.stream, durable)
        except Exception as exc:  # the fetch that follows reports an unavailable stream
            log.debug("discard check of %s skipped: %s", self.stream, exc)
            self._mark, self._full = None, False
            return
        if interest_retention(stream.config):
            self._lagging, self._mark, self._full = False, None, False
            return  # messages leave when every durable has acknowledged them: the gap is others' subjects
        if self._ledger is None:
            self._ledger = Ledger(js, self.stream, durable, stream.config.num_replicas or 1)
        self._limits = (stream.config.max_bytes, stream.config.max_age)
        self._exact = all(covers(self.subjects, subject) for subject in stream.config.subjects or [])
        delivered = consumer.delivered.stream_seq if consumer.delivered else 0
        # A durable that has delivered nothing (its first start): the "delivered" stream sequence the server
        # shows is where it was created (the stream's first sequence then), not a delivery. Reading from the
        # stream's start, every sequence before the stream's first now was accepted and gone before it had
        # any: counted like any other discard, once (the ledger), and not again once it has delivered.
        fresh = from_the_start(consumer) and not (consumer.delivered and consumer.delivered.consumer_seq)
        since = 0 if fresh else delivered
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
        if first <= since + 1:
            return
        if not self._exact and not (waiting and before is not False):
            return  # nothing of ours waiting now and at the check before: the gap holds other subjects
        await self._discarded(since + 1, first - 1, int(stream.state.last_seq or 0), fresh=fresh)

    async def follow(self, msgs: list[Msg]) -> None:
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
                log.debug("recording deliveries of %s failed: %s", self.durable, exc)
                return
            if between:
                await self._count(between)

    async def _discarded(self, lo: int, hi: int, last_seq: int | None, *, fresh: bool = False) -> None:
        """Count and say the part of sequences `lo..hi`, gone unread, that no worker of the durable has
        reported yet. `fresh`: the durable has delivered nothing yet (they went before it had any)."""
        assert self._ledger is not None
        new = await self._ledger.claim(lo, hi, last_seq)
        if new and fresh:
            self._first_start(new)
        await self._count(new, say=not fresh)

    async def _count(self, new: list[tuple[int, int]], *, say: bool = True) -> None:
        """Count and say sequence ranges `new`, gone unread, reported by this worker (`say`: in the
        WARNING of discards, at most one a minute; else said already)."""
        if not new:
            return
        gone = sum(b - a + 1 for a, b in new)
        self._counted(gone)
        if not say:
            return
        self._discard_quiet.append((gone, min(a for a, _ in new), max(b for _, b in new)))
        if time.monotonic() - self._discard_warned >= DISCARD_WARNING_SECONDS:
            self.say()

    def _first_start(self, new: list[tuple[int, int]]) -> None:
        """The WARNING for messages gone before the durable had any (once in its life: the ledger)."""
        self._warn(
            sum(b - a + 1 for a, b in new),
            min(a for a, _ in new),
            max(b for _, b in new),
            "any (its first start: the stream accepted them before the durable existed or fetched, and its "
            "limits, max_bytes {max_bytes}, max_age {max_age} s, dropped them)",
        )

    def say(self) -> None:
        if not self._discard_quiet:
            return
        gone = sum(n for n, _, _ in self._discard_quiet)
        lo, hi = self._discard_quiet[0][1], self._discard_quiet[-1][2]
        times = len(self._discard_quiet)
        self._discard_quiet = []
        self._discard_warned = time.monotonic()
        self._warn(
            gone,
            lo,
            hi,
            "them: the stream was at its limits (max_bytes {max_bytes}, max_age {max_age} s) while this "
            "durable lagged",
            "" if times == 1 else f", in {times} discards over the last minute",
        )

    def _warn(self, gone: int, lo: int, hi: int, had: str, times: str = "") -> None:
        """The WARNING of a discard: `had` says what the durable never had and why (with the stream's
        `{max_bytes}` and `{max_age}`), `times` how many discards it sums."""
        max_bytes, max_age = self._limits
        log.warning(
            "stream %s discarded %s%d message%s (sequences %d..%d%s) before durable %s had %s; lost to it%s "
            "(counted in hpcbus_discarded_unread)",
            self.stream,
            "" if self._exact else "up to ",
            gone,
            "" if gone == 1 else "s",
            lo,
            hi,
            times,
            self.durable,
            had.format(max_bytes=max_bytes, max_age=max_age),
            ""
            if self._exact
            else "; the stream also holds subjects this durable does not read, so some were not its",
        )
