"""What a producer has measured but JetStream has not yet acknowledged, sent in order.

A producer must never lose a sample it took, nor block its sampling loop on the network. So `put` returns at
once; `run` publishes the oldest message with a JetStream publish (which waits for the stream's PubAck) and
only then drops it; on any failure it retries the same message (`hpcbus.retry`), so order is kept. The
`Nats-Msg-Id` header makes a re-send after a lost ack harmless (the stream drops duplicates).

Memory is bounded by message count and bytes; at the bound the *oldest* messages go (the newest data is the
most useful), and that is logged with a count. With `spill_dir`, messages also live on disk until acked, so
a restarted producer sends what the previous run could not.

A message larger than the server's `max_payload` (queued before the server was known, or a server with a
smaller limit) is cut at line ends, each piece with the id of its own content; a single line longer than the
limit cannot be sent at all and is dropped with an error (counted in `oversized`) instead of blocking the
queue forever.

Subjects no stream captures (`core_subjects`: cc-backend's job-event and node-state subjects, which it reads
with core NATS) take the same queue, order, bound and spill directory, but go out with a core publish
followed by a round trip to the server (`hpcbus.bus.core_publish`): JetStream would answer "no responders"
there forever. That is as sure as core NATS gets: the server has the message; a subscriber that is away
misses it, as it would miss any producer's.

With `interest` (`hpcbus.interest.Interest`, the streams the producer publishes into), a message whose
stream keeps messages only for its durables (`stream_discard = "new"`) is not published while that stream
has none: JetStream would acknowledge it and keep nothing. It stays at the head of the queue, not counted
sent, and is tried again like any refused publish (one WARNING for the episode) until a worker has created
its durable.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES, TooLarge, core_publish, js_publish
from hpcbus.counters import Counters
from hpcbus.interest import Interest
from hpcbus.keys import PUBLISH_TIMEOUT, PublishTimeout
from hpcbus.options import Section
from hpcbus.retry import Trouble, retry
from hpcbus.schemas.translate import msg_id as content_id
from hpcbus.statefile import write_atomically

log = logging.getLogger("hpcbus.outbox")


class OutboxCounters(Counters):
    """A source's counters (`hpcbus.counters`, in messages): `received` handed to the outbox, `delivered`
    acknowledged by JetStream (or sent on core NATS), `retried` publish attempts tried again, `pending` queued
    now; and its own. received = delivered + dropped + pending (a message cut because it was too large counts
    once, as delivered, and its lines that could not go at all in `oversized`)."""

    dropped: int = 0
    """Messages dropped because the outbox was full (the oldest first)."""
    oversized: int = 0
    """Lines dropped because a single line exceeded the server's max_payload."""


class OutboxSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A producer's backlog while NATS is unreachable: every producer's outbox keys, declared once."""

    max_messages: int = 10_000
    """Messages kept while NATS is unreachable, the oldest dropped beyond it (a node agent's 10,000 samples
    at 30 s are about 3.5 days)."""
    max_bytes: int = 256 * 2**20
    """Bytes kept while NATS is unreachable."""
    spill_dir: str = ""
    """Directory that keeps unacknowledged messages across restarts ("" = memory only)."""
    publish_timeout: PublishTimeout = PUBLISH_TIMEOUT


def outbox_section(table: str) -> Section[OutboxSettings]:
    """The `[table]` a producer reads its outbox settings from (`[outbox]`: the node agent and `simulate`;
    `[slurm_outbox]`): the keys are declared once, here, and the Slurm producer, which runs beside node
    agents' tables in one host file, has its own table and so its own spill directory."""
    return Section(table, OutboxSettings, metavars={"spill_dir": "DIR", "max_bytes": "BYTES"})


class Queued(msgspec.Struct, array_like=True):
    """A queued message and its place in the queue (`seq` names its spill file)."""

    subject: str
    payload: bytes
    msg_id: str
    seq: int = 0


def split_lines(payload: bytes, limit: int) -> list[bytes]:
    """A payload cut at line ends into pieces of at most `limit` bytes; a single longer line is its own
    piece (the caller decides what to do with it)."""
    pieces: list[bytes] = []
    buf: list[bytes] = []
    size = 0
    for line in payload.split(b"\n"):
        if not line:
            continue
        line += b"\n"
        if buf and size + len(line) > limit:
            pieces.append(b"".join(buf))
            buf, size = [], 0
        buf.append(line)
        size += len(line)
    if buf:
        pieces.append(b"".join(buf))
    return pieces


