"""A full stream with `[bus] stream_discard = "new"`, against a real nats-server: acknowledged data is never
discarded before the durables have it. Publishing is refused (not acknowledged) while the stream is full, the
producers' outbox keeps its backlog meanwhile, and once the worker has caught up publishing works again."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import APIError, ServiceUnavailableError

from hpcbus.delivery import RunnerSettings
from hpcbus.outbox import Outbox, OutboxSettings
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import Runner
from hpcbus.settings import BusSettings
from hpcbus.streams import deadletter_stream, ensure_stream, for_bus, telemetry_stream
from tests.consumer_helpers import wait_for_async
from tests.services import NatsServer
from tests.test_runner import DoubleSink

pytestmark = pytest.mark.services

SETTINGS = RunnerSettings(durable="w", fetch_batch=50, flush_seconds=0.2, stats_seconds=3600.0)
PAYLOAD = b"m,hostname=n1 value=1 1 " + b"x" * 1000 + b"\n"


def test_stream_discard_is_a_bus_setting_and_dead_letters_stay_kept() -> None:
    bus = BusSettings(stream_discard="new")
    assert for_bus(telemetry_stream("c"), bus).discard == "new"
    assert for_bus(deadletter_stream("c"), bus).discard == "old"  # interest would drop them at once
    assert for_bus(telemetry_stream("c"), BusSettings()).discard == "old"


async def _stream(nc: NATS, cluster: str) -> str:
    spec = for_bus(telemetry_stream(cluster, max_bytes=64 * 1024), BusSettings(stream_discard="new"))
    js = nc.jetstream()
    await ensure_stream(js, spec)
    await ensure_stream(js, deadletter_stream(cluster))
    info = await js.stream_info(spec.name)
    assert (str(info.config.retention), str(info.config.discard)) == ("interest", "new")
    return spec.name


async def _durable(nc: NATS, stream: str) -> bool:
    try:
        await nc.jetstream().consumer_info(stream, SETTINGS.durable)
    except Exception:
        return False
    return True


async def test_a_full_stream_refuses_instead_of_discarding_and_takes_again_once_the_worker_caught_up(
    nats_server: NatsServer, cluster: str
) -> None:
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        name = await _stream(nc, cluster)
        # The worker's durable exists (created by its first start), but no worker reads now.
        stopping = Stopping(2.0)
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        runner = Runner(nc, SETTINGS, name, [subject], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(lambda: _durable(nc, name), 10, "the durable created")
        stopping.set()
        await task
        acked = 0
        refusal: APIError | None = None
        for _ in range(200):
            try:
                await js.publish(subject, PAYLOAD)
                acked += 1
            except APIError as exc:
                refusal = exc
                break
        # What nats-py raises for a full `discard: new` stream (the gateway maps it to 503 + Retry-After).
        assert isinstance(refusal, ServiceUnavailableError), refusal
        assert (refusal.code, refusal.err_code, refusal.description) == (503, 10077, "maximum bytes exceeded")
        assert 0 < acked < 200
        assert (await js.stream_info(name)).state.messages == acked  # nothing acknowledged was dropped

        # A producer's outbox holds its backlog while the stream is full ...
        outbox = Outbox(OutboxSettings(publish_timeout=1.0))
        for i in range(20):
            outbox.put(subject, PAYLOAD, f"backlog-{i}")
        sending = asyncio.create_task(outbox.run(nc))
        await wait_for_async(
            lambda: outbox.counters.retried >= 2, 20, "the outbox retrying against the full stream"
        )
        assert len(outbox) == 20 and outbox.counters.delivered == 0 and outbox.dropped == 0
        # ... and once the worker has caught up (its acks free the stream), everything goes out.
        stopping = Stopping(2.0)
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        runner = Runner(nc, SETTINGS, name, [subject], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(lambda: len(sink.delivered) == acked + 20, 30, lambda: f"{len(sink.delivered)}")
        assert await outbox.flush(5)
        sending.cancel()
        await js.publish(subject, PAYLOAD)  # the stream takes new messages again
        await wait_for_async(lambda: len(sink.delivered) == acked + 21, 20, "the new message delivered")
        stopping.set()
        await task
        assert runner.counters.discarded_unread == 0
    finally:
        await nc.close()
