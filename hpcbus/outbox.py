"""What a producer has measured but JetStream has not yet acknowledged, sent in order.

A producer must never lose a sample it took, nor block its sampling loop on the network. So `put` returns at
once; `run` publishes the oldest message with `js.publish` (which waits for the stream's PubAck) and only then
drops it; on any failure it retries the same message after a short back-off, so order is kept. The
`Nats-Msg-Id` header makes a re-send after a lost ack harmless (the stream drops duplicates).

Memory is bounded by message count and bytes; at the bound the *oldest* messages go (the newest data is the
most useful), and that is logged with a count. With `spill_dir`, messages also live on disk until acked, so
a restarted producer sends what the previous run could not.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path

import msgspec

from hpcbus.statefile import write_atomically

log = logging.getLogger("hpcbus.outbox")


class OutboxSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_messages: int = 10_000
    """Messages kept while NATS is unreachable (at 30 s per sample, 10,000 is about 3.5 days)."""
    max_bytes: int = 256 * 2**20
    """Bytes kept while NATS is unreachable."""
    spill_dir: str = ""
    """Directory that keeps unacknowledged messages across restarts ("" = memory only)."""
    publish_timeout: float = 5.0
    """Seconds to wait for a PubAck before trying again."""


class Message(msgspec.Struct, array_like=True):
    subject: str
    payload: bytes
    msg_id: str
    seq: int = 0


class Outbox:
    def __init__(self, settings: OutboxSettings) -> None:
        self.settings = settings
        self._queue: collections.deque[Message] = collections.deque()
        self._bytes = 0
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self.sent = 0
        self.dropped = 0
        self.retried = 0
        self._spill = Path(settings.spill_dir) if settings.spill_dir else None
        if self._spill:
            self._spill.mkdir(parents=True, exist_ok=True)
            self._load_spilled()

    def __len__(self) -> int:
        return len(self._queue)

    def _load_spilled(self) -> None:
        assert self._spill is not None
        files = sorted(self._spill.glob("*.msg"), key=lambda p: int(p.stem))
        decoder = msgspec.msgpack.Decoder(Message)
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

    def put(self, subject: str, payload: bytes, msg_id: str) -> None:
        self._seq += 1
        msg = Message(subject, payload, msg_id, self._seq)
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
            self.dropped += dropped
            log.warning(
                "outbox full (%d messages, %d bytes): dropped the %d oldest; %d dropped so far",
                len(self._queue),
                self._bytes,
                dropped,
                self.dropped,
            )
        self._empty.clear()
        self._wakeup.set()

    def _forget(self, msg: Message) -> None:
        self._bytes -= len(msg.payload)
        if self._spill:
            (self._spill / f"{msg.seq}.msg").unlink(missing_ok=True)

    async def run(self, js: object) -> None:
        """Publish forever, oldest first; cancel to stop (what is unsent stays queued / spilled)."""
        backoff = 0.5
        last_error = ""
        while True:
            if not self._queue:
                self._empty.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            msg = self._queue[0]
            try:
                await js.publish(  # type: ignore[attr-defined]
                    msg.subject,
                    msg.payload,
                    timeout=self.settings.publish_timeout,
                    headers={"Nats-Msg-Id": msg.msg_id},
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: keep the message, try again
                self.retried += 1
                text = f"{type(exc).__name__}: {exc}".rstrip(": ")
                if text != last_error:
                    log.warning(
                        "outbox: publish to %s failed (%s); %d queued, retrying", msg.subject, text, len(self)
                    )
                    last_error = text
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if last_error:
                log.info("outbox: publishing again; %d queued", len(self._queue))
                last_error = ""
            backoff = 0.5
            if self._queue and self._queue[0] is msg:
                self._queue.popleft()
                self._forget(msg)
            self.sent += 1

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued is acknowledged; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._empty.wait(), timeout)
        except TimeoutError:
            return False
        return True
