"""What the fault scenarios share: the flood (a bounded `hpcbus simulate` run and the exact points it must
leave in InfluxDB), the workers, duplicate counting in the stream, a TCP proxy that partitions a client
from the cluster, and the row each scenario adds to the table printed at the end of the run.

Counting. A simulated node's sample is the same message whenever it is built (same payload, same
Nats-Msg-Id), and each of its metric lines is one InfluxDB point (measurement, tags, second). The
expected points per sample come from running the same shape through the same pipeline in this process;
process-level lines are left out because `consume influx` aggregates them per job (their number is a
policy, not a count of what was sent). Duplicates cannot be seen in InfluxDB (a second write of a point
replaces the first), so they are counted where they would be stored: messages of the stream that repeat
a Nats-Msg-Id or a payload.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.simulate.shape import SimulatedNode, Template
from tests.consumer_helpers import Process, Worker, bus_messages, triples, wait_for

RESULTS = pytest.StashKey[list["FaultRow"]]()
"""config.stash key: the rows of the fault table, in the order the scenarios finished."""

HOST_PREFIX = "fault"

Campaign = dict[str, "concurrent.futures.Future[object]"]
"""scenario name -> its result (a `FaultRow`) once the scenario is done."""


@dataclass
class FaultRow:
    scenario: str
    published: int
    stored: int
    lost: int
    duplicated: int
    recovery_s: float | None
    note: str = ""


def record(config: pytest.Config, row: FaultRow) -> None:
    config.stash.setdefault(RESULTS, []).append(row)


# --- the flood ------------------------------------------------------------------------------------------------


def points_per_sample(cluster: str = "c") -> dict[str, int]:
    """Distinct InfluxDB points (per measurement) one simulated node's sample yields, process lines aside."""
    node = SimulatedNode(Template.from_corpus(), 1, f"{HOST_PREFIX}00001", 1.0)
    pipeline = Pipeline(cluster, node.hostname, AgentConfig(control=False))
    lines, _ = pipeline.sample_lines(node.sample(1_700_000_000.0))
    keys: dict[str, set[tuple[tuple[str, str], ...]]] = collections.defaultdict(set)
    for line in lines:
        if line.measurement.startswith("process_") or "value" not in line.fields:
            continue
        keys[line.measurement].add(tuple(sorted(line.tags.items())))
    return {m: len(k) for m, k in keys.items()}


@dataclass
class Flood:
    """A bounded `hpcbus simulate` run: `nodes` x `samples` samples, one a second."""

    nodes: int
    samples: int
    prefix: str = HOST_PREFIX

    @property
    def per_sample(self) -> dict[str, int]:
        return points_per_sample()

    @property
    def expected(self) -> int:
        return sum(self.per_sample.values()) * self.nodes * self.samples

    def args(self, url: str, cluster: str, *extra: str) -> list[str]:
        return [
            "simulate",
            "--nats",
            url,
            "--cluster",
            cluster,
            "--nodes",
            str(self.nodes),
            "--interval",
            "1",
            "--samples",
            str(self.samples),
            "--hostname-prefix",
            self.prefix,
            # keep building samples through an outage (the outbox holds them) instead of pausing
            "--max-pending",
            "100000",
            "--stats-seconds",
            "5",
            *extra,
        ]

    def stored(self, influx: Any, db: str) -> int:
        """Points of the flood in InfluxDB (the counted measurements only)."""
        counted = self.per_sample
        rows = influx.points(f'SELECT count("value") FROM /.*/ WHERE hostname =~ /^{self.prefix}/', db)
        return sum(int(r["count"]) for r in rows if r["_measurement"] in counted)


def start_flood(
    flood: Flood, url: str, cluster: str, log: Path, processes: list[Process], *extra: str
) -> Worker:
    w = Worker(flood.args(url, cluster, *extra), log)
    processes.append(w)
    return w.start(ready="simulating", timeout=60)


def start_worker(
    url: str, cluster: str, influx_url: str, db: str, log: Path, processes: list[Process], *extra: str
) -> Worker:
    args = ["consume", "influx", "--nats", url, "--cluster", cluster, "--influx-url", influx_url, "--db", db]
    w = Worker([*args, *extra], log)
    processes.append(w)
    return w.start(timeout=60)


