"""The consumer side of the runtime: sinks fed by durable JetStream consumers, the mirror of `hpcbus.sources`.

A consumer is a `hpcbus.runner.Sink` per cluster (what to do with a message: write it to InfluxDB, forward
it, fold it into job aggregates, reassemble envelopes) and the stream and subjects it reads (`Feed`).
`serve` runs them on a `hpcbus.service.Service`, which owns the connection, the streams, the signals and the
stop deadline; `hpcbus.runner.Runner` owns the fetching, the batches, the acknowledgements, the counters,
the summary line, the self-telemetry and the dead letters. This module adds the life around them, written
once for every consumer:

- the feeds are built on every connection (a sink holds the connection's outlet), and each sink's `start`
  runs before its first message;
- a sink with `tick_seconds` is ticked while it runs (closing jobs, flushing a grace window): a tick that
  fails is logged and the next one runs;
- with a lease (`serve_held`, an active/standby pair), the feeds are built only once the role is held (so
  their state is loaded from what the last holder saved), and dropped at once when it is lost: nothing is
  delivered, acknowledged or saved after that (what they held is redelivered to the new holder);
- the stop: once the runners have delivered what they hold, each ticker finishes the tick in hand (bounded
  by the deadline), then each sink's `close` runs (saving state, returning held input); when the connection
  was lost instead, the tickers are cancelled and nothing is closed: what a sink held unacknowledged is
  redelivered, and the next connection's `start` takes over.

A new consumer is then its settings, its sink, and one call to `serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from hpcbus.contract import Role, Sink
from hpcbus.delivery import RunnerSettings
from hpcbus.lease import Lease, hold
from hpcbus.options import read_section
from hpcbus.permanent import Outcome, Transient
from hpcbus.retry import Stopped, Stopping, Trouble, retry
from hpcbus.runner import Runner
from hpcbus.service import Service
from hpcbus.settings import STREAM, BusSettings, SettingsError, stream_overrides
from hpcbus.settings import clusters as cluster_names
from hpcbus.streams import StreamSpec, deadletter_stream, telemetry_stream

log = logging.getLogger("hpcbus.sinks")


class Feed(NamedTuple):
    """One runner: a sink and what it reads."""

    stream: str
    subjects: list[str]
    delivery: RunnerSettings
    sink: Sink


Feeds = Callable[[NATS], Awaitable[Sequence[Feed]]]
"""Builds the feeds on a new connection."""


class Clusters(NamedTuple):
    """The clusters one worker process serves (`--cluster a,b`) and the streams it needs."""

    names: list[str]
    prefix: str
    """The subject prefix (`[bus] subject_prefix`)."""
    streams: dict[str, StreamSpec]
    """cluster -> the stream its runners read."""
    wanted: list[StreamSpec]
    """Every stream the service makes sure exists (`hpcbus.service`)."""


MakeStream = Callable[..., StreamSpec]


def worker_clusters(
    args: argparse.Namespace,
    bus: BusSettings,
    read: MakeStream = telemetry_stream,
    *,
    also: Sequence[MakeStream] = (),
    jetstream: bool = True,
) -> Clusters:
    """The clusters of `--cluster`, the stream `read` gives each (with the `--stream-max-*` limits), and
    the streams the service makes sure exist: for a JetStream worker, those, the streams `also` gives each
    and each cluster's dead-letter stream; for a core-NATS one (`jetstream` False: `--mode core`, which
    works without JetStream) none."""
    names = cluster_names(bus, several=True)
    prefix = bus.subject_prefix
    limits = read_section(args, STREAM)  # the typed section, as the gateway and `simulate` read it
    overrides = stream_overrides(limits.stream_max_age, limits.stream_max_bytes)
    streams = {cluster: read(cluster, prefix=prefix, **overrides) for cluster in names}
    wanted: list[StreamSpec] = []
    if jetstream:
        wanted += streams.values()
        wanted += (make(c, prefix=prefix, **overrides) for c in names for make in also)
        wanted += (deadletter_stream(cluster, prefix=prefix) for cluster in names)
    return Clusters(names, prefix, streams, wanted)


class Closable(Protocol):
    """What a command hands `serve` to close when the process ends (an InfluxDB writer)."""

    async def close(self) -> None: ...


async def serve(
    bus: BusSettings,
    name: str,
    streams: Sequence[StreamSpec],
    feeds: Feeds,
    *,
    stopping: Stopping | None = None,
    closing: Sequence[Closable] = (),
    role: Role | None = None,
) -> int:
    """Run the feeds `feeds(nc)` builds until SIGTERM/SIGINT (or, when `stopping` is given, until it is set:
        then no signal handlers are installed); the exit status. `closing`: what the feeds share across
        connections (an InfluxDB writer), closed here when the process ends, whatever ends it. `role`: fetching
    and acknowledging pause while it is not held (`hpcbus.runner.Role`; default: always held)."""
    service = Service(bus, name, streams=streams, stopping=stopping)

    async def body(nc: NATS) -> None:
        await run_feeds(nc, await feeds(nc), service.stopping, role)

    try:
        return await service.run(body, signals=stopping is None)
    finally:
        for resource in closing:
            await resource.close()


async def run_feeds(nc: NATS, feeds: Sequence[Feed], stopping: Stopping, role: Role | None = None) -> None:
    """One runner per feed (fetching and acknowledging while `role` is held: always, by default), the
    tickers, and the stop (see the module docstring)."""
    runners = [Runner(nc, f.delivery, f.stream, f.subjects, f.sink, stopping, role) for f in feeds]
    for runner, feed in zip(runners, feeds, strict=True):  # retried as a delivery is; a stop ends it
        if not await runner.attempt(functools.partial(feed.sink.start, stopping)):
            return
    tickers = [
        asyncio.create_task(_tick(f.sink, r, f.delivery.durable, stopping))
        for r, f in zip(runners, feeds, strict=True)
        if f.sink.tick_seconds > 0
    ]
    try:
        await asyncio.gather(*(r.run(final_report=False) for r in runners))
    finally:
        if not stopping.is_set():  # the connection is gone under us: what is held is redelivered
            for task in tickers:
                task.cancel()
        else:
            if tickers:  # each finishes the step in hand (bounded by the deadline), then sees `stopping`
                _, late = await asyncio.wait(tickers, timeout=max(0.1, stopping.remaining()))
                for task in late:
                    task.cancel()
            for runner, feed in zip(runners, feeds, strict=True):
                try:
                    await runner.attempt(functools.partial(feed.sink.close, stopping))
                    await runner.settle()
                except Outcome as exc:
                    log.error(
                        "%s: shutdown step failed (%s); unacked input will be redelivered",
                        feed.delivery.durable,
                        exc,
                    )
        for runner in runners:  # the last summary and telemetry: after `close`, which counts too
            await runner.report()


async def _tick(sink: Sink, runner: Runner, name: str, stopping: Stopping) -> None:
    """`sink.tick` every `tick_seconds` until stopping, retried by the runner as a delivery is
    (`Runner.attempt`); one that fails for good is logged, and the next one runs."""
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), sink.tick_seconds)
        if stopping.is_set():
            break
        if not runner.role.held:  # a standby, or a holder past its lease: it closes and sends nothing
            continue
        try:
            await runner.attempt(lambda: sink.tick(stopping))
            await runner.settle()
        except Outcome as exc:
            log.error("%s: step failed: %s", name, exc)


UNREACHABLE = (NatsError, TimeoutError, OSError, Transient)
"""What loading the state may meet and retries: NATS away, a stream without quorum, a timeout."""


class Held(NamedTuple):
    """Feeds that run only while a lease is held (one side of an active/standby pair)."""

    lease: Lease
    build: Callable[[], Awaitable[Sequence[Feed]]]
    """Builds the feeds once the role is held: loads the state the last holder saved."""


async def serve_held(
    bus: BusSettings,
    name: str,
    streams: Sequence[StreamSpec],
    held: Callable[[NATS], Sequence[Held]],
    *,
    stopping: Stopping | None = None,
    closing: Sequence[Closable] = (),
) -> int:
    """`serve` for an active/standby pair: on every connection, each `Held` stands by until its lease is
    held, then runs its feeds until the stop (then releases the role) or until the role is lost (then
    stands by again)."""
    service = Service(bus, name, streams=streams, stopping=stopping)
    refused: list[str] = []

    async def body(nc: NATS) -> None:
        try:
            await asyncio.gather(*(run_held(nc, h, service.stopping) for h in held(nc)))
        except SettingsError as exc:  # the saved state is another worker's: one line, exit 2
            log.error("%s", exc)
            refused.append(str(exc))
            service.stopping.set()

    try:
        status = await service.run(body, signals=stopping is None)
        return 2 if refused else status
    finally:
        for resource in closing:
            await resource.close()


async def run_held(nc: NATS, held: Held, stopping: Stopping) -> None:
    """Keep `held.lease`; while it is held, run the feeds `held.build()` makes (see `serve_held`)."""
    lease = held.lease
    building = Trouble(log, f"{lease.role}: loading the state")

    async def build() -> Sequence[Feed]:
        if not lease.held:
            raise Stopped("the role was lost while the state was loaded")
        return await held.build()

    async def act() -> bool:
        try:
            feeds = await retry(
                build, trouble=building, stopping=stopping, base=1.0, cap=5.0, retry_on=UNREACHABLE
            )
        except Stopped:
            return False
        work = asyncio.create_task(run_feeds(nc, feeds, stopping, lease))
        lost = asyncio.ensure_future(lease.lost.wait())
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        if work.done():
            await work  # stopping, or the connection is gone: what is held is redelivered
            return True
        log.warning("%s: the role was lost; dropping what this process held, standing by", lease.role)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return False

    await hold(lease, stopping, act)


class CatchUp:
    """Whether a worker that took over has caught up on its durable: every message handed to the previous
    holder has been acknowledged again (the ack floor passed what the durable had delivered at the
    takeover: the previous holder's unacknowledged input comes back after `ack_wait`), and the messages the
    stream held then have been handed out. A sink asks it before it closes anything (`consume jobs`: a job
    is not summarised from a state that still misses some of its samples)."""

    def __init__(self, nc: NATS, stream: str, durable: str) -> None:
        self.js = nc.jetstream()
        self.stream = stream
        self.durable = durable
        self.delivered = 0
        self.last = 0
        self.done = False
        self.since = 0.0

    async def mark(self) -> None:
        """At the takeover: what was delivered, and what the stream held."""
        from nats.js.errors import NotFoundError

        self.since = time.monotonic()
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
            self.delivered = info.delivered.stream_seq if info.delivered else 0
        except NotFoundError:  # the first worker ever: nothing was handed out
            self.delivered = 0
        stream = await self.js.stream_info(self.stream)
        self.last = stream.state.last_seq

    async def __call__(self) -> bool:
        if self.done:
            return True
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
        except Exception as exc:  # NATS away: asked again at the next step
            log.debug("%s: consumer info: %s", self.durable, exc)
            return False
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        delivered = info.delivered.stream_seq if info.delivered else 0
        if floor >= self.delivered and (delivered >= self.last or not info.num_pending):
            self.done = True
            log.info(
                "%s: caught up on stream %s %.1f s after taking over",
                self.durable,
                self.stream,
                time.monotonic() - self.since,
            )
        return self.done
