"""Reading a stretch of a stream without touching any durable: an ephemeral pull consumer that acknowledges
nothing (`AckPolicy.NONE`), removed by the server seconds after the last pull (`inactive_threshold`).

Why a pull consumer and not an ordered push one: it needs no flow-control replies, so the read-only monitor
identity (`hpcbus deploy nats-auth`) needs only `CONSUMER.CREATE`, `CONSUMER.INFO` and `MSG.NEXT` on the
stream, and can never acknowledge on a worker's durable."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

BATCH = 1000
ATTEMPTS = 4
QUICK = 1.0
"""Seconds an ephemeral reader has to answer before another is made (the last one gets the full timeout)."""


async def _reader(
    js: JetStreamContext, stream: str, subject: str, config: ConsumerConfig, timeout: float
) -> tuple[JetStreamContext.PullSubscription, int]:
    """An ephemeral reader and what it has to read. On a cluster the server places each ephemeral consumer
    on one member of the stream's group, and for a while after a member dies it may still place one there
    (then it never answers): a reader that does not answer is given up and another one made."""
    for attempt in range(1, ATTEMPTS + 1):
        psub = None
        wait = timeout if attempt == ATTEMPTS else min(timeout, QUICK)
        try:
            config.name = None
            psub = await asyncio.wait_for(js.pull_subscribe(subject, stream=stream, config=config), wait)
            info = await asyncio.wait_for(psub.consumer_info(), wait)
            return psub, int(info.num_pending or 0)
        except TimeoutError:
            if psub is not None:
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


async def read_since(
    js: JetStreamContext,
    stream: str,
    subject: str,
    since: float,
    *,
    limit: int,
    timeout: float,
    span: float = 0.0,
) -> AsyncIterator[Msg]:
    """The messages on `subject` stored at or after `since` (epoch seconds), oldest first, at most `limit`
    of them; with `span`, only those stored within `span` seconds after `since` (a probe of one stretch).
    Ends at what the stream held when it began: a busy stream never keeps it reading."""
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_TIME,
        opt_start_time=dt.datetime.fromtimestamp(since, dt.UTC),
        ack_policy=AckPolicy.NONE,
        inactive_threshold=5.0,
    )
    psub, pending = await _reader(js, stream, subject, config, timeout)
    try:
        left = min(limit, pending)
        stop_at = since + span if span else time.time() + 3600.0
        while left > 0:
            try:
                msgs = await psub.fetch(min(BATCH, left), timeout=timeout)
            except (TimeoutError, NatsTimeout):
                return
            for msg in msgs:
                left -= 1
                if span and msg.metadata.timestamp.timestamp() > stop_at:
                    return
                yield msg
                if msg.metadata.num_pending == 0:
                    return
    finally:
        with contextlib.suppress(Exception):  # a closed connection: the server drops the consumer itself
            await psub.unsubscribe()