class Recovery:
    """When the flood's points from before the end of a fault were all queryable again.

    `mark()` at the end of the fault (a restart, a heal, the kill itself); `wait(...)` then polls InfluxDB
    until the whole flood is stored, counting the flood's `cpu_used` points stamped up to that moment. Once
    everything is in, that count is final, and the recovery time is how long after the mark the polls first
    saw it: what the fault held back (a backlog in the stream, an outbox, unacked batches) was stored by then,
    whatever the rest of the flood still had to do."""

    def __init__(self, flood: Flood, influx: Any, db: str) -> None:
        self.flood, self.influx, self.db = flood, influx, db
        self.mark_wall = 0.0
        self.mark_mono = 0.0
        self.polls: list[tuple[float, int]] = []

    def mark(self) -> None:
        self.mark_mono, self.mark_wall = time.monotonic(), time.time()

    def _before_mark(self) -> int:
        q = (
            f'SELECT count("value") FROM "cpu_used" WHERE hostname =~ /^{self.flood.prefix}/'
            f" AND time <= {int(self.mark_wall)}s"
        )
        rows = self.influx.points(q, self.db)
        return int(rows[0]["count"]) if rows else 0

    def wait(self, timeout: float, what: str) -> float:
        """Wait until the whole flood is stored; the recovery time in seconds."""
        total = [0]

        def done() -> bool:
            with contextlib.suppress(Exception):  # InfluxDB may be on its way back up
                self.polls.append((time.monotonic(), self._before_mark()))
                total[0] = self.flood.stored(self.influx, self.db)
            return total[0] >= self.flood.expected

        wait_for(
            done, timeout, lambda: f"{what}: {total[0]} of {self.flood.expected} points stored", interval=0.5
        )
        final = self._before_mark()
        first = next((t for t, n in self.polls if n >= final), time.monotonic())
        return max(0.0, first - self.mark_mono)


def published_samples(url: str, cluster: str) -> int:
    """Samples of the flood JetStream holds (its `events.sample` skeletons, one per node sample)."""
    from hpcbus.streams import stream_name

    async def count() -> int:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            info = await nc.jetstream().stream_info(
                stream_name("HPCBUS", cluster), subjects_filter=f"{cluster}.events.sample"
            )
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    return asyncio.run(count())


def wait_published(url: str, cluster: str, flood: Flood, share: float, timeout: float) -> None:
    """Wait until JetStream holds `share` of the flood's samples: a fault meant to hit the publisher
    mid-flood must not wait for the slower storing side."""

    def enough() -> bool:
        try:
            return published_samples(url, cluster) >= share * flood.nodes * flood.samples
        except Exception:  # the stream is created by the first process that connects
            return False

    wait_for(enough, timeout, f"{share:.0%} of the flood in the stream", interval=0.2)


def duplicates(
    url: str, cluster: str, marker: bytes = b"hostname=" + HOST_PREFIX.encode()
) -> tuple[int, int]:
    """(the flood's messages in the cluster's stream, how many of them repeat an earlier Nats-Msg-Id or
    payload). The flood's are those with `marker` (its host names): the workers' own reports and
    telemetry share the stream and may well repeat themselves."""
    msgs = [t for t in triples(bus_messages(url, cluster)) if marker in t[1]]
    ids = collections.Counter(i for _, _, i in msgs if i)
    payloads = collections.Counter((s, p) for s, p, _ in msgs)
    return len(msgs), max(sum(ids.values()) - len(ids), sum(payloads.values()) - len(payloads))


def finish(
    config: pytest.Config,
    scenario: str,
    flood: Flood,
    influx: Any,
    db: str,
    url: str,
    cluster: str,
    recovery_s: float | None,
    note: str = "",
) -> FaultRow:
    """Count, record the table row, and return it (the caller asserts on it)."""
    stored = flood.stored(influx, db)
    _, dup = duplicates(url, cluster)
    row = FaultRow(scenario, flood.expected, stored, max(0, flood.expected - stored), dup, recovery_s, note)
    record(config, row)
    return row


# --- a partition ----------------------------------------------------------------------------------------------


class Proxy:
    """A TCP proxy on a loopback port in front of `target` that can partition: `cut()` black-holes every
    byte in both directions (connections stay open, as behind a dead link: the client learns of it only by
    its own timeouts), `heal()` resets the connections that lived through the cut (their streams lost bytes)
    and forwards again. Runs its own event loop in a thread; `close()` stops it."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.host = host
        self.port = 0
        self.cut_now = False
        self.dropped = 0
        self._conns: set[asyncio.StreamWriter] = set()
        self._stale: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                if self.cut_now or writer in self._stale:
                    self.dropped += len(data)
                    continue
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pair = {writer, up_writer}
        self._conns |= pair
        if self.cut_now:
            self._stale |= pair
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._conns -= pair
            self._stale -= pair

    def cut(self) -> None:
        def go() -> None:
            self.cut_now = True
            self._stale |= self._conns

        self._loop.call_soon_threadsafe(go)

    def heal(self) -> None:
        def go() -> None:
            for w in list(self._stale):
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._stale.clear()
            self.cut_now = False

        self._loop.call_soon_threadsafe(go)

    def close(self) -> None:
        def go() -> None:
            for w in list(self._conns):
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._loop.stop()

        self._loop.call_soon_threadsafe(go)
        self._thread.join(10)


@contextlib.contextmanager
def proxy(target_port: int) -> Iterator[Proxy]:
    p = Proxy(target_port)
    try:
        yield p
    finally:
        p.close()
