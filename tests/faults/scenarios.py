"""The fault scenarios of issue 13, each a function that runs real processes through one fault and returns
its row of the table (and raises when something it checks on the way fails).

They run concurrently (see conftest.py), so each owns what it breaks: its own 3-node cluster, its own
InfluxDB or nats-server, its own cluster name (stream, durable) and database on the shared ones. Each
waits on state (points stored, leaders elected, files written); the only fixed waits are the outages
themselves, whose lengths are the issue's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from hpcbus.streams import stream_name
from tests.consumer_helpers import (
    TO_LP,
    TO_SONAR,
    Process,
    Worker,
    bus_messages,
    count_points,
    js_publish,
    log_counter,
    settled,
    wait_for,
)
from tests.corpus import CORPUS
from tests.faults.harness import (
    FaultRow,
    Flood,
    Recovery,
    duplicates,
    finish,
    proxy,
    published_samples,
    record,
    start_flood,
    start_worker,
    wait_published,
)
from tests.services import InfluxDB, NatsServer, PeakRss, SlurmCluster
from tests.services.nats_cluster import NatsCluster

STORE_TIMEOUT = 300.0
"""Seconds a scenario waits for the flood to be stored after its fault (the machine may be busy)."""
FLOOD = Flood(nodes=1, samples=40)
"""40 samples of one 128-core, 4-GPU node, one a second: 50,280 lines, 45,960 counted points (1,149 per
sample: the process lines aside, see harness.py) per scenario."""


@dataclass
class Context:
    """What a scenario gets: its own directory, the shared services, the pytest config (for the table)."""

    tmp: Path
    config: pytest.Config
    influx: InfluxDB
    nats: NatsServer
    processes: list[Process] = field(default_factory=list)
    slurm: SlurmCluster | None = None
    """The suite's real Slurm, started only when a scenario that needs it is selected (`NEEDS_SLURM`)."""

    def name(self, what: str) -> tuple[str, str]:
        """(cluster, database) of the scenario's own."""
        tag = uuid.uuid4().hex[:6]
        return f"f{what}{tag}.example.org", f"fault_{what}_{tag}"

    def stop_all(self) -> None:
        for p in self.processes:
            p.stop()


def _sleep_until(deadline: float) -> None:
    """The outage itself (its length is the scenario), not a wait for state."""
    time.sleep(max(0.0, deadline - time.monotonic()))


def _mid_flood(flood: Flood, influx: Any, db: str, share: float = 0.2) -> None:
    """Wait until `share` of the flood is stored: a fault of the storing side then hits it mid-flood."""
    wait_for(lambda: flood.stored(influx, db) >= share * flood.expected, STORE_TIMEOUT, "the flood under way")


def _replicas(urls: list[str], stream: str) -> int:
    async def ask() -> int:
        nc = await nats.connect(urls)
        try:
            return int((await nc.jetstream().stream_info(stream)).config.num_replicas or 1)
        finally:
            await nc.close()

    return asyncio.run(ask())


def _outbox_episode(log: str) -> str:
    """The publisher's own account of its outage (the outbox's "working again" line)."""
    found = re.findall(r"outbox: publish: working again after ([\d.]+ s \(\d+ failed attempts\))", log)
    return f"publishing stalled {found[-1]}" if found else "no publish failures logged"


def _assert_exited_cleanly(w: Worker, timeout: float = STORE_TIMEOUT) -> None:
    """A bounded flood exits 0 once JetStream acknowledged all of it."""
    rc = w.wait(timeout)
    assert rc == 0, f"simulate exited {rc}:\n{w.log()[-3000:]}"


# --- 1: the stream leader of a 3-node cluster SIGKILLed mid-flood, restarted 30 s later --------------------


