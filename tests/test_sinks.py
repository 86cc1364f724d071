"""The sink runtime (`hpcbus.sinks`) against a real nats-server: what every consumer command now gets from one
call to `serve` instead of writing it itself: the service and its streams, a runner per feed, a sink's
`start` before its first message, its ticker while it runs, and on the stop the last delivery, then `close`,
with the counters said in the runtime's summary line and published as `hpcbus_<counter>` self-telemetry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from hpcbus.bus import deadletter_stream, telemetry_stream
from hpcbus.counters import Counters
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import RunnerSettings, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.settings import BusSettings
from hpcbus.sinks import Feed, serve
from tests.consumer_helpers import stream_messages, wait_for_async
from tests.services import NatsServer

pytestmark = pytest.mark.services


class TickCounters(Counters):
    ticks: int = 0


class Ticking(SinkBase):
    """Delivers by keeping the payloads; counts its ticks; records its life."""

    tick_seconds = 0.05

    def __init__(self, outlet: Outlet) -> None:
        self.outlet = outlet
        self.counters = TickCounters()
        self.filling: list[bytes] = []
        self.delivered: list[bytes] = []
        self.life: list[str] = []

    def take(self, msg: Msg) -> int:
        self.filling.append(msg.data)
        return 1

    def cut(self) -> list[bytes]:
        batch, self.filling = self.filling, []
        return batch

    async def deliver(
        self, batch: object, still_working: Callable[[], Awaitable[None]], stopping: Stopping
    ) -> bool:
        assert isinstance(batch, list)
        self.delivered += batch
        return True

    async def start(self, stopping: Stopping) -> None:
        self.life.append("start")

    async def tick(self, stopping: Stopping) -> None:
        self.counters.ticks += 1
        if self.counters.ticks == 2:
            raise RuntimeError("a tick that fails")  # logged; the next one runs

    async def close(self, stopping: Stopping) -> None:
        self.life.append(f"close after {len(self.delivered)} delivered")


async def test_serve_starts_ticks_delivers_closes_and_reports(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bus = BusSettings(nats=[nats_server.url], cluster=cluster)
    stream = telemetry_stream(cluster)
    delivery = RunnerSettings(durable="t", flush_seconds=0.1, stats_seconds=3600.0)
    sinks: list[Ticking] = []

    async def feeds(nc: nats.NATS) -> list[Feed]:
        sink = Ticking(Outlet(nc, cluster, jetstream=True))
        sinks.append(sink)
        return [Feed(stream.name, [subjects.metrics(cluster)], delivery, sink)]

    stopping = Stopping(2.0)
    serving = asyncio.create_task(
        serve(bus, "t", [stream, deadletter_stream(cluster)], feeds, stopping=stopping)
    )
    nc = await nats.connect(nats_server.url)
    try:
        await wait_for_async(lambda: bool(sinks) and sinks[0].counters.ticks >= 3, 20, "three ticks")
        for i in range(3):
            await nc.jetstream().publish(subjects.metrics(cluster), b"m value=%d 1" % i)
        await wait_for_async(lambda: len(sinks[0].delivered) == 3, 20, "three messages delivered")
    finally:
        await nc.close()
    stopping.set()
    assert await asyncio.wait_for(serving, 5) == 0
    (sink,) = sinks
    assert sink.life == ["start", "close after 3 delivered"]
    c = sink.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered, c.pending) == (3, 3, 0, 0, 0)
    assert any("t: step failed" in r.getMessage() for r in caplog.records)  # the failing tick, said
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("t: received")]
    assert said[-1].startswith(
        "t: received 3, delivered 3, retried 0, rejected 0, dead-lettered 0, pending 0"
    )
    assert said[-1].endswith(f"; ticks {c.ticks}")
    # the self-telemetry: the same counters as hpcbus_<counter> lines on <cluster>.telemetry
    published = await stream_messages(nats_server.url, stream.name, subjects.telemetry(cluster))
    lines = [line for m in published for line in parse_payload(m.data or b"", now=0).lines]
    last = {line.measurement: line.fields["value"] for line in lines}
    expected = {f"hpcbus_{k}": v for k, v in msgspec.structs.asdict(c).items()}
    assert last == expected and all(line.tags["stype-id"] == "t" for line in lines)