class Outbox:
    """`on_progress()` is called whenever the oldest queued message left the queue (acknowledged or
    dropped): `done_through` then tells how far the queue got, which is what producers commit on."""

    def __init__(
        self,
        settings: OutboxSettings,
        on_progress: Callable[[], None] | None = None,
        *,
        core_subjects: Iterable[str] = (),
        interest: Interest | None = None,
    ) -> None:
        self.settings = settings
        self.on_progress = on_progress
        self.core_subjects = frozenset(core_subjects)
        """Subjects published with core NATS (no stream captures them); all others with JetStream."""
        self.interest = interest
        """Asked before each JetStream publish whether the stream would keep it (None: not asked)."""
        self._queue: collections.deque[Queued] = collections.deque()
        self._bytes = 0
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self.counters = OutboxCounters()
        """The standard counters of `hpcbus.counters` (the one vocabulary of sources and sinks) and its own."""
        self.trouble = Trouble(log, "outbox: publish")
        self._spill = Path(settings.spill_dir) if settings.spill_dir else None
        if self._spill:
            self._spill.mkdir(parents=True, exist_ok=True)
            self._load_spilled()

    @property
    def dropped(self) -> int:
        """Messages dropped by a full outbox (`counters.dropped`): what a node's sample reports."""
        return self.counters.dropped

    def gauges(self) -> None:
        """Bring `pending` up to date before a report."""
        self.counters.pending = len(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest message put."""
        return self._seq

    @property
    def done_through(self) -> int:
        """Every message with a sequence number up to this one has left the queue."""
        return self._queue[0].seq - 1 if self._queue else self._seq

    def _load_spilled(self) -> None:
        assert self._spill is not None
        files = sorted(self._spill.glob("*.msg"), key=lambda p: int(p.stem))
        decoder = msgspec.msgpack.Decoder(Queued)
        for path in files:
            try:
                msg = decoder.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError) as exc:
                log.warning("outbox: %s unreadable (%s); removed", path, exc)
                path.unlink(missing_ok=True)
                continue
            self._queue.append(msg)
            self._bytes += len(msg.payload)
            self._seq = max(self._seq, msg.seq)
        if files:
            log.info("outbox: %d unsent messages from %s", len(self._queue), self._spill)
            self._wakeup.set()
            self._empty.clear()

    def put(self, subject: str, payload: bytes, msg_id: str) -> int:
        """Queue a message; returns its sequence number."""
        self._seq += 1
        self.counters.received += 1
        msg = Queued(subject, payload, msg_id, self._seq)
        if self._spill:
            write_atomically(self._spill / f"{msg.seq}.msg", msgspec.msgpack.encode(msg), sync=False)
        self._queue.append(msg)
        self._bytes += len(payload)
        dropped = 0
        while len(self._queue) > 1 and (
            len(self._queue) > self.settings.max_messages or self._bytes > self.settings.max_bytes
        ):
            self._forget(self._queue.popleft())
            dropped += 1
        if dropped:
            self.counters.dropped += dropped
            log.warning(
                "outbox full (%d messages, %d bytes): dropped the %d oldest; %d dropped so far",
                len(self._queue),
                self._bytes,
                dropped,
                self.counters.dropped,
            )
            if self.on_progress is not None:
                self.on_progress()
        self._empty.clear()
        self._wakeup.set()
        return msg.seq

    def _forget(self, msg: Queued) -> None:
        self._bytes -= len(msg.payload)
        if self._spill:
            (self._spill / f"{msg.seq}.msg").unlink(missing_ok=True)

    async def run(self, nc: NATS) -> None:
        """Publish forever, oldest first; cancel to stop (what is unsent stays queued / spilled)."""
        while True:
            if not self._queue:
                self._empty.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            msg = self._queue[0]

            async def attempt(msg: Queued = msg) -> None:
                await self._publish(nc, msg)

            async def count_retry() -> None:
                self.counters.retried += 1

            await retry(attempt, trouble=self.trouble, on_retry=count_retry)
            if self._queue and self._queue[0] is msg:
                self._queue.popleft()
                self._forget(msg)
            self.counters.delivered += 1
            if self.on_progress is not None:
                self.on_progress()

    async def _publish(self, nc: NATS, msg: Queued) -> None:
        headers = {"Nats-Msg-Id": msg.msg_id}
        timeout = self.settings.publish_timeout
        core = msg.subject in self.core_subjects
        if not core and self.interest is not None:
            await self.interest.check(nc.jetstream(), msg.subject)  # NoDurable: kept, tried again
        try:
            if core:
                await core_publish(nc, msg.subject, msg.payload, timeout)
            else:
                await js_publish(nc, msg.subject, msg.payload, headers, timeout)
            return
        except TooLarge:
            pass
        limit = int(nc.max_payload or DEFAULT_MAX_PAYLOAD) - (0 if core else ID_HEADER_BYTES)
        for piece in split_lines(msg.payload, limit):
            if len(piece) > limit:
                self.counters.oversized += 1
                log.error(
                    "dropped a %d-byte line for %s: longer than the server's max_payload (%d); %d so far",
                    len(piece),
                    msg.subject,
                    nc.max_payload,
                    self.counters.oversized,
                )
                continue
            if core:
                await core_publish(nc, msg.subject, piece, timeout)
            else:
                await js_publish(
                    nc, msg.subject, piece, {"Nats-Msg-Id": content_id(msg.subject, piece)}, timeout
                )

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued is acknowledged; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._empty.wait(), max(0.0, timeout))
        except TimeoutError:
            return False
        return True
