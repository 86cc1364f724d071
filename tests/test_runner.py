"""The shared consumer runner against a real nats-server, driving a sink test double (the sink is not what
is tested here; NATS is real): errors no retry cures are dead-lettered message by message, and messages a
full stream discarded before the durable had them are counted exactly."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import time
from pathlib import Path

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from hpcbus.bus import StreamSpec, deadletter_stream, ensure_stream, stream_name, telemetry_stream
from hpcbus.counters import Counters
from hpcbus.discards import State, between_runs, claim_ranges, covers, merge, subtract
from hpcbus.influx import writer
from hpcbus.outlet import Outlet
from hpcbus.permanent import Partial, Permanent, TooLarge, Transient, outcome, permanent
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput, Runner, RunnerSettings, SinkBase
from hpcbus.schemas.problems import Problem
from tests.consumer_helpers import stream_messages, wait_for_async
from tests.services import NatsServer

pytestmark = pytest.mark.services


class DoubleSink(SinkBase):
    """Delivers every message except those whose payload starts with `poison`: a batch holding one fails
    with `error` (by default an OSError the runner must recognise as permanent)."""

    def __init__(self, outlet: Outlet, error: Exception | None = None) -> None:
        self.outlet = outlet
        self.counters = Counters()
        self.error = error or OSError(errno.ENAMETOOLONG, "File name too long")
        self.filling: list[Msg] = []
        self.delivered: list[bytes] = []
        self.batches: list[int] = []

    def take(self, msg: Msg) -> int:
        self.filling.append(msg)
        return 1

    def cut(self) -> list[Msg]:
        batch, self.filling = self.filling, []
        return batch

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        assert isinstance(batch, list)
        self.batches.append(len(batch))
        if any(m.data.startswith(b"poison") for m in batch):
            raise self.error
        self.delivered += [m.data for m in batch]


SETTINGS = RunnerSettings(durable="d", fetch_batch=50, flush_seconds=0.2, stats_seconds=3600.0)


async def pending(nc: NATS, stream: str, durable: str) -> tuple[int, int]:
    info = await nc.jetstream().consumer_info(stream, durable)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def publish(nc: NATS, subject: str, payloads: list[bytes]) -> None:
    js = nc.jetstream()
    for payload in payloads:
        await js.publish(subject, payload)


def test_permanent_is_told_from_transient() -> None:
    assert permanent(OSError(errno.ENAMETOOLONG, "File name too long"))
    assert permanent(PermissionError(errno.EACCES, "Permission denied"))
    assert permanent(Permanent("a value the sink can never store")) == "a value the sink can never store"
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert permanent(wrapped)
    assert permanent(OSError(errno.ENOSPC, "No space left on device")) is None  # space comes back
    assert permanent(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None  # a service down
    assert permanent(TimeoutError()) is None


def test_one_table_says_what_each_failure_means() -> None:
    """`outcome`: InfluxDB's answers, nats-py's publish refusals that no retry cures, and the rest."""
    hint = outcome(writer.Retryable("HTTP 503: busy", 503, 7.0))
    assert isinstance(hint, Transient) and hint.retry_after == 7.0
    assert isinstance(outcome(writer.TooLarge("HTTP 413", 413)), TooLarge)
    refused = outcome(writer.Rejected("HTTP 400: database is required", 400))
    assert isinstance(refused, Permanent) and "InfluxDB refused the batch" in refused.reason
    # a partial write's refused points never pass on a retry (issue 31: a job summary retried for ever)
    limit = 'HTTP 400: {"error":"partial write: max-values-per-tag limit exceeded (21/20) dropped=1"}'
    found = outcome(writer.Partial(limit, 1))
    assert isinstance(found, Permanent) and "max-values-per-tag limit exceeded" in found.reason
    assert isinstance(outcome(nats.js.errors.NoStreamResponseError()), Permanent)
    violation = nats.errors.Error("nats: 'Permissions Violation for Publish to \"fox.sonar.sample\"'")
    assert isinstance(outcome(violation), Permanent)
    assert isinstance(outcome(nats.errors.NoRespondersError()), Transient)  # a core request: maybe later
    assert isinstance(outcome(nats.errors.ConnectionClosedError()), Transient)
    assert isinstance(outcome(RuntimeError("unknown")), Transient)  # retried, one WARNING per episode
    for fault in (KeyError("cpu"), TypeError("None + int"), OverflowError("int too large"), RecursionError()):
        found = outcome(fault)  # a bug on one message: the same on every retry, so it never halts the worker
        assert isinstance(found, Permanent) and "a fault in hpcbus" in found.reason, fault
    partial = Partial("one file", [])
    assert outcome(partial) is partial  # a sink's own outcome stands


def test_a_permission_refused_is_permanent_only_under_a_writable_tree_root(tmp_path: Path) -> None:
    refused = PermissionError(errno.EACCES, "Permission denied")
    assert permanent(refused, tmp_path)  # the item's own: the tree takes other files
    assert permanent(OSError(errno.EROFS, "Read-only file system"), tmp_path / "missing")  # created
    blocker = tmp_path / "file"
    blocker.write_text("a file where the tree root should be")
    assert permanent(refused, blocker) is None  # the whole tree refuses: transient, retried
    assert permanent(NotADirectoryError(errno.ENOTDIR, "Not a directory"), blocker) is None
    assert permanent(NotADirectoryError(errno.ENOTDIR, "Not a directory"), tmp_path)


async def _streams(nc: NATS, stream: StreamSpec, cluster: str) -> JetStreamContext:
    """Create `stream` and the cluster's dead-letter stream; returns the JetStream context."""
    js = nc.jetstream()
    await ensure_stream(js, stream)
    await ensure_stream(js, deadletter_stream(cluster))
    return js


