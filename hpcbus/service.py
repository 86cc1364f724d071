"""The loop every long-running hpcbus process runs: signals, the NATS connection, its streams, the stop.

Producers (`hpcbus.sources`) and consumer workers (`hpcbus.runner`) are bodies run by a `Service`; what
they share is here, once:

- **Signals.** SIGTERM/SIGINT set the process' `Stopping` event, which gives everything `grace` seconds; the
  body must return by then, or it is cancelled. The process exits 0 within 5 s in any state: connecting,
  NATS down, mid-batch.
- **Connection.** Connects (retrying forever; a stop interrupts it), reports connection trouble as episodes,
  and when the server closes the connection for good (nats-py does not come back after a protocol error
  such as an oversized message) cancels the body and starts it again on a new connection: whatever the body
  held unacknowledged is redelivered, whatever a producer queued stays queued.
- **Streams.** One policy when a stream cannot be created or checked: keep trying in the background with
  back-off, one warning per cause; nothing waits for it (a publish to a subject no stream captures fails and
  is retried by the publisher; a consumer retries binding to its durable). Every stream gets the stream
  settings of `[bus]` (replicas, storage, placement tags; `hpcbus.streams.for_bus`), so whichever command
  creates it first creates it the same way, and one that finds it different says so.
- **Stop.** The connection is closed quietly (drain when connected, bounded), and the last log line says
  the process stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from nats.aio.client import Client as NATS

from hpcbus.connection import close, connect
from hpcbus.retry import Stopped, Stopping, Trouble, describe, retry
from hpcbus.settings import BusSettings
from hpcbus.streams import StreamSpec, ensure_stream, for_bus

log = logging.getLogger("hpcbus.service")

STOP_GRACE = 3.5
"""Seconds a stopping process gives its body to finish; with the connection's close (<= 1 s) it stays
within the 5 s promised for SIGTERM."""

STREAMS_FIRST_WAIT = 2.0
"""Seconds the body waits for its streams before it starts anyway (the creation goes on in the background)."""

Body = Callable[[NATS], Coroutine[Any, Any, None]]


class Service:
    """One process' connection and lifetime. `run(body)` returns the exit status."""

    def __init__(
        self,
        bus: BusSettings,
        name: str,
        *,
        streams: Sequence[StreamSpec] = (),
        stopping: Stopping | None = None,
    ) -> None:
        self.bus = bus
        self.name = name
        self.streams = [for_bus(spec, bus) for spec in streams]
        self.stopping = stopping or Stopping(STOP_GRACE)
        self.nats = Trouble(log, f"nats ({','.join(bus.nats)})")
        self.nc: NATS | None = None

    def stop_on_signals(self) -> None:
        """SIGTERM / SIGINT start the stop; a second signal changes nothing (the deadline already runs)."""
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if not self.stopping.is_set():
                log.info("%s: %s stopping within %.1f s", sig.name, self.name, self.stopping.grace)
            self.stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)

    async def run(self, body: Body, *, signals: bool = True) -> int:
        """Connect, run `body(nc)` until it returns; again on a new connection when the server closed this
        one. Returns 0 after a stop, 1 when the body failed with an unexpected error. `signals=False` leaves
        stopping to whoever sets `self.stopping` (tests, embedding)."""
        if signals:
            self.stop_on_signals()
        status: int | None = None
        while status is None and not self.stopping.is_set():
            nc = await self._connect()
            if nc is None:
                break
            self.nc = nc
            ensuring = asyncio.create_task(self._ensure_streams(nc), name="ensure-streams")
            # A healthy server answers at once: let the body start with its streams in place (no "stream
            # not found" at every first start); a slow or refusing one is not waited for.
            await asyncio.wait({ensuring}, timeout=STREAMS_FIRST_WAIT)
            try:
                status = await self._supervise(asyncio.create_task(body(nc), name=self.name), nc)
            finally:
                ensuring.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ensuring
                await close(nc, timeout=max(0.2, min(1.0, self.stopping.remaining())))
        log.info("%s: stopped cleanly", self.name)
        return status or 0

    async def _connect(self) -> NATS | None:
        """A connection, or None when stopping came first (the attempt is abandoned)."""
        connecting = asyncio.create_task(connect(self.bus, self.name, self.nats))
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({connecting, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if connecting.done() and not connecting.cancelled() and connecting.exception() is None:
            return connecting.result()
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        if not self.stopping.is_set():  # connect itself failed (bad credentials file, TLS setup, ...)
            raise ConnectionError(f"nats: {describe(connecting.exception() or 'connect failed')}")
        log.info("%s: stopped before NATS was reached", self.name)
        return None

    async def _supervise(self, task: asyncio.Task[None], nc: NATS) -> int | None:
        """Wait for the body; None when the connection was closed under it (reconnect and run it again)."""
        while True:
            timeout = 0.5
            if self.stopping.is_set():
                timeout = max(0.0, min(timeout, self.stopping.remaining()))
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if done:
                if task.cancelled():
                    return 0
                exc = task.exception()
                if exc is None or isinstance(exc, Stopped):
                    return 0
                log.error("%s failed: %s", self.name, describe(exc), exc_info=exc)
                return 1
            if self.stopping.is_set() and self.stopping.remaining() <= 0:
                log.warning("%s: not finished at the stop deadline; what it holds is redelivered", self.name)
                await _cancel(task)
                return 0
            if nc.is_closed and not self.stopping.is_set():
                reason = describe(nc.last_error) if nc.last_error else "closed"
                log.error("nats: the connection was closed (%s); connecting again", reason)
                await _cancel(task)
                return None

    async def _ensure_streams(self, nc: NATS) -> None:
        js = nc.jetstream()
        for spec in self.streams:
            trouble = Trouble(log, f"stream {spec.name}")
            try:
                await retry(
                    lambda spec=spec: ensure_stream(js, spec),  # type: ignore[misc]
                    trouble=trouble,
                    stopping=self.stopping,
                    base=1.0,
                    cap=30.0,
                )
            except Stopped:
                return


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(task, 1.0)