def leader_killed(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("leader")
    with NatsCluster(ctx.tmp / "cluster") as nc:
        stream = stream_name("HPCBUS", cluster)
        for i in range(2):
            start_worker(nc.url, cluster, ctx.influx.url, db, ctx.tmp / f"w{i}.log", ctx.processes)
        flood = start_flood(FLOOD, nc.url, cluster, ctx.tmp / "simulate.log", ctx.processes)
        wait_published(nc.urls[0], cluster, FLOOD, 0.25, STORE_TIMEOUT)
        assert _replicas(nc.urls, stream) == 3, "a stream on a 3-node cluster must have 3 replicas"
        leader = nc.leader(stream)
        assert flood.running(), "the leader must die mid-flood"
        nc.kill(leader)
        killed = time.monotonic()
        successor = nc.leader(stream, timeout=60)
        elected = time.monotonic() - killed
        assert successor != leader
        _sleep_until(killed + 30)
        recovery = Recovery(FLOOD, ctx.influx, db)
        nc.start(leader)
        recovery.mark()
        recovered = recovery.wait(STORE_TIMEOUT, "the flood after the leader's restart")
        _assert_exited_cleanly(flood)
        return finish(
            ctx.config,
            "1 stream leader SIGKILLed 30 s (R3)",
            FLOOD,
            ctx.influx,
            db,
            nc.urls[leader],
            cluster,
            recovered,
            f"leader n{leader} -> n{successor} within {elected:.1f} s; {_outbox_episode(flood.log())}",
        )


# --- 2: InfluxDB stopped for 60 s; InfluxDB SIGKILLed and restarted on its data directory ------------------


def influx_stopped(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("ifxstop")
    with InfluxDB(ctx.tmp / "influxdb") as influx:
        start_worker(ctx.nats.url, cluster, influx.url, db, ctx.tmp / "w.log", ctx.processes)
        flood = start_flood(FLOOD, ctx.nats.url, cluster, ctx.tmp / "simulate.log", ctx.processes)
        _mid_flood(FLOOD, influx, db)
        influx.stop()
        stopped = time.monotonic()
        _sleep_until(stopped + 60)
        recovery = Recovery(FLOOD, influx, db)
        influx.start()
        recovery.mark()
        recovered = recovery.wait(STORE_TIMEOUT, "the flood after InfluxDB came back")
        _assert_exited_cleanly(flood)
        return finish(
            ctx.config, "2a InfluxDB stopped 60 s", FLOOD, influx, db, ctx.nats.url, cluster, recovered
        )


def influx_killed(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("ifxkill")
    with InfluxDB(ctx.tmp / "influxdb") as influx:
        start_worker(ctx.nats.url, cluster, influx.url, db, ctx.tmp / "w.log", ctx.processes)
        flood = start_flood(FLOOD, ctx.nats.url, cluster, ctx.tmp / "simulate.log", ctx.processes)
        _mid_flood(FLOOD, influx, db, share=0.4)
        pid = influx.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        influx.stop()  # reaps it; the data directory stays
        recovery = Recovery(FLOOD, influx, db)
        influx.start()
        recovery.mark()
        recovered = recovery.wait(STORE_TIMEOUT, "the flood after InfluxDB's restart")
        _assert_exited_cleanly(flood)
        return finish(
            ctx.config,
            "2b InfluxDB SIGKILLed, restarted",
            FLOOD,
            influx,
            db,
            ctx.nats.url,
            cluster,
            recovered,
        )


# --- 3: a worker SIGKILLed mid-batch while two others share the durable ------------------------------------


def worker_killed(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("worker")
    config = ctx.tmp / "worker.toml"
    # A killed worker's unacked messages go to the others after ack_wait (30 s by default).
    config.write_text("[delivery]\nack_wait = 5.0\nstats_seconds = 0.2\n")
    workers = [
        start_worker(
            ctx.nats.url,
            cluster,
            ctx.influx.url,
            db,
            ctx.tmp / f"w{i}.log",
            ctx.processes,
            "--config",
            str(config),
        )
        for i in range(3)
    ]
    flood = start_flood(FLOOD, ctx.nats.url, cluster, ctx.tmp / "simulate.log", ctx.processes)
    victim = workers[0]

    def unwritten() -> int:
        """Lines taken and not yet written, from the victim's latest summary (every 0.2 s)."""
        found = re.findall(r"received lines (\d+), written lines (\d+)", victim.log())
        return int(found[-1][0]) - int(found[-1][1]) if found else 0

    def in_hand() -> bool:
        # The victim's latest summary shows flood lines taken but not yet written: mid-batch.
        received = log_counter(victim.log(), r"received (\d+),")
        return received > 2 and unwritten() > 100

    wait_for(in_hand, STORE_TIMEOUT, "the victim holding a batch", interval=0.05)
    held = unwritten()
    recovery = Recovery(FLOOD, ctx.influx, db)
    victim.signal(signal.SIGKILL)
    recovery.mark()
    victim.wait(10)
    recovered = recovery.wait(STORE_TIMEOUT, "the flood after a worker was killed")
    _assert_exited_cleanly(flood)
    assert all(w.running() for w in workers[1:]), "the other two workers must keep running"
    return finish(
        ctx.config,
        "3 worker SIGKILLed mid-batch (3 share)",
        FLOOD,
        ctx.influx,
        db,
        ctx.nats.url,
        cluster,
        recovered,
        f"ack_wait 5 s; the victim held {held} unwritten lines",
    )


# --- 4: nats-server SIGKILLed 30 s under the node producer, the producer SIGKILLed and restarted ------------

_SAMPLE = re.compile(r"sample \d+ at (\d+):")


def _sample_times(log: str) -> set[int]:
    return {int(t) for t in _SAMPLE.findall(log)}


def broker_and_producer_killed(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("spill")
    host = "faultnode4"
    spill = ctx.tmp / "spill"
    with NatsServer(ctx.tmp / "nats") as server:
        start_worker(server.url, cluster, ctx.influx.url, db, ctx.tmp / "w.log", ctx.processes)
        producer_args = [
            "-vv",
            "produce",
            "node",
            "--nats",
            server.url,
            "--cluster",
            cluster,
            "--hostname",
            host,
            "--interval",
            "1",
            "--no-processes",
            "--spill-dir",
            str(spill),
        ]
        runs = [Worker(producer_args, ctx.tmp / "producer-1.log")]
        ctx.processes.append(runs[0])
        runs[0].start(ready=None)

        def stored_times() -> set[int]:
            rows = ctx.influx.points(
                f'SELECT "value" FROM "mem_used" WHERE hostname = \'{host}\'', db, epoch="s"
            )
            return {int(r["time"]) for r in rows}

        wait_for(lambda: len(stored_times()) >= 3, STORE_TIMEOUT, "the first samples stored")
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        server.stop()
        down = time.monotonic()
        taken_before = _sample_times(runs[0].log())
        # The producer samples into its outbox (and spill directory) while the broker is away; it is killed
        # too, right after a sample reached the spill directory, 25 s into the outage.
        _sleep_until(down + 25)
        spilled = len(list(spill.glob("*.msg")))
        wait_for(lambda: len(list(spill.glob("*.msg"))) > spilled, 30, "a new sample spilled")
        runs[0].signal(signal.SIGKILL)
        runs[0].wait(10)
        outage = _sample_times(runs[0].log()) - taken_before
        assert len(outage) >= 10, f"only {len(outage)} samples taken during the outage"
        _sleep_until(down + 30)
        server.start()
        runs.append(Worker(producer_args, ctx.tmp / "producer-2.log"))
        ctx.processes.append(runs[1])
        runs[1].start(ready=None)
        back = time.monotonic()
        wait_for(
            lambda: outage <= stored_times(),
            STORE_TIMEOUT,
            lambda: f"the outage's samples: {sorted(outage - stored_times())} missing",
        )
        done = time.monotonic()
        assert runs[1].terminate() == 0
        taken = set().union(*(_sample_times(r.log()) for r in runs))
        wait_for(lambda: taken <= stored_times(), STORE_TIMEOUT, "every sample taken")
        stored = stored_times()
        _, dup = duplicates(server.url, cluster)
        row = FaultRow(
            "4 nats-server 30 s + producer SIGKILLed",
            len(taken),
            len(taken & stored),
            len(taken - stored),
            dup,
            done - back,
            f"{len(outage)} samples taken in the outage; counted: node samples (mem_used)",
        )
        assert stored == taken, f"stored but never taken: {sorted(stored - taken)}"
        record(ctx.config, row)
        return row


# --- 5: a 60 s network partition between a producer and the cluster ----------------------------------------


def partition(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("partition")
    with NatsCluster(ctx.tmp / "cluster", advertise=False) as nc, proxy(nc.members[0].port) as link:
        start_worker(nc.url, cluster, ctx.influx.url, db, ctx.tmp / "w.log", ctx.processes)
        flood = start_flood(FLOOD, link.url, cluster, ctx.tmp / "simulate.log", ctx.processes)
        wait_published(nc.urls[0], cluster, FLOOD, 0.25, STORE_TIMEOUT)
        assert _replicas(nc.urls, stream_name("HPCBUS", cluster)) == 3
        link.cut()
        cut = time.monotonic()
        assert flood.running(), "the partition must come mid-flood"
        time.sleep(5)  # what was in flight when the link was cut
        before = published_samples(nc.urls[0], cluster)
        _sleep_until(cut + 60)
        assert published_samples(nc.urls[0], cluster) == before, "nothing may cross the partition"
        assert flood.running(), "the publisher must ride out the partition"
        recovery = Recovery(FLOOD, ctx.influx, db)
        link.heal()
        recovery.mark()
        recovered = recovery.wait(STORE_TIMEOUT, "the flood after the partition healed")
        _assert_exited_cleanly(flood)
        return finish(
            ctx.config,
            "5 producer partitioned 60 s (proxy)",
            FLOOD,
            ctx.influx,
            db,
            nc.urls[0],
            cluster,
            recovered,
            f"{link.dropped} bytes black-holed; publisher: {_outbox_episode(flood.log())}",
        )


# --- 6: 2,000 bad or hostile messages mixed with valid lines ------------------------------------------------

N_BAD = 2000
"""Bad messages the influx worker must dead-letter."""
N_DEEP = 100
"""Events with 10,000-deep JSON on top: `consume influx` stores an event's JSON as an opaque string (it does
not parse it), so for it they are not bad; they must be stored unchanged and must not hurt the worker."""


def _hostile(i: int, now: int) -> tuple[str, bytes, str, int]:
    """(subject suffix, payload, kind, valid lines in it) of the i-th bad message: one bad line, and on
    `metrics` one valid line beside it."""
    valid = f"hostile_ok,hostname=h{i % 50},type=hwthread,type-id={i} value={i} {now}\n".encode()
    kinds = ("garbage", "nan", "inf", "past", "future", "tags", "mega")
    kind = "deepjson" if i >= N_BAD else kinds[i % len(kinds)]
    if kind == "tags" and i % 35 != 5:  # 50 lines of 10,000 tags (and 20 of 1 MB): not 500 MB of them
        kind = "garbage"
    if kind == "mega" and i % 70 != 6:
        kind = "nan"
    if kind == "garbage":
        bad = bytes((i * 7 + k * 13) % 256 for k in range(200)).replace(b"\n", b"\x00") + b"\n"
    elif kind == "nan":
        bad = f"hostile,hostname=x,type=node value=NaN {now}\n".encode()
    elif kind == "inf":
        bad = f"hostile,hostname=x,type=node value=-Inf {now}\n".encode()
    elif kind == "past":
        bad = f"hostile,hostname=x{i},type=node value=1 {100 + i}\n".encode()
    elif kind == "future":
        bad = f"hostile,hostname=x{i},type=node value=1 {now + 10 * 365 * 86400}\n".encode()
    elif kind == "deepjson":
        deep = "[" * 10_000 + "]" * 10_000
        event = f'job,hostname=x,type=node,function=start_job event="{deep}" {now}\n'
        return "events.job", event.encode(), kind, 0
    elif kind == "tags":
        tags = ",".join(f"t{k}=v{k}" for k in range(10_000))
        bad = f"hostile,hostname=x,type=node,{tags} value=1 {now}\n".encode()
    else:  # a 1 MB line
        bad = f"hostile,hostname=x,type=node,blob={'x' * 1_000_000} value=1 {now}\n".encode()
    return "metrics", valid + bad, kind, 1


def hostile(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("hostile")
    workers = [
        start_worker(ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / f"w{i}.log", ctx.processes)
        for i in range(2)
    ]
    peaks = [PeakRss(w.pid) for w in workers]
    # the jobs worker reads the same events (deep JSON on events.job included) and must survive them too
    jobs_args = [
        "consume",
        "jobs",
        "--nats",
        ctx.nats.url,
        "--cluster",
        cluster,
        "--influx-url",
        ctx.influx.url,
    ]
    jobs = Worker([*jobs_args, "--db", db, "--state-file", str(ctx.tmp / "jobs.state")], ctx.tmp / "jobs.log")
    ctx.processes.append(jobs)
    jobs.start(timeout=60)
    now = int(time.time())
    n_valid_msgs = 2000
    sent_at = time.monotonic()

    async def publish() -> tuple[dict[str, str], int]:
        kinds: dict[str, str] = {}
        valid_lines = 0
        conn = await nats.connect(ctx.nats.url, max_reconnect_attempts=-1)
        js = conn.jetstream()
        try:
            for i in range(max(N_BAD + N_DEEP, n_valid_msgs)):
                if i < n_valid_msgs:
                    body = "".join(
                        f"hostile_ok,hostname=v{i},type=hwthread,type-id={k} value={k} {now}\n"
                        for k in range(5)
                    )
                    await js.publish(f"{cluster}.metrics", body.encode(), headers={"Nats-Msg-Id": f"ok:{i}"})
                    valid_lines += 5
                if i < N_BAD + N_DEEP:
                    suffix, payload, kind, good = _hostile(i, now)
                    ack = await js.publish(
                        f"{cluster}.{suffix}", payload, headers={"Nats-Msg-Id": f"bad:{i}"}, timeout=30
                    )
                    # the dead letter's id names the original's stream sequence (hpcbus.outlet.dedup_id)
                    kinds[f"dlq:{ack.stream}:{ack.seq}"] = kind
                    valid_lines += good
        finally:
            await conn.close()
        return kinds, valid_lines

    kinds, valid_lines = asyncio.run(publish())

    def stored() -> int:
        rows = ctx.influx.points('SELECT count("value") FROM "hostile_ok"', db)
        return int(rows[0]["count"]) if rows else 0

    wait_for(
        lambda: stored() >= valid_lines, STORE_TIMEOUT, lambda: f"{stored()} of {valid_lines} valid lines"
    )
    stored_after = time.monotonic() - sent_at

    def dead_letters() -> dict[str, str]:
        out: dict[str, str] = {}
        for m in bus_messages(ctx.nats.url, cluster, kind="HPCBUS_DLQ"):
            headers = m.headers or {}
            original = headers.get("Hpcbus-Original") or headers.get("Nats-Msg-Id", "")
            out[original] = headers.get("Hpcbus-Problems", "")
        return out

    wait_for(
        lambda: len(dead_letters()) >= N_BAD, STORE_TIMEOUT, lambda: f"{len(dead_letters())} dead letters"
    )
    letters = dead_letters()

    def deep_events() -> list[dict[str, Any]]:
        return ctx.influx.points('SELECT "event" FROM "job" WHERE hostname = \'x\'', db)

    # the deep-JSON events were published last: once they are stored, the workers have read everything
    events = wait_for(lambda: len(deep_events()) >= N_DEEP and deep_events(), STORE_TIMEOUT, "deep events")
    assert len(events) == N_DEEP and all(len(e["event"]) == 20_000 for e in events), "deep JSON kept as sent"
    for w in [*workers, jobs]:
        assert w.running(), f"a worker died:\n{w.log()[-3000:]}"
    rss = [p.bytes for p in peaks]
    deep = {k for k, kind in kinds.items() if kind == "deepjson"}
    missing = sorted(set(kinds) - deep - set(letters))
    by_kind: dict[str, int] = {}
    for k in missing:
        by_kind[kinds[k]] = by_kind.get(kinds[k], 0) + 1
    row = FaultRow(
        "6 2,000 hostile messages + valid lines",
        valid_lines,
        stored(),
        max(0, valid_lines - stored()),
        duplicates(ctx.nats.url, cluster, marker=b"hostile_ok")[1],
        None,
        f"valid lines stored {stored_after:.0f} s after the first message; {len(letters)} dead letters, {len(events)} deep-JSON events kept opaque; worker peak RSS {', '.join(f'{r / 2**20:.0f} MB' for r in rss)}",
    )
    record(ctx.config, row)
    assert not missing, f"bad messages not dead-lettered, by kind: {by_kind}"
    assert not set(letters) & deep, "deep JSON events are not bad for consume influx"
    assert all(reason.strip() for reason in letters.values()), "every dead letter carries its reason"
    assert max(rss) < 400 * 2**20, f"worker memory: {rss}"
    return row


# --- 7: a full stream (`discard: old`) while no worker reads: the loss is counted exactly ------------------


FULL_STREAM_BYTES = 256 * 1024
"""The small stream of scenario 7: 2,000 messages of about 300 bytes fill it more than twice."""


async def _positions(url: str, stream: str, durable: str) -> tuple[int, int]:
    """(the stream's last sequence, the durable's last delivered stream sequence)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.consumer_info(stream, durable)
        delivered = info.delivered.stream_seq if info.delivered else 0
        return int((await js.stream_info(stream)).state.last_seq), int(delivered)
    finally:
        await nc.close()


def stream_full(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("full")
    stream = stream_name("HPCBUS", cluster)
    limit = ("--stream-max-bytes", str(FULL_STREAM_BYTES))
    first = start_worker(ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / "w1.log", ctx.processes, *limit)
    assert first.terminate(20) == 0  # its durable stays; no worker reads from now on
    # What the durable had not yet delivered before the fill (the worker's own last self-telemetry).
    last, delivered = asyncio.run(_positions(ctx.nats.url, stream, "hpcbus-influx"))
    n_msgs, per_msg, now = 2000, 5, int(time.time())

    async def publish() -> None:
        conn = await nats.connect(ctx.nats.url)
        js = conn.jetstream()
        try:
            for i in range(n_msgs):
                body = "".join(
                    f"fullstream,hostname=h{i},type=hwthread,type-id={k} value={k} {now}\n"
                    for k in range(per_msg)
                )
                await js.publish(f"{cluster}.metrics", body.encode(), headers={"Nats-Msg-Id": f"full:{i}"})
        finally:
            await conn.close()

    asyncio.run(publish())
    published = n_msgs * per_msg
    started = time.monotonic()
    second = start_worker(
        ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / "w2.log", ctx.processes, *limit
    )
    wait_for(lambda: settled(ctx.nats.url, cluster, "hpcbus-influx"), STORE_TIMEOUT, "the worker caught up")
    caught_up = time.monotonic() - started
    stored = count_points(ctx.influx, db, "fullstream")
    lost_lines = published - stored
    counted = sum(int(n) for n in re.findall(r"discarded (?:up to )?(\d+) messages?", second.log()))
    row = FaultRow(
        "7 stream full (discard old), no worker",
        published,
        stored,
        lost_lines,
        duplicates(ctx.nats.url, cluster, marker=b"fullstream")[1],
        caught_up,
        f"{lost_lines // per_msg} messages discarded unread, counted by the worker: {counted} "
        f"({last - delivered} of its own telemetry among them); WARNING + hpcbus_discarded_unread",
    )
    record(ctx.config, row)
    assert lost_lines > 0 and lost_lines % per_msg == 0, "the fill must discard whole unread messages"
    assert counted == lost_lines // per_msg + (last - delivered), second.log()[-3000:]
    assert "stream " + stream + " discarded" in second.log()
    return row


# --- 8: a full stream with `stream_discard = "new"`: refused, held by the producer, nothing lost ----------


REFUSING_STREAM_BYTES = 2 * 2**20
"""Scenario 8's stream: about 20 of the flood's samples (a sample is about 100 KB of lines)."""


def _longest_stall(log: str) -> str:
    """The publisher's longest outage episode (the full stream's; later ones are the stream filling again)."""
    found = re.findall(r"outbox: publish: working again after ([\d.]+) s \((\d+) failed attempts\)", log)
    if not found:
        return "no publish failures logged"
    seconds, attempts = max(found, key=lambda f: float(f[0]))
    return f"the producer held its samples for {seconds} s ({attempts} refused attempts)"


def stream_full_refused(ctx: Context) -> FaultRow:
    cluster, db = ctx.name("refuse")
    opts = ("--stream-max-bytes", str(REFUSING_STREAM_BYTES), "--stream-discard", "new")
    first = start_worker(ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / "w1.log", ctx.processes, *opts)
    assert first.terminate(20) == 0  # its durable stays; no worker reads while the flood fills the stream
    flood = Flood(nodes=1, samples=30)
    simulate = start_flood(flood, ctx.nats.url, cluster, ctx.tmp / "simulate.log", ctx.processes, *opts)
    wait_for(lambda: "maximum bytes exceeded" in simulate.log(), STORE_TIMEOUT, "the full stream refusing")
    _sleep_until(time.monotonic() + 10)  # the outage: the producer holds its backlog while refused
    recovery = Recovery(flood, ctx.influx, db)
    start_worker(ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / "w2.log", ctx.processes, *opts)
    recovery.mark()
    recovered = recovery.wait(STORE_TIMEOUT, "the held samples stored")
    _assert_exited_cleanly(simulate)
    wait_for(lambda: flood.stored(ctx.influx, db) >= flood.expected, STORE_TIMEOUT, "the whole flood stored")
    return finish(
        ctx.config,
        "8 stream full (discard new): refused",
        flood,
        ctx.influx,
        db,
        ctx.nats.url,
        cluster,
        recovered,
        f"publishing refused (503 maximum bytes exceeded) until the worker caught up; {_longest_stall(simulate.log())}",
    )


# --- 9: a 253-character host name through `consume sonar --directory` -----------------------------------------


LONG_HOST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
"""A valid FQDN of 253 characters: `0+sample-<host>.json` would be 267 bytes (a file name may have 255)."""


def poison_name(ctx: Context) -> FaultRow:
    from hpcbus.schemas.sonar import decode_envelope, encode_envelope

    cluster, _ = ctx.name("poison")
    tree = ctx.tmp / "tree"
    args = ["consume", "sonar", "--nats", ctx.nats.url, "--cluster", cluster, "--to", "both"]
    worker = Worker([*args, "--grace", "2", "--directory", str(tree)], ctx.tmp / "sonar.log")
    ctx.processes.append(worker)
    worker.start(timeout=60)
    raw = json.loads((CORPUS / "sonar/jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_text().splitlines()[0])
    hosts = [f"n{i}.poison.example.org" for i in range(20)]
    hosts.insert(5, LONG_HOST)  # 15 hosts behind it
    messages = []
    for host in hosts:
        raw["data"]["attributes"]["node"] = host
        envelope = encode_envelope(decode_envelope(json.dumps(raw).encode(), expect="sample"))
        messages.append((f"{cluster}.sonar.sample", envelope))
    started = time.monotonic()
    js_publish(ctx.nats.url, messages)

    def lines() -> list[str]:
        return [line for p in tree.rglob("0+sample-*.json") for line in p.read_text().splitlines()]

    wait_for(
        lambda: len(lines()) >= len(hosts) and settled(ctx.nats.url, cluster, TO_SONAR, TO_LP),
        STORE_TIMEOUT,
        lambda: f"{len(lines())} of {len(hosts)} files",
    )
    done = time.monotonic() - started
    written = lines()
    names = sorted(p.name for p in tree.rglob("0+sample-*.json"))
    row = FaultRow(
        "9 a 253-character host name (Sonar tree)",
        len(hosts),
        len(set(written)),
        len(hosts) - len(set(written)),
        len(written) - len(set(written)),
        done,
        f"its file name shortened to {max(len(n.encode()) for n in names)} bytes; the {len(hosts) - 6} hosts "
        "behind it written; nothing pending",
    )
    record(ctx.config, row)
    assert len(names) == len(hosts) and worker.running()
    assert "File name too long" not in worker.log()
    return row


# --- 10, 11: first start: the gateway takes posts before any worker has run (issue 29 items 3, 11) ---------


FIRST_START_POSTS = 40
FIRST_START_LINES = 1000
"""Posts of 1,000 lines (about 75 KB, one message each) sent to the gateway of a new cluster."""

FIRST_START_BYTES = 1_000_000
"""Scenario 10's stream: about 13 of the posts; the rest of them it discards before any worker runs."""


def _first_start_bodies(now: int) -> list[bytes]:
    """One body per post, its lines distinct InfluxDB points (post, type-id)."""
    return [
        "".join(
            f"firststart,hostname=p{post},type=hwthread,type-id={k} value={k} {now}\n"
            for k in range(FIRST_START_LINES)
        ).encode()
        for post in range(FIRST_START_POSTS)
    ]


def _stream_seqs(url: str, stream: str) -> tuple[int, int]:
    """(first sequence, last sequence) of `stream`."""

    async def ask() -> tuple[int, int]:
        nc = await nats.connect(url)
        try:
            state = (await nc.jetstream().stream_info(stream)).state
            return int(state.first_seq), int(state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(ask())


def first_start_old(ctx: Context) -> FaultRow:
    """`discard: old`: the posts were all answered 204 and the stream discarded most of them before the
    first worker's durable existed; that worker counts them (before: 0 counted, no WARNING)."""
    from tests.test_gateway import http, start_gateway

    cluster, db = ctx.name("firstold")
    stream = stream_name("HPCBUS", cluster)
    limit = ("--stream-max-bytes", str(FIRST_START_BYTES))
    _, url = start_gateway(ctx.processes, ctx.tmp, ctx.nats.url, "--cluster", cluster, *limit)
    answers = [
        http(f"{url}/write?db=x&precision=s", body).status for body in _first_start_bodies(int(time.time()))
    ]
    assert answers == [204] * FIRST_START_POSTS, answers
    first, last = _stream_seqs(ctx.nats.url, stream)
    assert last == FIRST_START_POSTS and first > 1, (first, last)  # one message a post; the oldest gone
    started = time.monotonic()
    worker = start_worker(
        ctx.nats.url,
        cluster,
        ctx.influx.url,
        db,
        ctx.tmp / "worker.log",
        ctx.processes,
        *limit,
        "--stats-seconds",
        "1",
    )
    wait_for(lambda: settled(ctx.nats.url, cluster, "hpcbus-influx"), STORE_TIMEOUT, "the worker caught up")
    caught_up = time.monotonic() - started
    published = FIRST_START_POSTS * FIRST_START_LINES
    stored = count_points(ctx.influx, db, "firststart")
    said = re.findall(
        r"discarded (?:up to )?(\d+) messages? \(sequences 1\.\.(\d+)\) before durable hpcbus-influx had any",
        worker.log(),
    )

    # The worker's self-telemetry (every second, written to InfluxDB by the worker itself; 0 before the fix),
    # read once a report says it delivered: its discard check comes before its first fetch.
    def reported(counter: str) -> int:
        rows = ctx.influx.points(f'SELECT max("value") FROM "hpcbus_{counter}"', db)
        return int(rows[0]["max"]) if rows else 0

    wait_for(lambda: reported("delivered"), STORE_TIMEOUT, "the worker's self-telemetry in InfluxDB")
    counted = reported("discarded_unread")
    row = FaultRow(
        "10 first start (discard old): gateway first",
        published,
        stored,
        published - stored,
        duplicates(ctx.nats.url, cluster, marker=b"firststart")[1],
        caught_up,
        f"all {FIRST_START_POSTS} posts answered 204; {first - 1} of their messages discarded before the first "
        f"worker's durable existed, counted by it: hpcbus_discarded_unread {counted} + WARNING (was 0, none)",
    )
    record(ctx.config, row)
    assert said == [(str(first - 1), str(first - 1))], worker.log()[-3000:]
    assert counted == first - 1
    assert row.lost == (first - 1) * FIRST_START_LINES, row  # every line not stored is in a counted message
    return row


def first_start_new(ctx: Context) -> FaultRow:
    """`stream_discard = "new"`: before any worker's durable exists the stream would acknowledge a post and
    keep nothing, so the gateway answers 503 (before: 204, 0 stored); once the worker started, every post a
    client retries is stored."""
    from tests.test_gateway import http, start_gateway

    cluster, db = ctx.name("firstnew")
    stream = stream_name("HPCBUS", cluster)
    opts = ("--stream-discard", "new", "--stream-max-bytes", "5000000")
    _, url = start_gateway(ctx.processes, ctx.tmp, ctx.nats.url, "--cluster", cluster, *opts)
    bodies = _first_start_bodies(int(time.time()))
    early = [http(f"{url}/write?db=x&precision=s", body) for body in bodies[:5]]
    assert [a.status for a in early] == [503] * 5, [a.body for a in early]
    assert all("has none yet" in a.json()["error"] and a.headers.get("Retry-After") for a in early)
    assert _stream_seqs(ctx.nats.url, stream)[1] == 0  # nothing acknowledged, nothing dropped
    start_worker(ctx.nats.url, cluster, ctx.influx.url, db, ctx.tmp / "worker.log", ctx.processes, *opts)
    started = time.monotonic()
    refused = 0
    accepted_after: float | None = None
    for body in bodies:  # a client retrying each post until it is answered 204 (Telegraf, influxdb-client)

        def post(body: bytes = body) -> bool:
            nonlocal refused
            status = http(f"{url}/write?db=x&precision=s", body).status
            refused += status == 503
            assert status in (204, 503), status
            return status == 204

        wait_for(post, 60, "the post accepted", interval=0.2)
        if accepted_after is None:
            accepted_after = time.monotonic() - started
    published = FIRST_START_POSTS * FIRST_START_LINES
    wait_for(
        lambda: count_points(ctx.influx, db, "firststart") >= published,
        STORE_TIMEOUT,
        lambda: f"{count_points(ctx.influx, db, 'firststart')} of {published} lines stored",
    )
    stored = count_points(ctx.influx, db, "firststart")
    row = FaultRow(
        "11 first start (discard new): gateway first",
        published,
        stored,
        published - stored,
        0,  # acknowledged messages leave an interest stream: duplicates show as points, counted exactly
        accepted_after,
        f"5 posts before any durable answered 503 (the stream took nothing; was 204, 0 stored); {refused} "
        "more 503s until the gateway saw the worker's durable; every acknowledged line stored",
    )
    record(ctx.config, row)
    return row


# --- 12: two InfluxDBs, each written by its own worker group; one of them down while the flood goes on ------


INFLUX_DOWN_S = float(os.environ.get("HPCBUS_FAULT_INFLUX_DOWN", "45"))
"""Seconds the second InfluxDB of scenario 12 is down. The issue's 5 minutes were measured with
`HPCBUS_FAULT_INFLUX_DOWN=300` (docs/scaling.md, "Two InfluxDBs"); the suite's default keeps its run short."""
LAG_LIMIT_S = 30.0
"""Most seconds the InfluxDB that stays up may trail the bus during the other's outage."""


def _newest(influx: Any, db: str, flood: Flood) -> int:
    """Epoch second of the flood's newest `cpu_used` point in `influx` (0: none yet)."""
    q = f'SELECT last("value") FROM "cpu_used" WHERE hostname =~ /^{flood.prefix}/'
    rows = influx.points(q, db, epoch="s")
    return int(rows[0]["time"]) if rows else 0


def _newest_on_bus(url: str, cluster: str) -> int:
    """Epoch second of the newest sample the stream holds (its `events.sample` skeleton line's time)."""

    async def ask() -> int:
        nc = await nats.connect(url)
        try:
            msg = await nc.jetstream().get_last_msg(
                stream_name("HPCBUS", cluster), f"{cluster}.events.sample"
            )
        finally:
            await nc.close()
        stamp = int((msg.data or b"0").split()[-1])
        while stamp > 10**11:  # ns, us or ms
            stamp //= 1000
        return stamp

    return asyncio.run(ask())


def two_influx(ctx: Context) -> tuple[FaultRow, FaultRow]:
    """Two `consume influx` groups, durables `hpcbus-influx` (InfluxDB A, the shared one) and
    `hpcbus-influx-b` (B, this scenario's own), each naming the other in `[delivery] peers`. B is stopped
    mid-flood for `INFLUX_DOWN_S` while the producer keeps publishing: A keeps up throughout (every 2 s during the outage
    its newest point is compared with the newest sample on the bus), the stream keeps B's backlog in B's durable, and B catches up
    after it returns. Rows 12a (A) and 12b (B), each with its exact count."""
    cluster, db = ctx.name("twoifx")
    down = INFLUX_DOWN_S
    flood = Flood(nodes=1, samples=int(down) + 30)  # the producer still publishes when B returns
    url = ctx.nats.url
    with InfluxDB(ctx.tmp / "influxdb-b") as influx_b:
        start_worker(
            url, cluster, ctx.influx.url, db, ctx.tmp / "a.log", ctx.processes, "--peers", "hpcbus-influx-b"
        )
        start_worker(
            url,
            cluster,
            influx_b.url,
            db,
            ctx.tmp / "b.log",
            ctx.processes,
            "--durable",
            "hpcbus-influx-b",
            "--peers",
            "hpcbus-influx",
        )
        simulate = start_flood(flood, url, cluster, ctx.tmp / "simulate.log", ctx.processes)
        per_sample = sum(flood.per_sample.values())
        wait_for(lambda: flood.stored(influx_b, db) >= 10 * per_sample, STORE_TIMEOUT, "B under way")
        influx_b.stop()
        stopped = time.monotonic()
        lags: list[int] = []
        while time.monotonic() < stopped + down:
            lags.append(_newest_on_bus(url, cluster) - _newest(ctx.influx, db, flood))
            _sleep_until(min(stopped + down, time.monotonic() + 2.0))  # the outage itself
        assert simulate.running(), "the producer must publish throughout the outage"
        recovery = Recovery(flood, influx_b, db)
        influx_b.start()
        recovery.mark()
        recovered = recovery.wait(STORE_TIMEOUT, "InfluxDB B catching up")
        _assert_exited_cleanly(simulate)
        wait_for(lambda: flood.stored(ctx.influx, db) >= flood.expected, STORE_TIMEOUT, "the flood in A")
        up = finish(
            ctx.config,
            "12a two InfluxDBs: the one that stays up",
            flood,
            ctx.influx,
            db,
            url,
            cluster,
            None,
            f"durable hpcbus-influx; during the other's {down:.0f} s outage its newest point trailed the "
            f"bus by at most {max(lags)} s ({len(lags)} looks)",
        )
        back = finish(
            ctx.config,
            f"12b two InfluxDBs: one down {down:.0f} s",
            flood,
            influx_b,
            db,
            url,
            cluster,
            recovered,
            f"durable hpcbus-influx-b; {down:.0f} s of samples caught up after InfluxDB B returned",
        )
    assert max(lags) <= LAG_LIMIT_S, f"InfluxDB A trailed the bus by {max(lags)} s while B was down: {lags}"
    return up, back


# --- 13, 14: the active `consume jobs` of an active/standby pair SIGKILLed, or paused past its lease ---------

PAIR_TTL = 5
"""The pair's `[jobs] lease_ttl` (s): the standby must hold the role within it plus 10 s of a kill."""
PAIR_JOBS = 12
"""Slurm jobs of two nodes each, ten samples each, on the pair's cluster and on the reference's."""


def _jobs_worker(ctx: Context, url: str, cluster: str, db: str, name: str, *extra: str) -> Worker:
    args = [
        "consume",
        "jobs",
        "--nats",
        url,
        "--cluster",
        cluster,
        "--influx-url",
        ctx.influx.url,
        "--db",
        db,
    ]
    args += ["--grace", "0", "--ack-wait", "3", "--window", "6", "--stats-seconds", "1", *extra]
    w = Worker(args, ctx.tmp / f"{name}.log")
    ctx.processes.append(w)
    return w


def _pair_worker(ctx: Context, url: str, cluster: str, db: str, name: str) -> Worker:
    disk = ctx.tmp / name  # its local disk: the state file a `file` worker would keep
    return _jobs_worker(
        ctx, url, cluster, db, name, "--state", "jetstream", "--lease-ttl", str(PAIR_TTL),
        "--state-file", str(disk / "jobs.state"),
    )  # fmt: skip


def lease_entry(url: str, cluster: str, role: str = "jobs") -> tuple[int, str]:
    """(revision, holder) of the cluster's `role` lease ((0, "") when nobody holds it)."""
    from nats.js.errors import KeyNotFoundError

    from hpcbus.streams import roles_bucket

    async def read() -> tuple[int, str]:
        conn = await nats.connect(url)
        try:
            kv = await conn.jetstream().key_value(roles_bucket(cluster))
            entry = await kv.get(f"lease.{role}")
            return entry.revision or 0, json.loads(entry.value or b"{}").get("holder", "")
        except KeyNotFoundError:
            return 0, ""
        finally:
            await conn.close()

    return asyncio.run(read())


def _wrote_nothing(
    one: str, cluster: str, role: str, a: Worker, b: Worker, offset: int, revision: int
) -> None:
    """The resumed holder A did not take the role again, and no state write of it was stored after B took the
    role (at lease `revision`); B holds it still."""
    after = a.log()[offset:]
    assert "holds the role now" not in after, after
    stale = _fences_after(one, cluster, revision, revision, role=role)
    assert stale == 0, f"{stale} state writes of the paused holder were stored after the takeover"
    assert lease_entry(one, cluster, role)[1].endswith(f":{b.pid}")


def _paused_row(
    ctx: Context, what: str, published: int, counts: tuple[int, int, int], takeover: float, let_go: float
) -> FaultRow:
    """The row of a holder paused past its TTL (`_pause_past_ttl`, `_wrote_nothing`), recorded."""
    row = FaultRow(
        f"{what} holder SIGSTOPped {2 * PAIR_TTL} s (pair, R3)", published, *counts, takeover,
        f"resumed: let go within {let_go:.1f} s, 0 state writes stored after the takeover",
    )  # fmt: skip
    record(ctx.config, row)
    return row


def _pause_past_ttl(
    one: str, cluster: str, role: str, a: Worker, b: Worker, paused: float
) -> tuple[float, int, int, float]:
    """A was SIGSTOPped at `paused`: B takes the role, A stays paused for twice the TTL, is resumed and lets
    go. (takeover s, B's lease revision, A's log offset at the resume, s A took to let go)."""
    b.wait_log("holds the role now", timeout=PAIR_TTL + 10)
    takeover = time.monotonic() - paused
    revision, holder = lease_entry(one, cluster, role)
    assert holder.endswith(f":{b.pid}"), holder
    _sleep_until(paused + 2 * PAIR_TTL)  # paused well past its TTL (the fault itself)
    offset = len(a.log())
    a.signal(signal.SIGCONT)
    resumed = time.monotonic()
    a.wait_log("no longer holds the role", timeout=10, offset=offset)
    return takeover, revision, offset, time.monotonic() - resumed


def _jobs_input(cluster: str, t0: int) -> list[list[tuple[str, bytes]]]:
    from tests.test_consume_jobs_pair import job_messages

    return [job_messages(cluster, 700 + j, t0, [f"n{2 * j}", f"n{2 * j + 1}"]) for j in range(PAIR_JOBS)]


def _summary_counts(url: str, cluster: str) -> dict[str, int]:
    """job -> summary events stored for it (more than one: a duplicate)."""
    out: dict[str, int] = {}
    for msg in bus_messages(url, cluster, f"{cluster}.events.jobsummary"):
        for text in (msg.data or b"").decode().splitlines():
            job = text.split(",job=", 1)[1].split(" ", 1)[0]
            out[job] = out.get(job, 0) + 1
    return out


def _compare_with_reference(ctx: Context, url: str, pair: str, reference: str) -> tuple[int, int, int]:
    """(summaries equal to the undisturbed worker's, missing or different, duplicated)."""
    from tests.test_consume_jobs_pair import comparable

    def all_of(cluster: str) -> dict[str, dict[str, Any]] | None:
        found = _summaries(url, cluster)
        return found if len(found) >= PAIR_JOBS else None

    want = comparable(wait_for(lambda: all_of(reference), STORE_TIMEOUT, "the reference's summaries"))
    got = comparable(wait_for(lambda: all_of(pair), STORE_TIMEOUT, "the pair's summaries"))
    equal = sum(1 for job, summary in want.items() if got.get(job) == summary)
    duplicated = sum(n - 1 for n in _summary_counts(url, pair).values())
    return equal, PAIR_JOBS - equal, duplicated


def _summaries(url: str, cluster: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for msg in bus_messages(url, cluster, f"{cluster}.events.jobsummary"):
        for text in (msg.data or b"").decode().splitlines():
            body = text.partition(' event="')[2].rsplit('" ', 1)[0].replace('\\"', '"').replace("\\\\", "\\")
            event = json.loads(body)
            out[event["job"]] = event
    return out


def _publish_part(
    url: str, clusters: tuple[str, str], jobs: list[list[tuple[str, bytes]]], part: slice
) -> None:
    """The `part` of every job's messages, to the pair's cluster and the same to the reference's."""
    pair, reference = clusters
    messages = [m for msgs in jobs for m in msgs[part]]
    js_publish(
        url,
        messages
        + [
            (s.replace(pair, reference, 1), p.replace(pair.encode(), reference.encode())) for s, p in messages
        ],
    )


@dataclass
class PairRun:
    """A jobs worker pair and its reference mid-work, the fault just done to A (`_pair_faulted`)."""

    url: str
    """One member of the cluster (the workers have all of them)."""
    pair: str
    reference: str
    a: Worker
    b: Worker
    jobs: list[list[tuple[str, bytes]]]
    at: float
    """When the fault came (monotonic)."""


@contextlib.contextmanager
def _pair_faulted(ctx: Context, what: str, fault: signal.Signals) -> Iterator[PairRun]:
    """On a 3-node cluster of its own: the reference worker (one cluster, a state file) and the pair (another
    cluster: A holding the role, B standing by) started; the jobs' starts and four samples taken and
    acknowledged by A, three more samples published (in A's hands), then `fault` sent to A."""
    pair, db = ctx.name(what)
    reference = f"ref{pair}"
    with NatsCluster(ctx.tmp / "cluster") as nc:
        url, one = nc.url, nc.urls[0]
        _jobs_worker(
            ctx, url, reference, db, "reference", "--state-file", str(ctx.tmp / "reference.state")
        ).start()
        a = _pair_worker(ctx, url, pair, db, "a").start("holds the role now", timeout=60)
        b = _pair_worker(ctx, url, pair, db, "b").start(None)
        b.wait_log("standing by", timeout=60)
        jobs = _jobs_input(pair, int(time.time()) - 900)
        _publish_part(one, (pair, reference), jobs, slice(0, 5))
        wait_for(lambda: settled(one, pair, "hpcbus-jobs"), STORE_TIMEOUT, "A has taken the first part")
        _publish_part(one, (pair, reference), jobs, slice(5, 8))
        a.signal(fault)
        yield PairRun(one, pair, reference, a, b, jobs, time.monotonic())


def jobs_active_killed(ctx: Context) -> FaultRow:
    with _pair_faulted(ctx, "jobspair", signal.SIGKILL) as run:
        one, pair, reference, a, b, jobs, killed = (
            run.url, run.pair, run.reference, run.a, run.b, run.jobs, run.at
        )  # fmt: skip
        a.wait(10)
        disk = ctx.tmp / "a"
        assert not disk.exists(), "a jetstream worker keeps no local state"  # its disk gone: nothing there
        b.wait_log("holds the role now", timeout=PAIR_TTL + 10)
        takeover = time.monotonic() - killed
        assert takeover <= PAIR_TTL + 10, takeover
        _publish_part(one, (pair, reference), jobs, slice(8, None))  # the last samples and the stops
        equal, lost, duplicated = _compare_with_reference(ctx, one, pair, reference)
        caught = re.search(r"caught up on stream \S+ ([\d.]+) s after taking over", b.log())
    row = FaultRow(
        "13 active consume jobs SIGKILLed (pair, R3)", PAIR_JOBS, equal, lost, duplicated, takeover,
        f"lease {PAIR_TTL} s; summaries = an undisturbed worker's; caught up {caught.group(1) if caught else '?'} s after",
    )  # fmt: skip
    record(ctx.config, row)
    return row


def _fences_after(url: str, cluster: str, since_seq: int, below: int, role: str = "jobs") -> int:
    """State entries of the pair stored after stream sequence `since_seq` by a writer holding a lease
    revision below `below` (the old holder's, `hpcbus.lease.LEASE_HEADER`): what a paused holder wrote after
    the takeover."""
    from hpcbus.lease import LEASE_HEADER
    from hpcbus.streams import roles_bucket

    async def count() -> int:
        conn = await nats.connect(url)
        try:
            kv = await conn.jetstream().key_value(roles_bucket(cluster))
            found = 0
            watcher = await kv.watch(f"state.{role}.>", include_history=True)
            while (entry := await watcher.updates(timeout=10)) is not None:
                if (entry.revision or 0) <= since_seq:
                    continue
                msg = await conn.jetstream().get_msg(f"KV_{roles_bucket(cluster)}", entry.revision)
                fence = int((msg.headers or {}).get(LEASE_HEADER, "0"))
                found += fence < below
            await watcher.stop()
            return found
        finally:
            await conn.close()

    return asyncio.run(count())


def jobs_holder_paused(ctx: Context) -> FaultRow:
    with _pair_faulted(ctx, "jobspause", signal.SIGSTOP) as run:
        one, pair, reference, a, b, jobs, paused = (
            run.url, run.pair, run.reference, run.a, run.b, run.jobs, run.at
        )  # fmt: skip
        takeover, revision, offset, let_go = _pause_past_ttl(one, pair, "jobs", a, b, paused)
        _publish_part(one, (pair, reference), jobs, slice(8, None))
        equal, lost, duplicated = _compare_with_reference(ctx, one, pair, reference)
        assert "consuming" not in a.log()[offset:]
        _wrote_nothing(one, pair, "jobs", a, b, offset, revision)
    return _paused_row(ctx, "14 consume jobs", PAIR_JOBS, (equal, lost, duplicated), takeover, let_go)


OCS_JOBS = 420
"""Jobs in the accounting file of the OCS pair's rows: 10 before, 390 around the fault, 20 after it."""


def _ocs_side(ctx: Context, url: str, cluster: str, acct: Path, name: str) -> Worker:
    args = [
        "produce", "ocs", "--nats", url, "--cluster", cluster, "--accounting", str(acct),
        "--state", "jetstream", "--lease-ttl", str(PAIR_TTL), "--state-file", str(ctx.tmp / name / "ocs.state"),
        "--interval", "0.1", "--max-chunk-bytes", "3000", "--stream-max-bytes", str(64 << 20),
    ]  # fmt: skip
    w = Worker(args, ctx.tmp / f"{name}.log")
    ctx.processes.append(w)
    return w


def _ocs_row(url: str, cluster: str) -> tuple[int, int, int]:
    """(stored, lost, duplicated) of the pair's jobs: distinct stop_jobs stored, jobs of the file without
    one, and every stop_job, start_job and Sonar job record stored more than once."""
    from tests.test_producer_pairs import stream

    bus = stream(url, cluster)()
    stops = bus.stop_ids()
    starts = [s["jobId"] for s in bus.starts]
    stored = len(set(stops))
    duplicated = sum(len(x) - len(set(x)) for x in (stops, starts, bus.jobs))
    return stored, OCS_JOBS - stored, duplicated


@contextlib.contextmanager
def _ocs_pair_faulted(
    ctx: Context, what: str, fault: signal.Signals
) -> Iterator[tuple[str, str, Worker, Worker, Path, float]]:
    """On a 3-node cluster of its own: the `produce ocs` pair (A holding the role, B standing by) following a
    growing accounting file; `fault` sent to A while it works through 390 new lines. Yields (a member's
    URL, the cluster, A, B, the file, when the fault came)."""
    from tests.test_ocs_producer import append, write
    from tests.test_ocs_producer import record as line
    from tests.test_producer_pairs import stream

    cluster, _ = ctx.name(what)
    acct = ctx.tmp / f"{what}.jsonl"
    write(acct, *(line(job) for job in range(1, 11)))
    with NatsCluster(ctx.tmp / "cluster") as nc:
        url, one = nc.url, nc.urls[0]
        bus = stream(one, cluster)
        a = _ocs_side(ctx, url, cluster, acct, "a").start("holds the role now", timeout=60)
        b = _ocs_side(ctx, url, cluster, acct, "b").start(None)
        b.wait_log("standing by", timeout=60)
        wait_for(lambda: len(bus().stops) >= 10, STORE_TIMEOUT, "A publishes the first ten jobs")
        append(acct, "".join(line(job) + "\n" for job in range(11, 401)))
        wait_for(lambda: len(bus().stops) > 40, STORE_TIMEOUT, "A is in the middle of the new lines")
        a.signal(fault)
        yield one, cluster, a, b, acct, time.monotonic()


def ocs_active_killed(ctx: Context) -> FaultRow:
    from tests.test_ocs_producer import append
    from tests.test_ocs_producer import record as line
    from tests.test_producer_pairs import stream

    with _ocs_pair_faulted(ctx, "ocspair", signal.SIGKILL) as (one, cluster, a, b, acct, killed):
        a.wait(10)
        append(acct, "".join(line(job) + "\n" for job in range(401, OCS_JOBS + 1)))
        b.wait_log("holds the role now", timeout=PAIR_TTL + 10)
        takeover = time.monotonic() - killed
        assert takeover <= PAIR_TTL + 10, takeover
        wait_for(
            lambda: len(set(stream(one, cluster)().stop_ids())) >= OCS_JOBS, STORE_TIMEOUT, "B: every job"
        )
        stored, lost, duplicated = _ocs_row(one, cluster)
        redone = re.search(r"publishing the (\d+) messages the previous holder had written", b.log())
    row = FaultRow(
        "15 active produce ocs SIGKILLed (pair, R3)", OCS_JOBS, stored, lost, duplicated, takeover,
        f"lease {PAIR_TTL} s; growing accounting file; {redone.group(1) if redone else 0} messages written "
        "ahead published again by the standby",
    )  # fmt: skip
    record(ctx.config, row)
    return row


def ocs_holder_paused(ctx: Context) -> FaultRow:
    from tests.test_ocs_producer import append
    from tests.test_ocs_producer import record as line
    from tests.test_producer_pairs import stream

    with _ocs_pair_faulted(ctx, "ocspause", signal.SIGSTOP) as (one, cluster, a, b, acct, paused):
        takeover, revision, offset, let_go = _pause_past_ttl(one, cluster, "ocs", a, b, paused)
        append(acct, "".join(line(job) + "\n" for job in range(401, OCS_JOBS + 1)))
        wait_for(
            lambda: len(set(stream(one, cluster)().stop_ids())) >= OCS_JOBS, STORE_TIMEOUT, "B: every job"
        )
        stored, lost, duplicated = _ocs_row(one, cluster)
        _wrote_nothing(one, cluster, "ocs", a, b, offset, revision)
    return _paused_row(ctx, "16 produce ocs", OCS_JOBS, (stored, lost, duplicated), takeover, let_go)


def slurm_active_killed(ctx: Context) -> FaultRow:
    """The `produce slurm` pair on a 3-node cluster against the suite's real Slurm, the active one SIGKILLed
    with jobs running (tests/test_producer_pairs.py says what each job is)."""
    from tests.test_producer_pairs import slurm_counts, slurm_pair_killed

    assert ctx.slurm is not None
    cluster, _ = ctx.name("slurmpair")
    with NatsCluster(ctx.tmp / "cluster") as nc:
        run = slurm_pair_killed(ctx.processes, ctx.tmp, nc.url, nc.urls[0], cluster, ctx.slurm, PAIR_TTL)
        stored, lost, duplicated = slurm_counts(run)
        redone = re.search(r"publishing the (\d+) messages the previous holder had written", run.b.log())
    row = FaultRow(
        "17 active produce slurm SIGKILLed (pair, R3)", len(run.ids), stored, lost, duplicated, run.takeover,
        f"lease {PAIR_TTL} s; real Slurm, jobs ended, running and submitted around the kill; "
        f"{redone.group(1) if redone else 0} messages written ahead published again",
    )  # fmt: skip
    record(ctx.config, row)
    return row


SCENARIOS = {
    "leader_killed": leader_killed,
    "influx_stopped": influx_stopped,
    "influx_killed": influx_killed,
    "worker_killed": worker_killed,
    "broker_and_producer_killed": broker_and_producer_killed,
    "partition": partition,
    "hostile": hostile,
    "stream_full": stream_full,
    "stream_full_refused": stream_full_refused,
    "poison_name": poison_name,
    "first_start_old": first_start_old,
    "first_start_new": first_start_new,
    "two_influx": two_influx,
    "jobs_active_killed": jobs_active_killed,
    "jobs_holder_paused": jobs_holder_paused,
    "ocs_active_killed": ocs_active_killed,
    "ocs_holder_paused": ocs_holder_paused,
    "slurm_active_killed": slurm_active_killed,
}
NEEDS_SLURM = frozenset({"slurm_active_killed"})
"""Scenarios that run against the suite's real Slurm (started for the campaign only when one is selected)."""
