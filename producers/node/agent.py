"""The long-running node agent: sample on a wall-clock grid, queue every message, publish when NATS is there.

What it promises, and how:

- **Never lose a sample it took.** Sampling and publishing are separate tasks joined by the `Outbox`: a
  sample's messages are queued the moment they are built, in order, and leave the queue only when JetStream
  acknowledged them. While NATS is unreachable the queue grows (bounded: the oldest go first, logged with a
  count; optionally spilled to disk so a restart does not lose them) and drains in order when NATS is back.
  Re-sends carry the same Nats-Msg-Id, so a lost ack never becomes a duplicate in the stream.
- **Never crash, never stall.** A reader that fails becomes an error in the sample (the collector's rule);
  anything else that fails while building a sample is logged (once per cause) and that interval is skipped;
  the next one runs. Reading /proc runs in a worker thread, so control requests and publishing continue
  while a big node is being read. The first NATS connect is retried forever, like reconnects, and sampling
  starts before it succeeds.
- **Cheap.** Samples are taken on a wall-clock grid (every node at :00 and :30) without catching up on
  missed ticks. One unpublished reading at start gives the first published sample its rates.
- **SIGTERM flushes.** Sampling stops after the sample in hand, the queue is given `stop_timeout` seconds
  to be acknowledged, the connection is closed, and the last line logged says how many samples were taken,
  the time of the last, and what (if anything) is left unsent.
- **Messages never exceed the server's `max_payload`.** Payloads are cut below the limit the server
  announced; a message queued before the server was known and found too large is cut again at publish time
  (each piece with the id of its own content), and a single line longer than the limit is dropped with an
  error log instead of blocking the queue forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import Any

import msgspec

from hpcbus import __version__
from hpcbus.outbox import Outbox, OutboxSettings
from hpcbus.settings import BusSettings, SettingsError, stream_overrides
from producers.node.collector import NodeCollector, NodeCollectorConfig, NodeSample
from producers.node.control import Control, Setting, float_in
from producers.node.jobs import JobEnded, JobStarted
from producers.node.pipeline import (
    DEFAULT_MAX_PAYLOAD,
    HEADROOM,
    AgentConfig,
    Message,
    Pipeline,
    split_payload,
)
from schemas import subjects
from schemas.translate import msg_id

__all__ = ["NodeAgent", "stop_on_signals"]

log = logging.getLogger("hpcbus.node")


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM / SIGINT set `stopping`: the agent finishes the sample in hand, flushes and exits."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stopping.is_set():
            log.info("%s: finishing the sample in hand, flushing, then exiting", sig.name)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


class _Publisher:
    """What the Outbox publishes through: JetStream, refusing at once while disconnected (so retries do not
    pile copies into the client's reconnect buffer) and never sending more than the server accepts."""

    def __init__(self, agent: NodeAgent, nc: Any, js: Any):
        self.agent = agent
        self.nc = nc
        self.js = js

    async def publish(self, subject: str, payload: bytes, timeout: float, headers: dict[str, str]) -> Any:
        nc = self.nc
        if not nc.is_connected:
            raise ConnectionError("not connected to NATS")
        limit = max(1, int(nc.max_payload or DEFAULT_MAX_PAYLOAD) - HEADROOM)
        if len(payload) <= limit:
            return await self.js.publish(subject, payload, timeout=timeout, headers=headers)
        ack = None
        for piece in split_payload(payload, limit):
            if len(piece) > limit:
                self.agent.oversized += 1
                log.error(
                    "dropped a %d-byte line for %s: longer than the server's max_payload (%d); %d so far",
                    len(piece),
                    subject,
                    nc.max_payload,
                    self.agent.oversized,
                )
                continue
            ack = await self.js.publish(
                subject, piece, timeout=timeout, headers={"Nats-Msg-Id": msg_id(subject, piece)}
            )
        return ack


class NodeAgent:
    """`hpcbus produce node` without the command line. `run(stopping)` returns when `stopping` is set and
    the queue is flushed (or `stop_timeout` passed). `nvml` is passed to the collector (tests: a fake)."""

    def __init__(
        self,
        bus: BusSettings,
        node: NodeCollectorConfig | None = None,
        agent: AgentConfig | None = None,
        outbox: OutboxSettings | None = None,
        *,
        nvml: Any = None,
    ):
        if not bus.cluster:
            raise SettingsError(
                "--cluster (HPCBUS_CLUSTER) is required: it is the first part of every subject"
            )
        self.bus = bus
        self.config = agent or AgentConfig()
        self.collector = NodeCollector(node or NodeCollectorConfig(), nvml=nvml)
        self.cluster = bus.cluster
        self.hostname = self.config.hostname or self.collector.hostname
        try:
            self.pipeline = Pipeline(self.cluster, self.hostname, self.config)
        except subjects.SubjectError as exc:
            raise SettingsError(str(exc)) from None
        self.outbox_settings = outbox or OutboxSettings()
        self.interval = self.config.interval
        self.samples = 0
        """Samples taken and queued since start."""
        self.last_sample: float | None = None
        """Time of the last sample taken (epoch seconds)."""
        self.oversized = 0
        """Lines dropped because a single line exceeded the server's max_payload."""
        self.on_sample: Callable[[NodeSample], None] | None = None
        """Called (in the event loop) after each sample is queued; for tests and embedding."""
        self.control = Control(
            self.cluster,
            self.hostname,
            self.snapshot,
            {"interval": Setting(float_in(1.0, 86400.0), self.set_interval)},
        )
        self.nc: Any = None
        self.outbox: Outbox | None = None
        self._retick: asyncio.Event | None = None
        self._last_tick = 0.0
        self._carry: list[JobStarted | JobEnded] = []
        self._failures: set[str] = set()

    # -- run-time settings ----------------------------------------------------------------------------

    def set_interval(self, seconds: float) -> None:
        """Change the sampling interval now; the next tick is recomputed at once."""
        if seconds != self.interval:
            log.info("interval changed from %gs to %gs", self.interval, seconds)
        self.interval = float(seconds)
        if self._retick is not None:
            self._retick.set()

    def snapshot(self) -> dict[str, Any]:
        """Configuration and state, as a control GET returns them."""
        out: dict[str, Any] = msgspec.to_builtins(self.config)
        out.update(
            interval=self.interval,
            hostname=self.hostname,
            cluster=self.cluster,
            version=__version__,
            node=msgspec.to_builtins(self.collector.config),
            outbox=msgspec.to_builtins(self.outbox_settings),
            state={
                "samples": self.samples,
                "last_sample": self.last_sample,
                "queued": len(self.outbox) if self.outbox is not None else 0,
                "sent": self.outbox.sent if self.outbox is not None else 0,
                "dropped": self.outbox.dropped if self.outbox is not None else 0,
                "oversized": self.oversized,
                "connected": bool(self.nc is not None and self.nc.is_connected),
            },
        )
        return out

    @property
    def max_bytes(self) -> int:
        """Payload size limit for new messages: the configured one, else the server's, minus header room."""
        server = DEFAULT_MAX_PAYLOAD
        if self.nc is not None and self.nc.max_payload:
            server = int(self.nc.max_payload)
        limit = server - HEADROOM
        if self.config.max_payload:
            limit = min(limit, self.config.max_payload)
        return max(1024, limit)

    # -- main -----------------------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> int:
        self.outbox = Outbox(self.outbox_settings)
        self._retick = asyncio.Event()
        log.info(
            "node agent for %s in cluster %s: every %gs%s",
            self.hostname,
            self.cluster,
            self.interval,
            " on the wall-clock grid" if self.config.align else "",
        )
        sampler = asyncio.create_task(self._sample_loop(stopping), name="node-sampler")
        bus = asyncio.create_task(self._bus(), name="node-bus")
        try:
            await sampler  # returns once stopping is set and the sample in hand is queued
        finally:
            await self._shutdown(bus)
        return 0

    async def _shutdown(self, bus: asyncio.Task[None]) -> None:
        outbox = self.outbox
        assert outbox is not None
        nc = self.nc
        connected = nc is not None and nc.is_connected and not bus.done()
        if len(outbox) and connected and not await outbox.flush(self.config.stop_timeout):
            log.warning(
                "flush: %d messages not acknowledged within %gs", len(outbox), self.config.stop_timeout
            )
        bus.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await bus
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 2.0)
        left = len(outbox)
        where = (
            f"kept in {self.outbox_settings.spill_dir} for the next start"
            if self.outbox_settings.spill_dir
            else "lost (configure [outbox] spill_dir to keep them)"
        )
        log.info(
            "stopped after %d samples; last sample at %s; %d messages sent, %d unsent%s",
            self.samples,
            "none" if self.last_sample is None else str(math.floor(self.last_sample)),
            outbox.sent,
            left,
            f" ({where})" if left else "",
        )
        self.collector.close()

    # -- sampling -------------------------------------------------------------------------------------

    def _next_tick(self, now: float) -> float:
        """The next sample time: the next multiple of the interval (align), else one interval after the last
        sample; never a tick already taken (asyncio may wake a hair early), never a catch-up burst after a
        stall, and no long sleep after the wall clock was stepped back."""
        iv = self.interval
        last = self._last_tick
        if self.config.align:
            tick = (math.floor(now / iv) + 1) * iv
        else:
            tick = last + iv if last else now + iv
            if tick < now or tick - now > iv:  # stalled, or the clock went back
                tick = now + iv
        if last and tick <= last and last - now < iv:
            tick = last + iv
        return tick

    async def _wait_until(self, tick: float, stopping: asyncio.Event) -> bool:
        """True at `tick`; False when stopping or the interval changed first."""
        assert self._retick is not None
        delay = tick - time.time()
        if delay <= 0:
            return not stopping.is_set()
        waiters = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(self._retick.wait())]
        done, pending = await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
        if done:
            self._retick.clear()
            return False
        return True

    async def _sample_loop(self, stopping: asyncio.Event) -> None:
        await self._guarded("priming reading", self._prime)
        await self._guarded("sysinfo", self._sysinfo)
        next_sysinfo = time.monotonic() + self.config.sysinfo_interval
        while not stopping.is_set():
            tick = self._next_tick(time.time())
            if not await self._wait_until(tick, stopping):
                continue
            await self._guarded("sample", functools.partial(self._sample, tick))
            if self.config.sysinfo_interval and time.monotonic() >= next_sysinfo and not stopping.is_set():
                await self._guarded("sysinfo", self._sysinfo)
                next_sysinfo = time.monotonic() + self.config.sysinfo_interval

    async def _guarded(self, what: str, step: Callable[[], Any]) -> None:
        try:
            await step()
        except Exception as exc:  # a bug or a surprise must cost one interval, not the agent
            cause = f"{what}: {type(exc).__name__}: {exc}"
            if cause not in self._failures:
                if len(self._failures) < 1000:
                    self._failures.add(cause)
                log.exception("%s failed (reported once; the agent carries on)", what)

    async def _prime(self) -> None:
        """One unpublished reading so the first sample has rates; its job starts go out with that sample."""
        first = await asyncio.to_thread(self.collector.collect)
        self._carry = list(first.job_events)

    def _build(self, tick: float, queued: int, dropped: int) -> tuple[NodeSample, list[Message]]:
        """Read and translate one sample (runs in a worker thread: pure apart from reading /proc)."""
        now = time.time()
        when = tick if abs(now - tick) < min(1.0, self.interval / 2) else now
        s = self.collector.collect(when)
        if self._carry:
            s.job_events = self._carry + s.job_events
            self._carry = []
        lines, sonar = self.pipeline.sample_lines(s, queued=queued, dropped=dropped)
        messages = self.pipeline.messages(lines, self.max_bytes, sonar=("sample", sonar) if sonar else None)
        return s, messages

    async def _sample(self, tick: float) -> None:
        outbox = self.outbox
        assert outbox is not None
        self._last_tick = tick
        s, messages = await asyncio.to_thread(self._build, tick, len(outbox), outbox.dropped)
        for m in messages:
            outbox.put(m.subject, m.payload, m.msg_id)
        self.samples += 1
        self.last_sample = s.time
        log.debug(
            "sample %d at %d: %d messages, %.3fs to read", self.samples, s.time, len(messages), s.collect_s
        )
        if self.on_sample is not None:
            self.on_sample(s)

    async def _sysinfo(self) -> None:
        outbox = self.outbox
        assert outbox is not None
        info = await asyncio.to_thread(self.collector.sysinfo)
        lines, sonar = self.pipeline.sysinfo_lines(info)
        for m in self.pipeline.messages(lines, self.max_bytes, sonar=("sysinfo", sonar) if sonar else None):
            outbox.put(m.subject, m.payload, m.msg_id)

    # -- bus ------------------------------------------------------------------------------------------

    async def _bus(self) -> None:
        """Connect (retrying forever), set up stream and control, then publish the outbox forever. Restarted
        after any unexpected failure: the publisher is what turns taken samples into stored ones."""
        while True:
            try:
                await self._bus_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("publisher failed; starting it again in 2s")
                await asyncio.sleep(2.0)

    async def _bus_once(self) -> None:
        from hpcbus.bus import connect, ensure_stream, telemetry_stream

        if self.nc is None or self.nc.is_closed:
            self.nc = await connect(self.bus, f"hpcbus-node-{self.hostname}")
            nc = self.nc
            if self.config.ensure_stream:
                overrides = stream_overrides(self.config.stream_max_age, self.config.stream_max_bytes)
                try:
                    await ensure_stream(nc.jetstream(), telemetry_stream(self.cluster, **overrides))
                except Exception as exc:  # no JetStream rights, or the operator manages streams
                    log.warning(
                        "could not create or check the stream of %s (%s); publishing anyway",
                        self.cluster,
                        exc,
                    )
            if self.config.control:
                for method in ("get", "put"):
                    await nc.subscribe(subjects.control(self.cluster, method), cb=self._on_control)
        nc = self.nc
        assert self.outbox is not None
        await self.outbox.run(_Publisher(self, nc, nc.jetstream()))

    async def _on_control(self, msg: Any) -> None:
        try:
            reply = self.control.handle(msg.data, msg.subject.rsplit(".", 1)[-1])
            if reply is not None and msg.reply:
                await msg.respond(reply)
        except Exception:  # a malformed request must not take the subscription down
            log.exception("control request on %s failed", msg.subject)
