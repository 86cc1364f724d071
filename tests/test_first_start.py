"""Issue 29 items 3 and 11, against a real nats-server: nothing acknowledged is lost unseen at first start.

- `stream_discard = "new"` (`interest` retention): while the stream has no durable it acknowledges a publish
  and keeps nothing, so the entries do not publish then: the outbox keeps the message (not sent) and
  `hpcbus pub` refuses with exit 1 (the gateway's 503 is in the fault suite, tests/faults/).
- `discard: old`: a durable created on a stream that already discarded messages counts them
  (`hpcbus_discarded_unread`, one WARNING), once among the workers that start on it together, and not again
  when they start again (the shared ledger)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hpcbus.interest import Interest, NoDurable
from hpcbus.outbox import Outbox, OutboxSettings
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import Runner
from hpcbus.settings import BusSettings
from hpcbus.streams import StreamSpec, ensure_stream, for_bus, stream_name, telemetry_stream
from tests.consumer_helpers import wait_for_async
from tests.services import NatsServer
from tests.test_runner import SETTINGS, DoubleSink, _durable_settled, _streams, publish, small_stream

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]


async def _interest_stream(nc: NATS, cluster: str) -> str:
    """The cluster's telemetry stream as `stream_discard = "new"` creates it, without any durable."""
    spec = for_bus(telemetry_stream(cluster), BusSettings(stream_discard="new"))
    await ensure_stream(nc.jetstream(), spec)
    return spec.name


async def _add_durable(nc: NATS, stream: str, durable: str, subject: str) -> None:
    config = ConsumerConfig(durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT)
    await nc.jetstream().add_consumer(stream, config)


