"""What InfluxDB refuses as a whole (a 4xx that is no partial write, after its attempts) against a real
InfluxDB 1.x and nats-server: every message of the batch is dead-lettered once, with the line problems `take`
found in it, and none of them is counted delivered."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from hpcbus.bus import deadletter_stream, ensure_stream, telemetry_stream
from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import make_writer
from hpcbus.retry import Stopping
from hpcbus.runner import Runner, RunnerSettings
from hpcbus.schemas import subjects
from tests.consumer_helpers import stream_messages, wait_for_async
from tests.services import InfluxDB, NatsServer

pytestmark = pytest.mark.services


async def test_a_batch_influxdb_refuses_is_dead_lettered_once_per_message_and_not_delivered(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str
) -> None:
    # InfluxDB refuses every write without a database name (HTTP 400 "database is required"): a refusal of
    # the request as a whole, whatever its lines: permanent (`hpcbus.permanent.outcome`), so each message is
    # delivered alone and dead-lettered with the reason.
    settings = InfluxSettings(url=influxdb.url, db="", max_retry_wait=0.05)
    writer = make_writer(settings)
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        stream = telemetry_stream(cluster)
        await ensure_stream(js, stream)
        await ensure_stream(js, deadletter_stream(cluster))
        metrics = subjects.metrics(cluster)
        await js.publish(metrics, b"m,hostname=n1,type=node value=1 1700000000\n")
        await js.publish(
            metrics, b"m,hostname=n2,type=node value=2 1700000000\nnot a line\n"
        )  # refused in part
        sink = InfluxSink(nc, writer, settings, cluster, "i")
        delivery = RunnerSettings(durable="i", flush_seconds=0.2, stats_seconds=3600.0)
        stopping = Stopping(2.0)
        runner = Runner(nc, delivery, stream.name, [metrics], sink, stopping)
        task = asyncio.create_task(runner.run())
        try:
            await wait_for_async(lambda: sink.counters.deadlettered >= 2, 30, lambda: f"{sink.counters}")
        finally:
            stopping.set()
            await task
    finally:
        await nc.close()
        await writer.close()
    c = sink.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered, c.undeliverable_messages) == (
        2,
        0,
        1,
        2,
        2,
    ), c
    dead = {
        m.data: json.loads((m.headers or {})["Hpcbus-Problems"])
        for m in await stream_messages(nats_server.url, deadletter_stream(cluster).name)
    }
    assert len(dead) == 2  # one dead letter per message, none dropped as a duplicate
    both = [p["reason"] for p in dead[b"m,hostname=n2,type=node value=2 1700000000\nnot a line\n"]]
    assert "InfluxDB refused the batch" in both[0] and len(both) == 2  # the line problem went with it
    (only,) = dead[b"m,hostname=n1,type=node value=1 1700000000\n"]
    assert "InfluxDB refused the batch" in only["reason"]
