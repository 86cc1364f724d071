"""`SimulatedNodes`: N simulated compute nodes as one `hpcbus.sources.Source` on the producer runtime.

Each tick builds every node's sample (`producers.simulate.shape`) and turns it into messages with the node
agent's own `Pipeline`, so what goes out is byte for byte what N real `hpcbus produce node` would send for
such nodes, through the same outbox (acknowledged, retried with the same Nats-Msg-Id, spilled to disk when
configured). Building runs in a worker thread so publishing goes on meanwhile.

Differences from N real agents, on purpose: one connection instead of N (the broker sees fewer clients,
the stream the same messages), no sysinfo envelopes and no control subjects (they are not load), and the
self-telemetry lines carry no backlog counters (so a sample is the same message whenever it is built).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from nats.aio.client import Client as NATS

from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.simulate.settings import SimulateSettings
from hpcbus.producers.simulate.shape import SimulatedNode, Template
from hpcbus.retry import Stopping
from hpcbus.schemas.message import Message
from hpcbus.sources import Backlog, Poll, SourceLoop

log = logging.getLogger("hpcbus.simulate")


class SimulatedNodes:
    """The source. `acked_samples` counts node samples JetStream has acknowledged; with `samples` set the
    runtime is stopped once every node's last one is acknowledged."""

    name = "simulate"

    def __init__(
        self, settings: SimulateSettings, cluster: str, *, prefix: str = "", template: Template | None = None
    ) -> None:
        self.settings = settings
        self.max_pending = settings.max_pending
        self.wake = asyncio.Event()
        template = template or Template.from_corpus()
        config = AgentConfig(interval=settings.interval, control=False, ensure_stream=False)
        self.nodes: list[tuple[SimulatedNode, Pipeline]] = []
        for i in range(settings.first, settings.first + settings.nodes):
            host = f"{settings.hostname_prefix}{i:05d}"
            self.nodes.append(
                (
                    SimulatedNode(template, i, host, settings.interval),
                    Pipeline(cluster, host, config, prefix=prefix),
                )
            )
        self.ticks = 0
        self.acked_ticks = 0
        self.skipped = 0
        self.lines = 0
        self.bytes = 0
        self.nc: NATS | None = None
        self.stopping: Stopping | None = None
        self._last_tick = 0.0
        self._due: float | None = None
        self._next_stats = time.monotonic() + settings.stats_seconds

    @property
    def acked_samples(self) -> int:
        return self.acked_ticks * len(self.nodes)

    def on_loop(self, loop: SourceLoop) -> None:
        """`serve(on_loop=...)`: the runtime's stop event, set here once a bounded run is done."""
        self.stopping = loop.stopping

    @property
    def done(self) -> bool:
        return bool(self.settings.samples) and self.ticks >= self.settings.samples

    def due_in(self) -> float:
        if self.done:
            return 3600.0
        now = time.time()
        if self._due is None:
            iv = self.settings.interval
            if self.settings.align:
                tick = (math.floor(now / iv) + 1) * iv
            else:
                tick = self._last_tick + iv if self._last_tick else now
            if self._last_tick and tick <= self._last_tick:
                tick = self._last_tick + iv
            self._due = tick
        return self._due - now

    def _max_bytes(self) -> int:
        server = (
            int(self.nc.max_payload) if self.nc is not None and self.nc.max_payload else DEFAULT_MAX_PAYLOAD
        )
        return max(1024, server - ID_HEADER_BYTES)

    def _build(self, tick: float) -> list[Message]:
        limit = self._max_bytes()
        out: list[Message] = []
        for node, pipeline in self.nodes:
            messages = pipeline.sample_messages(node.sample(tick), limit)
            self.lines += sum(m.payload.count(b"\n") for m in messages)
            out.extend(messages)
        self.bytes += sum(len(m.payload) for m in out)
        return out

    async def poll(self, backlog: Backlog) -> Poll:
        tick = self._due or time.time()
        self._due = None
        if self._last_tick:
            self.skipped += max(0, round((tick - self._last_tick) / self.settings.interval) - 1)
        self._last_tick = tick
        messages = await asyncio.to_thread(self._build, tick)
        self.ticks += 1
        self._stats(len(backlog))
        return Poll(messages, commit=self._acked)

    def _acked(self) -> None:
        self.acked_ticks += 1
        if self.settings.samples and self.acked_ticks >= self.settings.samples:
            log.info("all %d samples of %d nodes acknowledged", self.settings.samples, len(self.nodes))
            if self.stopping is not None:
                self.stopping.set()

    def _stats(self, queued: int) -> None:
        if time.monotonic() < self._next_stats:
            return
        self._next_stats = time.monotonic() + self.settings.stats_seconds
        log.info(
            "%d nodes: %d ticks built, %d acknowledged, %d skipped; %d lines, %d bytes; %d messages queued",
            len(self.nodes),
            self.ticks,
            self.acked_ticks,
            self.skipped,
            self.lines,
            self.bytes,
            queued,
        )

    async def attach(self, nc: NATS) -> None:
        self.nc = nc

    def close(self, unsent: int, kept: bool) -> None:
        log.info(
            "stopped: %d nodes, %d samples acknowledged (%d ticks built, %d skipped), %d lines, %d bytes; "
            "%d messages unsent%s",
            len(self.nodes),
            self.acked_samples,
            self.ticks,
            self.skipped,
            self.lines,
            self.bytes,
            unsent,
            (" (kept in the spill directory)" if kept else " (lost)") if unsent else "",
        )
