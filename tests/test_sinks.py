"""The sink runtime (`hpcbus.sinks`) against a real nats-server: what every consumer command now gets from one
call to `serve` instead of writing it itself: the service and its streams, a runner per feed, a sink's
`start` before its first message, its ticker while it runs, and on the stop the last delivery, then `close`,
with the counters said in the runtime's summary line and published as `hpcbus_<counter>` self-telemetry,
once, after the close (which counts too); retries in a tick counted by the runtime."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from hpcbus.bus import StreamSpec, deadletter_stream, stream_name, telemetry_stream
from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.consumers.sonar.to_sonar import ToSonarSink
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
from tests.test_consume_sonar_unit import sample_messages

pytestmark = pytest.mark.services


class TickCounters(Counters):
    ticks: int = 0
    closes: int = 0


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

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        assert isinstance(batch, list)
        self.delivered += batch

    async def start(self, stopping: Stopping) -> None:
        self.life.append("start")

    async def tick(self, stopping: Stopping) -> None:
        self.counters.ticks += 1
        if self.counters.ticks == 2:
            raise RuntimeError("a tick that fails")  # transient: the runtime retries it

    async def close(self, stopping: Stopping) -> None:
        self.life.append(f"close after {len(self.delivered)} delivered")
        self.counters.closes += 1  # counted at the close: the final summary and telemetry must say it


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
        stopping.set()  # also when a wait above failed: the runtime stops, the test ends
    assert await asyncio.wait_for(serving, 5) == 0
    (sink,) = sinks
    assert sink.life == ["start", "close after 3 delivered"]
    c = sink.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered, c.pending) == (3, 3, 0, 0, 0)
    # the failing tick: retried by the runtime (`Runner.attempt`), said once, counted in `retried`
    troubles = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert troubles == ["t: delivery: RuntimeError: a tick that fails; retrying"], troubles
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("t: received")]
    (last,) = said  # the final summary, once, after the close
    assert last.startswith("t: received 3, delivered 3, retried 1, rejected 0, dead-lettered 0, pending 0")
    assert last.endswith(f"; ticks {c.ticks}, closes 1")
    # the self-telemetry: the same counters as hpcbus_<counter> lines on <cluster>.telemetry
    published = await stream_messages(nats_server.url, stream.name, subjects.telemetry(cluster))
    lines = [line for m in published for line in parse_payload(m.data or b"", now=0).lines]
    last = {line.measurement: line.fields["value"] for line in lines}
    expected = {f"hpcbus_{k}": v for k, v in msgspec.structs.asdict(c).items()}
    assert last == expected and all(line.tags["stype-id"] == "t" for line in lines)
    assert [line.fields["value"] for line in lines if line.measurement == "hpcbus_closes"] == [1]


async def _serve_to_sonar(
    nats_server: NatsServer, cluster: str, stream: StreamSpec
) -> tuple[asyncio.Task[int], Stopping, list[ToSonarSink]]:
    """`serve` with one LP -> Sonar sink (grace 30 s: what it holds waits until the stop)."""
    bus = BusSettings(nats=[nats_server.url], cluster=cluster)
    delivery = RunnerSettings(durable="s-to-sonar", flush_seconds=0.1, stats_seconds=3600.0)
    sinks: list[ToSonarSink] = []

    async def feeds(nc: nats.NATS) -> list[Feed]:
        outlet = Outlet(nc, cluster, jetstream=True)
        sink = ToSonarSink(outlet, "s-to-sonar", SonarSettings(grace=30.0), None, acks=True)
        sinks.append(sink)
        return [Feed(stream.name, subjects.wildcards(cluster, "metrics", "events"), delivery, sink)]

    stopping = Stopping(1.0)
    serving = asyncio.create_task(
        serve(bus, "s", [stream, deadletter_stream(cluster)], feeds, stopping=stopping)
    )
    return serving, stopping, sinks


async def test_the_final_summary_says_what_close_did_and_a_dead_lettered_message_is_not_delivered(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """LP -> Sonar: an all-bad message is dead-lettered and acknowledged, not counted delivered; the stop
    returns the message whose envelope still waits (`close`), and the final summary and telemetry, said
    once after the close, count it."""
    caplog.set_level(logging.INFO)
    stream = telemetry_stream(cluster)
    serving, stopping, sinks = await _serve_to_sonar(nats_server, cluster, stream)
    _, (skeleton, _metrics) = sample_messages(cluster)
    nc = await nats.connect(nats_server.url)
    try:
        await wait_for_async(lambda: bool(sinks), 20, "the sink built")
        js = nc.jetstream()
        await js.publish(subjects.metrics(cluster), b"garbage here\n")
        await js.publish(skeleton.subject, skeleton.data)  # its sample waits for lines that never come
        (sink,) = sinks
        await wait_for_async(
            lambda: sink.counters.deadlettered == 1 and sink.translator.waiting, 20, "bad one out, one held"
        )
    finally:
        await nc.close()
        stopping.set()  # also when a wait above failed: the runtime stops, the test ends
    assert await asyncio.wait_for(serving, 10) == 0
    c = sink.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered, c.returned_messages) == (2, 0, 1, 1, 1), c
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("s-to-sonar: received")]
    (last,) = said
    assert last.startswith("s-to-sonar: received 2, delivered 0, retried 0, rejected 1, dead-lettered 1")
    assert "returned messages 1" in last
    published = await stream_messages(nats_server.url, stream.name, subjects.telemetry(cluster))
    lines = [line for m in published for line in parse_payload(m.data or b"", now=0).lines]
    values = {line.measurement: line.fields["value"] for line in lines}
    assert (values["hpcbus_delivered"], values["hpcbus_returned_messages"]) == (0, 1)
    assert len(await stream_messages(nats_server.url, deadletter_stream(cluster).name)) == 1


async def test_an_envelope_no_stream_takes_is_dead_lettered_not_retried_forever(
    nats_server: NatsServer, cluster: str
) -> None:
    """An envelope JetStream can never take (no stream holds `<cluster>.sonar.>`: nats-py's
    `NoStreamResponseError`, permanent in `hpcbus.permanent.outcome`) is dead-lettered with the reason, not
    retried for ever, and its input is acknowledged once the dead letter is stored."""
    stream = StreamSpec(
        name=stream_name("HPCBUS", cluster),
        subjects=subjects.wildcards(cluster, "metrics", subjects.TELEMETRY, "events", "log"),
    )
    serving, stopping, sinks = await _serve_to_sonar(nats_server, cluster, stream)
    _, msgs = sample_messages(cluster)
    nc = await nats.connect(nats_server.url)
    try:
        await wait_for_async(lambda: bool(sinks), 20, "the sink built")
        for msg in msgs:  # a complete sample: its envelope is published at once, and refused
            await nc.jetstream().publish(msg.subject, msg.data)
        await wait_for_async(lambda: sinks[0].counters.undeliverable_envelopes == 1, 30, "dead-lettered")
    finally:
        await nc.close()
        stopping.set()  # also when a wait above failed: the runtime stops, the test ends
    assert await asyncio.wait_for(serving, 10) == 0
    c = sinks[0].counters
    assert c.envelopes == 0 and c.retried == 0 and c.undeliverable_envelopes == 1
    (dead,) = await stream_messages(nats_server.url, deadletter_stream(cluster).name)
    assert dead.subject == subjects.deadletter(cluster, "sonar")
    assert "can never be published" in (dead.headers or {})["Hpcbus-Problems"]
