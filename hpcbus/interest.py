"""Whether a stream will keep what it acknowledges, asked before publishing (the entries: the gateway, the
producers' outbox, `hpcbus pub`).

A stream with `interest` retention (`[bus] stream_discard = "new"`) keeps a message only for the durables
that exist when it is stored. Before the first worker created its durable there are none, and JetStream
acknowledges every publish and keeps nothing: measured on nats-server 2.15, the PubAck is the same
(`stream`, `seq`) as for a kept message, and the stream's state afterwards is `messages 0, first_seq =
last_seq + 1`. The acknowledgement cannot tell, so an entry that waits for it would answer 204 for data
already gone. What can tell is the stream's `state.consumer_count` (one `STREAM.INFO` request, which every
identity `hpcbus deploy nats-auth` makes for a publisher may send for its own stream): with none, the
entry does not publish (`NoDurable`): the gateway answers 503 with `Retry-After`, the outbox keeps the
message and retries, `hpcbus pub` says so and exits 1.

The answer is kept for a while, so that asking costs next to nothing per publish: `refresh` seconds while
the stream has durables (a durable removed later loses what it alone had not acknowledged anyway),
`EMPTY_SECONDS` while it has none (a worker that starts is noticed at the next try), `LIMITS_SECONDS` for a
stream with `limits` retention (the default `stream_discard = "old"`: its retention changes only when the
stream is recreated). Concurrent publishes to one stream share one request. A stream that cannot be asked
(missing, no answer, no permission) is not held back here: the publish itself then says what is wrong.

Only "no durable at all" is refused: a durable's filter subjects are not in `STREAM.INFO` (listing the
consumers needs rights the publishers do not have), so a subject that no existing durable reads is still
acknowledged and dropped (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from nats.js import JetStreamContext

from hpcbus.discards import covers
from hpcbus.retry import describe
from hpcbus.streams import StreamSpec, interest_retention

log = logging.getLogger("hpcbus.interest")

REFRESH_SECONDS = 5.0
"""Seconds an `interest` stream that had durables is taken to still have them (the gateway's default)."""

EMPTY_SECONDS = 1.0
"""Seconds an `interest` stream without durables is taken to still have none: the publisher is waiting."""

LIMITS_SECONDS = 600.0
"""Seconds a `limits` stream (which keeps what it acknowledges) is not asked again."""


class NoDurable(Exception):
    """A publish held back: its stream keeps messages only for its durables and has none yet."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"stream {stream} keeps a message only for its durables (interest retention, stream_discard = "
            '"new") and has none yet, so JetStream would acknowledge it and keep nothing; the workers '
            "(hpcbus consume ...) create their durables when they start"
        )
        self.stream = stream


class Interest:
    """Asks, for the streams `streams` (found by subject) or any stream named, whether publishing now would be
    kept (see the module docstring); `check` raises `NoDurable` where it would not."""

    def __init__(self, streams: Sequence[StreamSpec] = (), *, refresh: float = REFRESH_SECONDS) -> None:
        self._streams = [(spec.name, list(spec.subjects)) for spec in streams]
        self.refresh = refresh
        self._known: dict[str, tuple[float, bool]] = {}
        """stream -> (monotonic time the answer expires, the stream keeps nothing)."""
        self._asking: dict[str, asyncio.Future[bool]] = {}
        """stream -> the request under way, shared by every publish that needs it meanwhile."""

    def stream_of(self, subject: str) -> str | None:
        """The stream of `streams` that takes `subject` (None: none of them, so nothing is checked)."""
        return next((name for name, patterns in self._streams if covers(patterns, subject)), None)

    async def check(self, js: JetStreamContext, subject: str) -> None:
        """`NoDurable` when the stream that takes `subject` would acknowledge it and keep nothing."""
        stream = self.stream_of(subject)
        if stream is not None:
            await self.check_stream(js, stream)

    async def check_stream(self, js: JetStreamContext, stream: str) -> None:
        """`NoDurable` when stream `stream` would acknowledge a message and keep nothing."""
        known = self._known.get(stream)
        if known is not None and time.monotonic() < known[0]:
            empty = known[1]
        else:
            asking = self._asking.get(stream)
            if asking is None:
                asking = self._asking[stream] = asyncio.ensure_future(self._ask(js, stream))
                asking.add_done_callback(lambda _: self._asking.pop(stream, None))
            empty = await asyncio.shield(asking)
        if empty:
            raise NoDurable(stream)

    async def _ask(self, js: JetStreamContext, stream: str) -> bool:
        try:
            info = await js.stream_info(stream)
        except Exception as exc:  # the publish that follows says what is wrong (missing stream, no answer)
            log.debug("stream %s: not asked whether it has durables (%s)", stream, describe(exc))
            self._known[stream] = (time.monotonic() + self.refresh, False)
            return False
        interest = interest_retention(info.config)
        empty = interest and not info.state.consumer_count
        keep = EMPTY_SECONDS if empty else self.refresh if interest else LIMITS_SECONDS
        self._known[stream] = (time.monotonic() + keep, empty)
        return empty