async def test_the_outbox_keeps_what_an_interest_stream_without_durables_would_drop(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hpcbus.outbox")
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        name = await _interest_stream(nc, cluster)
        interest = Interest([telemetry_stream(cluster)])
        assert interest.stream_of(subject) == name and interest.stream_of("elsewhere.metrics") is None
        with pytest.raises(NoDurable, match="has none yet"):
            await interest.check(js, subject)
        outbox = Outbox(OutboxSettings(publish_timeout=1.0), interest=interest)
        payloads = [b"m,hostname=n%d,type=node value=1 1700000000\n" % i for i in range(5)]
        for i, payload in enumerate(payloads):
            outbox.put(subject, payload, f"first-start-{i}")
        sending = asyncio.create_task(outbox.run(nc))
        try:
            await wait_for_async(lambda: outbox.counters.retried >= 2, 20, "the outbox holding its messages")
            assert (len(outbox), outbox.counters.delivered, outbox.dropped) == (5, 0, 0)
            # Nothing was acknowledged and dropped: the stream never took a message (before: 5 acks, 0 kept).
            assert (await js.stream_info(name)).state.last_seq == 0
            warnings = [r.getMessage() for r in caplog.records]
            assert (
                len(warnings) == 1 and f"stream {name} keeps a message only for its durables" in warnings[0]
            )
            # A worker's durable appears: the next try (the answer is kept 1 s while none) sends it all.
            await _add_durable(nc, name, "reader", subject)
            assert await outbox.flush(20)
        finally:
            sending.cancel()
        info = await js.stream_info(name)
        assert (info.state.messages, outbox.counters.delivered) == (5, 5)
    finally:
        await nc.close()


def _pub(url: str, subject: str, body: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HPCBUS_CLUSTER", "NATS_URL")}
    return subprocess.run(
        [sys.executable, "-m", "hpcbus", "pub", "--nats", url, subject, body],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
    )


async def test_pub_refuses_while_an_interest_stream_has_no_durable(
    nats_server: NatsServer, cluster: str
) -> None:
    subject = f"{cluster}.metrics"
    line = "pubbed,hostname=h1,type=node value=7 1700000000"
    nc = await nats.connect(nats_server.url)
    try:
        name = await _interest_stream(nc, cluster)
        done = await asyncio.to_thread(_pub, nats_server.url, subject, line)
        assert done.returncode == 1, done.stderr
        assert f"hpcbus pub: not sent: {subject}: stream {name} keeps a message only" in done.stderr
        assert "Traceback" not in done.stderr and "stored as" not in done.stderr
        assert (await nc.jetstream().stream_info(name)).state.last_seq == 0
        await _add_durable(nc, name, "reader", subject)
        done = await asyncio.to_thread(_pub, nats_server.url, subject, line)
        assert done.returncode == 0 and f"stored as {name} #1" in done.stderr, done.stderr
        assert (await nc.jetstream().stream_info(name)).state.messages == 1
    finally:
        await nc.close()


async def _fetching(nc: NATS, stream: str, durable: str) -> bool:
    """The durable's worker waits in a fetch: its first check (before any fetch) is done."""
    try:
        return int((await nc.jetstream().consumer_info(stream, durable)).num_waiting or 0) > 0
    except Exception:  # not created yet
        return False


async def test_a_durable_created_after_discards_counts_them_once_among_its_workers(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """200 messages of 1 KiB into a 64 KiB stream (`discard: old`) before any worker ran; then two workers
    start together on the new durable: what the stream discarded before it existed is counted once, with
    one WARNING, and the rest delivered; both starting again count nothing. A durable an operator made to
    read only new messages had none of them to lose."""
    caplog.set_level(logging.WARNING, logger="hpcbus.runner")
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        stream, js = await small_stream(nc, cluster)
        payloads = [b"%d " % i + b"y" * 1000 for i in range(200)]
        await publish(nc, subject, payloads)
        gone = int((await js.stream_info(stream.name)).state.first_seq) - 1
        assert gone > 100

        async def workers(n: int) -> tuple[list[int], list[DoubleSink]]:
            stopping = Stopping(2.0)
            sinks = [DoubleSink(Outlet(nc, cluster, jetstream=True)) for _ in range(n)]
            runners = [Runner(nc, SETTINGS, stream.name, [subject], s, stopping) for s in sinks]  # type: ignore[arg-type]
            tasks = [asyncio.create_task(r.run()) for r in runners]
            await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 30, "the workers caught up")
            await wait_for_async(lambda: _fetching(nc, stream.name, "d"), 10, "a worker fetching")
            stopping.set()
            await asyncio.gather(*tasks)
            return [r.counters.discarded_unread for r in runners], sinks

        counted, sinks = await workers(2)
        assert sorted(m for s in sinks for m in s.delivered) == sorted(payloads[gone:])
        assert sum(counted) == gone, counted  # before: 0
        said = [r.getMessage() for r in caplog.records]
        assert (
            len(said) == 1
            and f"discarded {gone} messages (sequences 1..{gone}) before durable d had any" in said[0]
        )
        counted, _ = await workers(2)
        assert counted == [0, 0]

        await js.add_consumer(
            stream.name,
            ConsumerConfig(
                durable_name="new-only", deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT
            ),
        )
        stopping = Stopping(2.0)
        settings = msgspec.structs.replace(SETTINGS, durable="new-only")
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        runner = Runner(nc, settings, stream.name, [subject], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(lambda: _fetching(nc, stream.name, "new-only"), 10, "the worker fetching")
        stopping.set()
        await task
        assert runner.counters.discarded_unread == 0
    finally:
        await nc.close()


async def test_a_first_start_with_nothing_left_to_deliver_is_not_counted_again_on_restart(
    nats_server: NatsServer, cluster: str
) -> None:
    """Everything aged out before the durable existed: it delivers nothing, so the server's position stays
    where it was created; the shared ledger is what keeps a restart from counting the loss again."""
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(
            name=stream_name("HPCBUS", cluster), subjects=[subject], max_age=1.0, duplicate_window=0.5
        )
        js = await _streams(nc, stream, cluster)
        await publish(nc, subject, [b"aged %d" % i for i in range(10)])

        async def empty() -> bool:
            return (await js.stream_info(stream.name)).state.messages == 0

        await wait_for_async(empty, 20, "the messages aged out")

        async def start() -> int:
            stopping = Stopping(2.0)
            runner = Runner(
                nc,
                SETTINGS,
                stream.name,
                [subject],
                DoubleSink(Outlet(nc, cluster, jetstream=True)),
                stopping,
            )  # type: ignore[arg-type]
            task = asyncio.create_task(runner.run())
            await wait_for_async(lambda: _fetching(nc, stream.name, "d"), 10, "the worker fetching")
            stopping.set()
            await task
            return runner.counters.discarded_unread

        assert await start() == 10
        assert await start() == 0
        info = await js.consumer_info(stream.name, "d")
        assert info.delivered is not None and info.delivered.consumer_seq == 0  # the ledger, not a delivery
    finally:
        await nc.close()
