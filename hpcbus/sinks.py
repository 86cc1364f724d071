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
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from nats.aio.client import Client as NATS

from hpcbus.bus import StreamSpec, deadletter_stream, telemetry_stream
from hpcbus.options import read_section
from hpcbus.permanent import Outcome
from hpcbus.retry import Stopping
from hpcbus.runner import Role, Runner, RunnerSettings, Sink
from hpcbus.service import Service
from hpcbus.settings import STREAM, BusSettings, stream_overrides
from hpcbus.settings import clusters as cluster_names

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
    limits = read_section(args, STREAM)  # the typed section (`--stream-max-*`), as the gateway reads it
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
        try:
            await runner.attempt(lambda: sink.tick(stopping))
            await runner.settle()
        except Outcome as exc:
            log.error("%s: step failed: %s", name, exc)
