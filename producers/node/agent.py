"""The node agent: a `hpcbus.sources.Source` that samples this node on a wall-clock grid.

What it promises, and how:

- **Never lose a sample it took.** Each sample's messages go into the runtime's outbox the moment they are
  built and leave it only when JetStream acknowledged them (bounded, oldest dropped first, optionally spilled
  to disk so a restart does not lose them; see `hpcbus.outbox`). Re-sends carry the same Nats-Msg-Id.
- **Never crash, never stall.** A reader that fails becomes an error in the sample (the collector's rule);
  anything else that fails while building a sample costs that interval (the runtime logs it once per
  cause). Reading /proc runs in a worker thread, so control requests and publishing continue while a big
  node is being read. Sampling starts before NATS is reached.
- **Cheap.** Samples are taken on a wall-clock grid (every node at :00 and :30) without catching up on
  missed ticks. One unpublished reading at start gives the first published sample its rates.
- **SIGTERM flushes** (the runtime): the sample in hand is finished and queued, the outbox gets the rest of
  the stop deadline, and the last line logged says how many samples were taken, the time of the last, and
  what (if anything) is left unsent.
- **Forgery-proof with `ingest`.** Every message goes to this node's own ingest subject
  (`<cluster>.ingest.<host>.metrics`, ...), the only ones a node credential of `hpcbus deploy nats-auth`
  may publish on; `hpcbus consume ingest` checks that the lines name this node and forwards them.
- **Messages never exceed the server's `max_payload`.** Payloads are cut below the limit the server
  announced; the outbox cuts again what was queued before the server was known.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from hpcbus import __version__
from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES
from hpcbus.outbox import Outbox, OutboxSettings
from hpcbus.producers.node.collector import NodeCollector, NodeCollectorConfig, NodeSample
from hpcbus.producers.node.control import Control, Setting, float_in
from hpcbus.producers.node.jobs import JobEnded, JobStarted
from hpcbus.producers.node.pipeline import AgentConfig, Message, Pipeline
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol.timestamps import utc_text
from hpcbus.settings import BusSettings, SettingsError, stream_overrides
from hpcbus.settings import clusters as cluster_names
from hpcbus.sources import Backlog, Poll, SourceLoop, serve
from hpcbus.streams import ingest_stream, telemetry_stream

__all__ = ["NodeAgent"]

log = logging.getLogger("hpcbus.node")


class NodeAgent:
    """`hpcbus produce node` without the command line: a source for `hpcbus.sources`. `run(stopping)`
    serves it until `stopping` is set. `nvml` is passed to the collector (tests: a fake)."""

    name = "node"
    max_pending = 0

    def __init__(
        self,
        bus: BusSettings,
        node: NodeCollectorConfig | None = None,
        agent: AgentConfig | None = None,
        outbox: OutboxSettings | None = None,
        *,
        nvml: Any = None,
        ingest: bool = False,
        settle: float | None = None,
    ):
        cluster_names(bus)
        self.bus = bus
        self.config = agent or AgentConfig()
        self.collector = NodeCollector(node or NodeCollectorConfig(), nvml=nvml)
        self.cluster = bus.cluster
        self.hostname = self.config.node_name(self.collector.hostname)
        try:
            self.pipeline = Pipeline(self.cluster, self.hostname, self.config, prefix=bus.subject_prefix)
        except subjects.SubjectError as exc:
            raise SettingsError(str(exc)) from None
        self.ingest = ingest
        """Publish on this node's ingest subjects (`subjects.ingest`) instead of the cluster's."""
        if ingest:
            try:
                subjects.ingest_node_wildcard(self.cluster, self.hostname, prefix=bus.subject_prefix)
            except subjects.SubjectError as exc:
                raise SettingsError(f"--ingest: {exc} (set --hostname to the short name)") from None
        self.settle = settle
        """`--once` (`hpcbus.sources.once`): the first poll reads twice, `settle` seconds apart, and returns
        the second reading's sample (no start-up sysinfo); None: the service's polls."""
        self.outbox_settings = outbox or OutboxSettings()
        self.interval = self.config.interval
        self.samples = 0
        """Samples taken and queued since start."""
        self.last_sample: float | None = None
        """Time of the last sample taken (epoch seconds)."""
        self.on_sample: Callable[[NodeSample], None] | None = None
        """Called (in the event loop) after each sample is queued; for tests and embedding."""
        self.control = Control(
            self.cluster,
            self.hostname,
            self.snapshot,
            {"interval": Setting(float_in(1.0, 86400.0), self.set_interval)},
        )
        self.nc: NATS | None = None
        self.outbox: Outbox | None = None
        self.wake = asyncio.Event()
        self._primed = False
        self._due: float | None = None
        self._last_tick = 0.0
        self._next_sysinfo = 0.0
        self._carry: list[JobStarted | JobEnded] = []

    @property
    def oversized(self) -> int:
        """Lines dropped because a single line exceeded the server's max_payload."""
        return self.outbox.counters.oversized if self.outbox is not None else 0

    # -- run-time settings ----------------------------------------------------------------------------

    def set_interval(self, seconds: float) -> None:
        """Change the sampling interval now; the next tick is recomputed at once."""
        if seconds != self.interval:
            log.info("interval changed from %gs to %gs", self.interval, seconds)
        self.interval = float(seconds)
        self._due = None
        self.wake.set()

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
                "sent": self.outbox.counters.delivered if self.outbox is not None else 0,
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
        limit = server - ID_HEADER_BYTES
        if self.config.max_payload:
            limit = min(limit, self.config.max_payload)
        return max(1024, limit)

    # -- running --------------------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event | None = None) -> int:
        """Serve until SIGTERM/SIGINT or, when given, until `stopping` is set (tests and embedding)."""
        streams = []
        if self.config.ensure_stream:
            overrides = stream_overrides(self.config.stream_max_age, self.config.stream_max_bytes)
            make = ingest_stream if self.ingest else telemetry_stream
            streams.append(make(self.cluster, prefix=self.bus.subject_prefix, **overrides))
        log.info(
            "node agent for %s in cluster %s: every %gs%s",
            self.hostname,
            self.cluster,
            self.interval,
            " on the wall-clock grid" if self.config.align else "",
        )
        return await serve(
            self.bus,
            f"hpcbus-node-{self.hostname}",
            [self],
            self.outbox_settings,
            streams,
            stopping=stopping,
            grace=self.config.stop_timeout + 0.5,
            on_loop=self._on_loop,
        )

    def _on_loop(self, loop: SourceLoop) -> None:
        self.outbox = loop.outbox

    async def attach(self, nc: NATS) -> None:
        self.nc = nc
        if self.config.control:
            for method in ("get", "put"):
                subject = subjects.control(self.cluster, method, prefix=self.bus.subject_prefix)
                await nc.subscribe(subject, cb=self._on_control)

    def close(self, unsent: int, kept: bool) -> None:
        where = (
            f"kept in {self.outbox_settings.spill_dir} for the next start"
            if kept
            else "lost (configure [outbox] spill_dir to keep them)"
        )
        log.info(
            "stopped after %d samples; last sample at %s; %d messages sent, %d unsent%s",
            self.samples,
            "none" if self.last_sample is None else utc_text(self.last_sample),
            self.outbox.counters.delivered if self.outbox is not None else 0,
            unsent,
            f" ({where})" if unsent else "",
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

    def due_in(self) -> float:
        if not self._primed:
            return 0.0
        now = time.time()
        if self._due is None or self._due - now > self.interval:  # the clock was stepped back
            self._due = self._next_tick(now)
        return self._due - now

    async def poll(self, backlog: Backlog) -> Poll:
        if not self._primed:
            self._primed = True
            self._next_sysinfo = time.monotonic() + self.config.sysinfo_interval
            if self.settle is not None:  # --once: a failed first reading is the command's failure
                await self._prime()
                await asyncio.sleep(self.settle)
                return Poll(await self._sample(time.time(), backlog))
            try:
                await self._prime()
            except Exception:  # the start-up sysinfo goes out even when the priming reading failed
                log.exception("priming reading failed; the first sample has no rates")
            return Poll(await self._sysinfo())
        tick = self._due or time.time()
        self._due = None
        messages = await self._sample(tick, backlog)
        if self.config.sysinfo_interval and time.monotonic() >= self._next_sysinfo:
            self._next_sysinfo = time.monotonic() + self.config.sysinfo_interval
            messages += await self._sysinfo()
        return Poll(messages)

    async def _prime(self) -> None:
        """One unpublished reading so the first sample has rates; its job starts go out with that sample."""
        first = await asyncio.to_thread(self.collector.collect)
        self._carry = list(first.job_events)

    def _build(
        self, tick: float, queued: int | None, dropped: int | None
    ) -> tuple[NodeSample, list[Message]]:
        """Read and translate one sample (runs in a worker thread: pure apart from reading /proc)."""
        now = time.time()
        when = tick if abs(now - tick) < min(1.0, self.interval / 2) else now
        s = self.collector.collect(when)
        if self._carry:
            s.job_events = self._carry + s.job_events
            self._carry = []
        messages = self.pipeline.sample_messages(s, self.max_bytes, queued=queued, dropped=dropped)
        return s, self._routed(messages)

    async def _sample(self, tick: float, backlog: Backlog) -> list[Message]:
        self._last_tick = tick
        # The backlog lines describe the outbox: without one (`--once`) there are none.
        queued, dropped = (len(backlog), backlog.dropped) if self.outbox is not None else (None, None)
        s, messages = await asyncio.to_thread(self._build, tick, queued, dropped)
        self.samples += 1
        self.last_sample = s.time
        log.debug(
            "sample %d at %d: %d messages, %.3fs to read", self.samples, s.time, len(messages), s.collect_s
        )
        if self.on_sample is not None:
            self.on_sample(s)
        return messages

    async def _sysinfo(self) -> list[Message]:
        info = await asyncio.to_thread(self.collector.sysinfo)
        lines, sonar = self.pipeline.sysinfo_lines(info)
        return self._routed(
            self.pipeline.messages(lines, self.max_bytes, sonar=("sysinfo", sonar) if sonar else None)
        )

    def _routed(self, messages: list[Message]) -> list[Message]:
        """With `ingest`, each message on this node's ingest subject; its id stays the one of the subject it
        stands for, which the ingest worker forwards it with."""
        if not self.ingest:
            return messages
        prefix = self.bus.subject_prefix
        return [
            Message(
                subjects.ingest(self.cluster, self.hostname, m.subject, prefix=prefix), m.payload, m.msg_id
            )
            for m in messages
        ]

    async def _on_control(self, msg: Any) -> None:
        try:
            reply = self.control.handle(msg.data, msg.subject.rsplit(".", 1)[-1])
            if reply is not None and msg.reply:
                await msg.respond(reply)
        except Exception:  # a malformed request must not take the subscription down
            log.exception("control request on %s failed", msg.subject)