async def small_stream(nc: NATS, cluster: str) -> tuple[StreamSpec, JetStreamContext]:
    """A 64 KiB stream (`discard: old`) of `<cluster>.metrics` alone, which a few hundred 1 KiB messages
    fill past its limit, and the dead-letter stream."""
    subject = f"{cluster}.metrics"
    stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[subject], max_bytes=64 * 1024)
    return stream, await _streams(nc, stream, cluster)


def test_covers() -> None:
    assert covers(["c.metrics", "c.events.>"], "c.events.slurm")
    assert covers(["c.>"], "c.events.>")
    assert covers(["c.*.x"], "c.*.x")
    assert not covers(["c.metrics"], "c.events.>")
    assert not covers(["c.events.*"], "c.events.>")
    assert not covers(["c.metrics"], "c.metrics.x")


async def test_a_permanent_error_dead_letters_exactly_the_bad_message_and_the_batch_is_delivered(
    nats_server: NatsServer, cluster: str
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics"])
        await _streams(nc, stream, cluster)
        payloads = [b"m,hostname=n%d value=1 1\n" % i for i in range(10)]
        payloads.insert(4, b"poison,hostname=x value=1 1\n")
        await publish(nc, f"{cluster}.metrics", payloads)
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        stopping = Stopping(2.0)
        runner = Runner(nc, SETTINGS, stream.name, [f"{cluster}.metrics"], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(
            lambda: len(sink.delivered) == 10, 20, lambda: f"10 good messages delivered: {sink.delivered}"
        )
        await wait_for_async(
            lambda: _settled(nc, stream.name), 20, "every message acknowledged, nothing pending"
        )
        stopping.set()
        await task
    finally:
        await nc.close()
    assert sorted(sink.delivered) == sorted(p for p in payloads if not p.startswith(b"poison"))
    assert sink.batches[0] == 11  # one batch first, then each of its messages alone
    assert runner.counters.undeliverable_messages == 1
    (dead,) = await stream_messages(nats_server.url, stream_name("HPCBUS_DLQ", cluster))
    assert dead.data == b"poison,hostname=x value=1 1\n"
    headers = dead.headers or {}
    assert headers["Hpcbus-Subject"] == f"{cluster}.metrics"
    (problem,) = json.loads(headers["Hpcbus-Problems"])
    assert "can never be delivered" in problem["reason"] and "File name too long" in problem["reason"]


async def _settled(nc: NATS, stream: str) -> bool:
    return await _durable_settled(nc, stream, "d")


async def _run_until_settled(
    nc: NATS, stream: str, subject: str, sink: object, timeout: float = 20
) -> Runner:
    """A runner for `sink` on `subject` until the durable has acknowledged everything; then stopped."""
    stopping = Stopping(2.0)
    runner = Runner(nc, SETTINGS, stream, [subject], sink, stopping)  # type: ignore[arg-type]
    task = asyncio.create_task(runner.run())
    try:
        await wait_for_async(lambda: _settled(nc, stream), timeout, "everything acknowledged")
    finally:
        stopping.set()
        await task
    return runner


async def test_a_sink_naming_the_bad_messages_gets_the_others_acknowledged(
    nats_server: NatsServer, cluster: str
) -> None:
    """`Permanent(reason, msgs)`: the sink delivered the rest; the runner dead-letters the named ones."""
    nc = await nats.connect(nats_server.url)

    class Naming(DoubleSink):
        async def deliver(self, batch: object, stopping: Stopping) -> None:
            assert isinstance(batch, list)
            self.batches.append(len(batch))
            bad = [m for m in batch if m.data.startswith(b"poison")]
            self.delivered += [m.data for m in batch if m not in bad]
            if bad:
                raise Permanent("a value the sink can never store", bad)

    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics"])
        await _streams(nc, stream, cluster)
        payloads = [b"poison1", b"a", b"b", b"poison2", b"c"]
        await publish(nc, f"{cluster}.metrics", payloads)
        sink = Naming(Outlet(nc, cluster, jetstream=True))
        runner = await _run_until_settled(nc, stream.name, f"{cluster}.metrics", sink)
    finally:
        await nc.close()
    assert sink.batches == [5]  # nothing delivered twice
    assert sorted(sink.delivered) == [b"a", b"b", b"c"]
    assert runner.counters.undeliverable_messages == 2
    dead = await stream_messages(nats_server.url, stream_name("HPCBUS_DLQ", cluster))
    assert sorted(m.data for m in dead) == [b"poison1", b"poison2"]


class TakenCounters(Counters):
    taken_lines: int = 0
    """A sink's own extra, counted in `take` (as `received_lines` of the InfluxDB and Sonar sinks)."""


class Refusing(DoubleSink):
    """Refuses messages whose payload holds `bad` (`BadInput`, its good part kept: the runner's to report and
    dead-letter), and fails permanently on `poison` like `DoubleSink`; counts what it takes."""

    def __init__(self, outlet: Outlet, error: Exception | None = None) -> None:
        super().__init__(outlet, error)
        self.counters = TakenCounters()

    def take(self, msg: Msg) -> int:
        self.filling.append(msg)
        self.counters.taken_lines += 1
        if b"bad" in msg.data:
            raise BadInput([Problem("a bad line", msg.subject, 1, "lp")], 1)
        return 1


async def test_refused_input_is_dead_lettered_once_after_its_batch_and_counted(
    nats_server: NatsServer, cluster: str
) -> None:
    """What `take` refuses is reported and dead-lettered by the runner, once, after the rest of the batch is
    delivered; a refused message that is also undeliverable gets one dead letter with both problems. The
    standard counters say all of it."""
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(
            name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics", f"{cluster}.log.>"]
        )
        await _streams(nc, stream, cluster)
        payloads = [b"a", b"bad1", b"b", b"poison bad2", b"c"]
        await publish(nc, f"{cluster}.metrics", payloads)
        sink = Refusing(Outlet(nc, cluster, jetstream=True))
        runner = await _run_until_settled(nc, stream.name, f"{cluster}.metrics", sink)
    finally:
        await nc.close()
    assert sorted(sink.delivered) == [b"a", b"b", b"bad1", b"c"]  # the good part of bad1 too
    c = runner.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered, c.pending) == (5, 3, 2, 2, 0), c
    assert c.undeliverable_messages == 1
    assert sink.batches[0] == 5  # then each message again on its own, taken again: counted once
    assert isinstance(c, TakenCounters) and c.taken_lines == 5
    dead = {
        m.data: m.headers or {}
        for m in await stream_messages(nats_server.url, stream_name("HPCBUS_DLQ", cluster))
    }
    assert sorted(dead) == [b"bad1", b"poison bad2"]  # one dead letter each
    (only,) = json.loads(dead[b"bad1"]["Hpcbus-Problems"])
    assert only["reason"] == "a bad line"
    both = [p["reason"] for p in json.loads(dead[b"poison bad2"]["Hpcbus-Problems"])]
    assert "can never be delivered" in both[0] and both[1:] == ["a bad line"]
    reports = await stream_messages(nats_server.url, stream.name)
    said = [m.data for m in reports if m.subject == f"{cluster}.log.hpcbus"]
    assert len(said) == 2 and all(b"a bad line" in text for text in said)  # each reported once


async def test_messages_a_full_stream_discarded_unread_are_counted_exactly(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 64 KiB stream (`discard: old`) is filled past its limit while no worker reads; the worker resuming
    on its durable logs and counts exactly the messages it never got."""
    caplog.set_level(logging.WARNING, logger="hpcbus.runner")
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        stream, js = await small_stream(nc, cluster)

        async def run_until_settled(sink: DoubleSink, durable: str = "d") -> Runner:
            settings = msgspec.structs.replace(SETTINGS, durable=durable)
            stopping = Stopping(2.0)
            runner = Runner(nc, settings, stream.name, [subject], sink, stopping)  # type: ignore[arg-type]
            task = asyncio.create_task(runner.run())
            await wait_for_async(
                lambda: _durable_settled(nc, stream.name, durable), 20, f"durable {durable} settled"
            )
            stopping.set()
            await task
            return runner

        first = [b"first %d " % i + b"x" * 100 for i in range(10)]
        await publish(nc, subject, first)
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        runner = await run_until_settled(sink)
        assert sink.delivered == first and runner.counters.discarded_unread == 0
        # No worker reads: 200 messages of about 1 KiB fill the 64 KiB stream three times over.
        second = [b"second %d " % i + b"y" * 1000 for i in range(200)]
        await publish(nc, subject, second)
        info = await js.stream_info(stream.name)
        assert info.state.first_seq > len(first) + 1  # the stream did discard unread messages
        sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
        runner = await run_until_settled(sink)
        lost = len(second) - len(sink.delivered)
        assert lost > 0 and sink.delivered == second[lost:]
        assert runner.counters.discarded_unread == lost
        warnings = [r.getMessage() for r in caplog.records if "discarded" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert f"stream {stream.name} discarded {lost} messages" in warnings[0]
        assert "durable d " in warnings[0]
        # A durable created after the discards never had what went before it existed: counted (issue 29;
        # was 0), with its own WARNING, and not again when it starts again.
        before = int((await js.stream_info(stream.name)).state.first_seq) - 1
        runner = await run_until_settled(DoubleSink(Outlet(nc, cluster, jetstream=True)), "late")
        assert runner.counters.discarded_unread == before
        warnings = [r.getMessage() for r in caplog.records if "durable late" in r.getMessage()]
        assert len(warnings) == 1 and f"discarded {before} messages (sequences 1..{before})" in warnings[0]
        assert "before durable late had any" in warnings[0]
        runner = await run_until_settled(DoubleSink(Outlet(nc, cluster, jetstream=True)), "late")
        assert runner.counters.discarded_unread == 0
    finally:
        await nc.close()


async def _durable_settled(nc: NATS, stream: str, durable: str) -> bool:
    try:
        return await pending(nc, stream, durable) == (0, 0)
    except Exception:
        return False


async def test_a_stream_with_other_subjects_gives_an_upper_bound_and_an_idle_durable_no_warning(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The telemetry stream holds many subjects: what is gone cannot be asked for its subject, so a lagging
    durable is told "up to" the gap; a durable whose subjects had nothing waiting is not warned at all."""
    caplog.set_level(logging.WARNING, logger="hpcbus.runner")
    metrics, events = f"{cluster}.metrics", f"{cluster}.events.>"
    nc = await nats.connect(nats_server.url)
    try:
        stream = telemetry_stream(cluster, max_bytes=64 * 1024)
        await _streams(nc, stream, cluster)

        async def run_until_settled(durable: str, subject: str) -> tuple[Runner, DoubleSink]:
            sink = DoubleSink(Outlet(nc, cluster, jetstream=True))
            settings = msgspec.structs.replace(SETTINGS, durable=durable)
            stopping = Stopping(2.0)
            runner = Runner(nc, settings, stream.name, [subject], sink, stopping)  # type: ignore[arg-type]
            task = asyncio.create_task(runner.run())
            await wait_for_async(lambda: _durable_settled(nc, stream.name, durable), 20, durable)
            stopping.set()
            await task
            return runner, sink

        await run_until_settled("idle", events)  # its durable exists; nothing ever comes for it
        await publish(nc, metrics, [b"first"])
        await run_until_settled("lagging", metrics)
        await publish(nc, metrics, [b"second %d " % i + b"y" * 1000 for i in range(200)])
        runner, sink = await run_until_settled("lagging", metrics)
        lost = 200 - len(sink.delivered)
        # An upper bound: the gap also held the runners' own self-telemetry (one message per run so far).
        bound = runner.counters.discarded_unread
        assert lost > 0 and lost <= bound <= lost + 2
        (warning,) = [r.getMessage() for r in caplog.records]
        assert f"discarded up to {bound} messages" in warning and "durable lagging" in warning
        runner, _ = await run_until_settled("idle", events)
        assert runner.counters.discarded_unread == 0
        assert len(caplog.records) == 1
    finally:
        await nc.close()


class SlowSink(DoubleSink):
    """A sink slower than the publishers: 0.3 s per batch."""

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        await asyncio.sleep(0.3)
        await super().deliver(batch, stopping)


async def _publish_alone(url: str, subject: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(url)
    try:
        await publish(nc, subject, payloads)
    finally:
        await nc.close()


async def _lagging_workers(nats_server: NatsServer, cluster: str, workers: int = 1) -> tuple[int, list[int]]:
    """Publish 3,000 messages into a 64 KiB stream (`discard: old`) while `workers` slow workers share a
    durable reading its every subject; returns (lost, what each counted)."""
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[subject], max_bytes=64 * 1024)
        js = await _streams(nc, stream, cluster)
        stopping = Stopping(2.0)
        sinks = [SlowSink(Outlet(nc, cluster, jetstream=True)) for _ in range(workers)]
        settings = msgspec.structs.replace(SETTINGS, max_ack_pending=40 if workers == 1 else 10, in_flight=1)
        runners = [Runner(nc, settings, stream.name, [subject], s, stopping) for s in sinks]  # type: ignore[arg-type]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 20, "the durable created")
        payloads = [b"%d " % i + b"z" * 200 for i in range(3000)]
        # From a thread of its own (its own connection and loop), so the workers do not slow the publisher.
        await asyncio.to_thread(asyncio.run, _publish_alone(nats_server.url, subject, payloads))
        assert (await js.stream_info(stream.name)).state.first_seq > 1000  # most were discarded
        await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 60, "the workers caught up")
        stopping.set()
        await asyncio.gather(*tasks)
    finally:
        await nc.close()
    delivered = {m for s in sinks for m in s.delivered}
    assert delivered <= set(payloads)
    return len(payloads) - len(delivered), [r.counters.discarded_unread for r in runners]


async def test_a_worker_slower_than_the_publishers_counts_every_discard_exactly(
    nats_server: NatsServer, cluster: str
) -> None:
    """The stream discards all the while the worker reads (not only before it starts): every discard is
    counted, including those between two fetches and between a check and its fetch."""
    lost, (counted,) = await _lagging_workers(nats_server, cluster)
    assert lost > 100 and counted == lost, (lost, counted)


async def test_workers_sharing_a_durable_while_the_stream_discards_count_it_once(
    nats_server: NatsServer, cluster: str
) -> None:
    lost, counted = await _lagging_workers(nats_server, cluster, 2)
    assert lost > 20 and sum(counted) == lost, (lost, counted)


async def test_workers_sharing_a_durable_count_a_discard_once(nats_server: NatsServer, cluster: str) -> None:
    """Two workers resume on a durable past which the stream discarded: both see the discard; the ranges
    reported live in a key-value entry shared by the durable's workers, so their counts add up to what was
    lost (each used to count all of it)."""
    subject = f"{cluster}.metrics"
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[subject], max_bytes=64 * 1024)
        await _streams(nc, stream, cluster)
        stopping = Stopping(2.0)
        runner = Runner(
            nc, SETTINGS, stream.name, [subject], DoubleSink(Outlet(nc, cluster, jetstream=True)), stopping
        )  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 20, "the durable created")
        stopping.set()
        await task
        payloads = [b"%d " % i + b"z" * 1000 for i in range(300)]
        await publish(nc, subject, payloads)  # no worker reads: most are discarded
        stopping = Stopping(2.0)
        sinks = [DoubleSink(Outlet(nc, cluster, jetstream=True)) for _ in range(2)]
        runners = [Runner(nc, SETTINGS, stream.name, [subject], s, stopping) for s in sinks]  # type: ignore[arg-type]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 30, "the workers caught up")
        stopping.set()
        await asyncio.gather(*tasks)
    finally:
        await nc.close()
    lost = len(payloads) - len({m for s in sinks for m in s.delivered})
    counted = [r.counters.discarded_unread for r in runners]
    assert lost > 100 and sum(counted) == lost, (lost, counted)


async def test_a_sparse_durable_on_a_rolling_stream_is_not_warned(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A durable of rare messages (job events) had one waiting at a check and took it; then the stream rolled
    past with other subjects. The next check finds a gap with nothing of its own waiting: no "up to" warning
    (was: a warning because the check before had something waiting)."""
    caplog.set_level(logging.WARNING, logger="hpcbus.runner")
    metrics, events = f"{cluster}.metrics", f"{cluster}.events.>"
    nc = await nats.connect(nats_server.url)
    rolled: list[float] = []

    class Rolling(DoubleSink):
        async def deliver(self, batch: object, stopping: Stopping) -> None:
            await super().deliver(batch, stopping)
            if not rolled:  # the event is in hand: now other subjects roll the stream past it
                await publish(nc, metrics, [b"roll %d " % i + b"y" * 1000 for i in range(200)])
                rolled.append(time.monotonic())

    try:
        stream = telemetry_stream(cluster, max_bytes=64 * 1024)
        js = await _streams(nc, stream, cluster)
        await publish(nc, f"{cluster}.events.job", [b"job 1 started"])  # waiting at the first check
        sink = Rolling(Outlet(nc, cluster, jetstream=True))
        settings = msgspec.structs.replace(SETTINGS, durable="jobs")
        stopping = Stopping(2.0)
        runner = Runner(nc, settings, stream.name, [events], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        await wait_for_async(lambda: bool(rolled), 20, "the event delivered and the stream rolled")
        assert (await js.stream_info(stream.name)).state.first_seq > 2  # the gap past the durable
        await wait_for_async(lambda: runner.watch._checked > rolled[0], 20, "a check after the roll")
        stopping.set()
        await task
    finally:
        await nc.close()
    assert sink.delivered == [b"job 1 started"]
    assert runner.counters.discarded_unread == 0
    assert [r.getMessage() for r in caplog.records] == []


async def test_messages_of_a_batch_failing_during_the_drain_are_delivered_one_by_one(
    nats_server: NatsServer, cluster: str
) -> None:
    """The stop comes while a batch holding a bad message is being delivered: its messages, queued to be
    delivered one by one when it fails, are delivered (and the bad one dead-lettered) before the runner
    ends (they were left unacked)."""

    class Stops(DoubleSink):
        async def deliver(self, batch: object, stopping: Stopping) -> None:
            stopping.set()
            await asyncio.sleep(0.2)  # the runner leaves its loop and drains meanwhile
            await super().deliver(batch, stopping)

    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics"])
        await _streams(nc, stream, cluster)
        payloads = [b"a", b"b", b"poison", b"c"]
        await publish(nc, f"{cluster}.metrics", payloads)
        sink = Stops(Outlet(nc, cluster, jetstream=True))
        runner = Runner(nc, SETTINGS, stream.name, [f"{cluster}.metrics"], sink, Stopping(10.0))  # type: ignore[arg-type]
        await runner.run()
        await wait_for_async(lambda: _durable_settled(nc, stream.name, "d"), 10, "all acknowledged")
    finally:
        await nc.close()
    assert sink.batches[0] == 4 and sorted(sink.delivered) == [b"a", b"b", b"c"]
    assert runner.counters.undeliverable_messages == 1


def test_the_shared_record_of_discards() -> None:
    """What the workers of a durable keep in their shared entry: ranges reported once, runs of deliveries
    whose neighbours in consumer sequence show a skip, and nothing kept from a recreated stream."""
    state = State(ranges=[(100, 200)])
    assert claim_ranges(state, [(150, 250)], 300)[1] == [(201, 250)]
    assert claim_ranges(state, [(150, 160)], 300)[1] == []
    # The stream was recreated (its last sequence is below what was kept): its sequences started again.
    assert claim_ranges(state, [(150, 160)], 170)[1] == [(150, 160)]
    assert subtract([(1, 5), (10, 20)], 3, 12) == [(6, 9)]
    assert merge([(1, 5)], [(6, 9), (20, 30)]) == [(1, 9), (20, 30)]
    # Worker A got consumer sequences 10-12 (stream 100-102); B then got 13-14 (stream 150-151).
    assert between_runs([(10, 100, 12, 102)], (13, 150, 14, 151)) == [(103, 149)]
    assert between_runs([(13, 150, 14, 151)], (10, 100, 12, 102)) == [(103, 149)]
    assert between_runs([(10, 100, 12, 102)], (14, 150, 15, 151)) == []  # a delivery between: unknown


async def test_a_refused_message_is_acknowledged_only_once_its_dead_letter_is_stored(
    nats_server: NatsServer, cluster: str
) -> None:
    """No dead-letter stream yet: the dead letter is retried (never given up on), and nothing of its batch is
    acknowledged meanwhile; once the stream exists it is stored, then the batch is acknowledged."""
    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics"])
        js = nc.jetstream()
        await ensure_stream(js, stream)  # and no dead-letter stream
        await publish(nc, f"{cluster}.metrics", [b"a", b"bad1", b"b"])
        outlet = Outlet(nc, cluster, jetstream=True)
        sink = Refusing(outlet)
        stopping = Stopping(2.0)
        runner = Runner(nc, SETTINGS, stream.name, [f"{cluster}.metrics"], sink, stopping)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        try:
            await wait_for_async(lambda: outlet.deadletters.failures >= 2, 20, "the dead letter retried")
            assert await pending(nc, stream.name, "d") == (0, 3)  # all three held, none acknowledged
            assert (runner.counters.delivered, runner.counters.deadlettered) == (0, 0)
            await ensure_stream(js, deadletter_stream(cluster))
            await wait_for_async(lambda: _settled(nc, stream.name), 20, "everything acknowledged")
        finally:
            stopping.set()
            await task
        dead = await stream_messages(nats_server.url, stream_name("HPCBUS_DLQ", cluster))
    finally:
        await nc.close()
    c = runner.counters
    assert (c.received, c.delivered, c.rejected, c.deadlettered) == (3, 2, 1, 1), c
    assert [m.data for m in dead] == [b"bad1"]


class Gate:
    """A role that a test takes and releases (an active/standby lease, later)."""

    def __init__(self) -> None:
        self._held = asyncio.Event()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    async def taken(self) -> None:
        await self._held.wait()

    def take(self) -> None:
        self._held.set()

    def release(self) -> None:
        self._held.clear()


async def test_fetching_and_acknowledging_pause_while_the_role_is_not_held(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not held: nothing is fetched. Taken: the messages are delivered. Released while a batch is being
    delivered: it is delivered but not acknowledged until the role is taken again."""
    caplog.set_level(logging.INFO, logger="hpcbus.runner")
    gate = Gate()
    delivering = asyncio.Event()
    finish = asyncio.Event()

    class Waits(DoubleSink):
        async def deliver(self, batch: object, stopping: Stopping) -> None:
            assert isinstance(batch, list)
            if any(m.data == b"late" for m in batch):
                delivering.set()
                await finish.wait()
            await super().deliver(batch, stopping)

    def paused() -> int:
        return sum("the role is not held" in r.getMessage() for r in caplog.records)

    nc = await nats.connect(nats_server.url)
    try:
        stream = StreamSpec(name=stream_name("HPCBUS", cluster), subjects=[f"{cluster}.metrics"])
        await _streams(nc, stream, cluster)
        await publish(nc, f"{cluster}.metrics", [b"a", b"b"])
        sink = Waits(Outlet(nc, cluster, jetstream=True))
        stopping = Stopping(2.0)
        runner = Runner(nc, SETTINGS, stream.name, [f"{cluster}.metrics"], sink, stopping, gate)  # type: ignore[arg-type]
        task = asyncio.create_task(runner.run())
        try:
            await wait_for_async(lambda: paused() == 1, 20, "the runner paused")
            assert sink.delivered == [] and runner.counters.received == 0
            gate.take()
            await wait_for_async(lambda: _settled(nc, stream.name), 20, "both delivered and acknowledged")
            assert sorted(sink.delivered) == [b"a", b"b"]
            await publish(nc, f"{cluster}.metrics", [b"late"])
            await delivering.wait()
            gate.release()
            finish.set()
            await wait_for_async(lambda: paused() == 2, 20, "the acknowledgement paused")
            assert sink.delivered[-1] == b"late" and await pending(nc, stream.name, "d") == (0, 1)
            assert runner.counters.delivered == 2
            gate.take()
            await wait_for_async(lambda: _settled(nc, stream.name), 20, "the late one acknowledged")
        finally:
            stopping.set()
            await task
    finally:
        await nc.close()
    assert runner.counters.delivered == 3
