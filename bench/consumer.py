"""The InfluxDB consumer end to end: NATS JetStream -> `hpcbus consume influx` -> InfluxDB 1.x.

Throughput: 500k CC lines in 1000-line messages are put in the stream first, then a worker is started and
timed until every message is acked (it acks only after InfluxDB took the batch). Baselines, measured in the
same run on the same InfluxDB, each into a database of its own: the same lines POSTed straight to InfluxDB
in 5000-line batches over one kept-alive connection, plain and gzip level 1 (compression counted); the
faster of the two is the single-connection baseline (and the encoding the worker is given), and the same
over two connections in parallel is the best direct writer. Then two workers sharing the durable against
one. Peak RSS of the worker (`VmHWM`) is read before it is stopped.
Worker CPU per line against bare `parse_line` of the same lines (issue 24: <= 0.5x on the compiled path);
before timing, the sink's write body for the bench lines must be equal on the compiled and the pure path.
Latency: messages published at a steady 20k lines/s; each carries a marker line whose value is its number;
InfluxDB is polled for the highest marker, giving when each message became queryable; p50/p99 printed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gzip
import http.client
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import nats
from line_protocol_parser import parse_line
from nats.aio.msg import Msg

from bench.procstat import Cpu, Usage, peak_rss_mb
from bench.timing import best_of, interleaved, verdict
from hpcbus.contract import BadInput
from tests.services import InfluxDB, NatsServer, ServiceError

N_LINES = 500_000
PER_MSG = 1000
RATE = 20_000
LATENCY_SECONDS = 10
T0 = 1_700_000_000


def payloads(n_lines: int, measurement: str) -> list[bytes]:
    out = []
    for m in range(n_lines // PER_MSG):
        ts = T0 + m
        out.append(
            "".join(
                f"{measurement},hostname=c{m % 64:03d},type=hwthread,type-id={j} value={j * 0.5 + m} {ts}\n"
                for j in range(PER_MSG)
            ).encode()
        )
    return out


def count(influx: InfluxDB, db: str, measurement: str) -> int:
    try:
        rows = influx.points(f'SELECT count("value") FROM "{measurement}"', db)
    except ServiceError:  # the worker has not created the database yet
        return 0
    return int(rows[0]["count"]) if rows else 0


def best(a: Usage, b: Usage) -> Usage:
    """The faster of two runs (the first on a tie)."""
    return min(a, b, key=lambda u: u.seconds)


def direct(influx: InfluxDB, db: str, messages: list[bytes], *, gzipped: bool, connections: int = 1) -> Usage:
    """Time to POST every line in 5000-line batches over `connections` kept-alive connections in
    parallel (each takes every `connections`-th batch), compressing inside the timing when `gzipped`; the
    CPU of influxd and of this process (the writer) meanwhile."""
    influx.create_db(db)
    lines = b"".join(messages).splitlines(keepends=True)
    batches = [b"".join(lines[i : i + 5000]) for i in range(0, len(lines), 5000)]
    url = urllib.parse.urlsplit(influx.url)
    headers = {"Content-Encoding": "gzip"} if gzipped else {}

    def post(share: list[bytes]) -> None:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
        try:
            for body in share:
                data = gzip.compress(body, compresslevel=1) if gzipped else body
                conn.request("POST", f"/write?db={db}&precision=s", body=data, headers=headers)
                resp = conn.getresponse()
                text = resp.read()
                if resp.status >= 300:
                    raise RuntimeError(f"direct write: HTTP {resp.status} {text[:200]!r}")
        finally:
            conn.close()

    with (
        Cpu({"influxd": [influx.pid], "writer": [os.getpid()]}) as meter,
        concurrent.futures.ThreadPoolExecutor(connections) as pool,
    ):
        for done in [pool.submit(post, batches[k::connections]) for k in range(connections)]:
            done.result()
    return meter.usage


async def fill_stream(url: str, subject: str, messages: list[bytes]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for m in messages:
        await js.publish(subject, m)
    await nc.close()


def start_worker(
    nats_url: str, influx_url: str, cluster: str, db: str, log: Path, *, gzipped: bool = True
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpcbus",
                "consume",
                "influx",
                "--nats",
                nats_url,
                "--cluster",
                cluster,
                "--influx-url",
                influx_url,
                "--db",
                db,
                "--gzip" if gzipped else "--no-gzip",
            ],
            stdout=out,
            stderr=out,
        )


async def wait_all_acked(url: str, cluster: str, n_msgs: int, timeout: float) -> None:
    """Return once the worker has acked every message: it acks only after InfluxDB accepted the batch. Polling
    JetStream costs InfluxDB nothing (a count() query over the growing data would slow it down)."""
    from hpcbus.streams import stream_name

    nc = await nats.connect(url)
    js = nc.jetstream()
    start = time.monotonic()
    try:
        while True:
            try:
                info = await js.consumer_info(stream_name("HPCBUS", cluster), "hpcbus-influx")
                if info.ack_floor.stream_seq >= n_msgs and info.num_ack_pending == 0:
                    return
            except nats.js.errors.NotFoundError:
                pass
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"not all {n_msgs} messages acked after {timeout}s")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def steady_publish(url: str, subject: str, sent: dict[int, float]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    per_second = RATE // PER_MSG
    start = time.monotonic()
    for i in range(per_second * LATENCY_SECONDS):
        due = start + i / per_second
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        body = "".join(
            f"lat,hostname=h{i % 64},type=hwthread,type-id={j} value={j} {T0 + i}\n"
            for j in range(PER_MSG - 1)
        )
        body += f"latmark,hostname=bench,type=node value={i} {T0 + i}\n"
        sent[i] = time.monotonic()
        await js.publish(subject, body.encode())
    await nc.close()


def bus_run(
    ns: NatsServer,
    influx: InfluxDB,
    cluster: str,
    db: str,
    messages: list[bytes],
    tmp: Path,
    workers: int,
    gzipped: bool,
) -> tuple[Usage, list[subprocess.Popen[bytes]]]:
    """(the time until `workers` workers bound to one durable have acked every message and the CPU of
    influxd, nats-server and the workers meanwhile, the workers): started after the stream holds every
    message (start-up is not ingest time); the workers are left running."""
    asyncio.run(_ensure_stream(ns.url, cluster))
    asyncio.run(fill_stream(ns.url, f"{cluster}.metrics", messages))
    logs = [tmp / f"{cluster}-worker{k}.log" for k in range(workers)]
    procs = [start_worker(ns.url, influx.url, cluster, db, log, gzipped=gzipped) for log in logs]
    for log in logs:
        while "consuming" not in log.read_text():
            time.sleep(0.01)
    pids: dict[str, list[int | None]] = {
        "influxd": [influx.pid],
        "nats-server": [ns.pid],
        "worker": [p.pid for p in procs],
    }
    with Cpu(pids) as meter:
        asyncio.run(wait_all_acked(ns.url, cluster, len(messages), 900))
    assert count(influx, db, "tp") == N_LINES, "acked but not stored"
    return meter.usage, procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(30)


def latency(ns_url: str, influx: InfluxDB, cluster: str, db: str) -> list[float]:
    """Publish->queryable delays of messages published at `RATE` lines/s (a worker is running)."""
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}

    async def poll() -> None:
        highest = -1
        while len(seen) < RATE // PER_MSG * LATENCY_SECONDS:
            try:
                rows = await asyncio.to_thread(influx.points, 'SELECT max("value") FROM "latmark"', db)
            except ServiceError:
                rows = []
            now = time.monotonic()
            top = int(rows[0]["max"]) if rows else -1
            for i in range(highest + 1, top + 1):
                seen[i] = now
            highest = max(highest, top)
            await asyncio.sleep(0.02)

    async def both() -> None:
        poller = asyncio.create_task(poll())
        await steady_publish(ns_url, f"{cluster}.metrics", sent)
        await asyncio.wait_for(poller, 60)

    asyncio.run(both())
    return sorted(seen[i] - sent[i] for i in sent)


def _row(name: str, ours: Usage, baseline: Usage, what: str, target: float) -> str:
    ratio = baseline.seconds / ours.seconds
    return (
        f"{name:<56} {N_LINES / ours.seconds:>12,.0f} lines/s  baseline {N_LINES / baseline.seconds:>12,.0f} "
        f"lines/s ({what})  ratio {ratio:5.2f}x  target >= {target:.2f}x: {verdict(ratio >= target)}"
    )


def _cpu_row(name: str, usage: Usage) -> str:
    parts = "  ".join(f"{who} {usage.per_line_us(who, N_LINES):.2f}" for who in usage.processes)
    return (
        f"{name:<56} {parts} us/line  (sum {usage.total_us(N_LINES):.2f}); machine "
        f"{usage.cores_busy:.2f} of {os.cpu_count()} cores busy"
    )


def parse_cost_us(messages: list[bytes]) -> float:
    """CPU µs per line of bare `parse_line` over the same lines: the least a consumer that checks every line
    spends of its own."""
    lines = [s for m in messages[:50] for s in m.decode().split("\n") if s]
    return best_of(lambda: [parse_line(s) for s in lines], 3) / len(lines) * 1e6


async def _sink_bodies(url: str, messages: list[bytes]) -> tuple[list[str], list[str]]:
    """The InfluxDB sink's write body for `messages` (on `bench.metrics`) on the compiled path and on the
    pure path, built in this process as the worker builds it (`take`, then `_body`)."""
    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.settings import InfluxSettings

    nc = await nats.connect(url)
    try:
        bodies = []
        for compiled in (True, False):
            sink = InfluxSink(nc, None, InfluxSettings(), "bench", "bench", compiled=compiled)  # type: ignore[arg-type]
            for data in messages:
                sink.take(Msg(nc, "bench.metrics", "", data))
            bodies.append(sink._body(sink.cut()))
        return bodies[0], bodies[1]
    finally:
        await nc.close()


def assert_equal_bodies(url: str, messages: list[bytes]) -> None:
    """Before timing: the worker's body for the bench lines is the same, line for line, on the compiled path
    (`_scan.c`, `_influxdb.c`) and the pure path, and holds every line (50 messages at a time)."""
    for k in range(0, len(messages), 50):
        compiled, pure = asyncio.run(_sink_bodies(url, messages[k : k + 50]))
        assert compiled == pure, "the compiled sink's body differs from the pure path's"
        assert len(compiled) == sum(m.count(b"\n") for m in messages[k : k + 50])


def worker_row(bus: Usage, parse_us: float, target: float = 0.5) -> str:
    """The worker's CPU per line against bare `parse_line` of the same lines (issue 24: <= 0.5x, compiled)."""
    from hpcbus.schemas.native import implementation

    worker_us = bus.per_line_us("worker", N_LINES)
    ratio = worker_us / parse_us
    return (
        f"{'InfluxDB worker CPU per line vs bare parse_line':<56} worker {worker_us:.2f} us/line  bare parse_line "
        f"{parse_us:.2f} us/line  ratio {ratio:5.2f}x  target <= {target:.2f}x: {verdict(ratio <= target)} "
        f"({implementation()})"
    )


async def _agent_mix(url: str) -> tuple[float, float, int, str]:
    """(sink CPU s, bare `parse_line` CPU s, lines, what they are) over the node agent's metric messages
    (`<cluster>.metrics`) of every fixture tree, taken and written into a body in this process, as the worker
    does; the body is asserted equal on the compiled and the pure path first. Its events (one a sample: the
    Sonar skeleton, job starts and stops) take the pure path, and are said apart (per line, against bare
    `parse_line` of them)."""
    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.settings import InfluxSettings
    from tests.node_fixtures import FIX, agent_messages

    # the trees of cgroup files alone have no /proc to sample: the collector says so once each, not here
    logging.disable(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="hpcbus-bench-") as tmp:
            every = [
                (subject, payload)
                for case in sorted(p.name for p in FIX.iterdir() if p.is_dir())
                for subject, payload in agent_messages(Path(tmp), case)
            ]
    finally:
        logging.disable(logging.NOTSET)
    messages = [(subject, payload) for subject, payload in every if subject.endswith(".metrics")]
    events = [(subject, payload) for subject, payload in every if not subject.endswith(".metrics")]
    texts = [s for _, m in messages for s in m.decode().split("\n") if s]
    event_texts = [s for _, m in events for s in m.decode().split("\n") if s]
    node = sum(",type=node" in s and ",stype=process" not in s for s in texts)
    processes = sum(",stype=process" in s for s in texts)
    nc = await nats.connect(url)
    try:

        def sink(compiled: bool) -> InfluxSink:
            return InfluxSink(nc, None, InfluxSettings(), "bench", "bench", compiled=compiled)  # type: ignore[arg-type]

        def body(s: InfluxSink, these: list[tuple[str, bytes]] = messages) -> list[str]:
            for subject, data in these:
                with contextlib.suppress(BadInput):
                    s.take(Msg(nc, subject, "", data))
            return s._body(s.cut())

        fast, pure = sink(True), sink(False)
        assert body(fast) == body(pure), "the compiled sink's body differs from the pure path's"
        t_sink, t_bare = interleaved([lambda: body(fast), lambda: [parse_line(s) for s in texts]], rounds=15)
        t_events, t_events_bare = interleaved(
            [lambda: body(fast, events), lambda: [parse_line(s) for s in event_texts]], rounds=5
        )
    finally:
        await nc.close()
    what = (
        f"{len(texts)} lines of {len(messages)} messages: {node} node-level, {processes} process lines "
        f"folded per job; take + body in process; its {len(event_texts)} event lines, pure path: "
        f"{t_events / len(event_texts) * 1e6:.1f} us each, {t_events / t_events_bare:.1f}x parse_line"
    )
    return t_sink, t_bare, len(texts), what


def agent_mix_row(url: str, target: float = 0.5) -> str:
    """The InfluxDB sink's CPU per line on the metric lines nodes really send (70% node-level lines, process
    lines to fold), against bare `parse_line` of the same lines: the row above times hwthread lines only."""
    from hpcbus.schemas.native import implementation

    t_sink, t_bare, n, what = asyncio.run(_agent_mix(url))
    ratio = t_sink / t_bare
    return (
        f"{'InfluxDB sink CPU per line, node agent metrics vs parse_line':<56} sink {t_sink / n * 1e6:.2f} us/line  "
        f"bare parse_line {t_bare / n * 1e6:.2f} us/line  ratio {ratio:5.2f}x  target <= {target:.2f}x: "
        f"{verdict(ratio <= target)} ({implementation()}; {what})"
    )


def ceiling_rows(baseline: Usage, bus: Usage, parse_us: float, target: float) -> list[str]:
    """What this machine allows. InfluxDB, nats-server and the worker share its cores, so however well their
    work overlaps, the bus path cannot move more than (cores / its CPU per line) lines a second: against the
    baseline's rate that is the ratio's ceiling here. The worker CPU that would still allow `target` is
    what is left of that budget after influxd and nats-server took theirs in the same run."""
    cores = os.cpu_count() or 1
    bus_us = bus.total_us(N_LINES)
    baseline_rate = N_LINES / baseline.seconds
    ceiling = cores / (bus_us * 1e-6) / baseline_rate
    others = bus.per_line_us("influxd", N_LINES) + bus.per_line_us("nats-server", N_LINES)
    budget = cores / (target * baseline_rate) * 1e6 - others
    return [
        f"{'InfluxDB consumer: ceiling from CPU on this machine':<56} {ceiling:5.2f}x  ({cores} cores / "
        f"{bus_us:.2f} us of CPU per line on the bus path = {cores / (bus_us * 1e-6):,.0f} lines/s at most)",
        f"{'InfluxDB consumer: worker CPU that would meet the target':<56} <= {budget:.2f} us/line for "
        f"{target:.2f}x (after influxd and nats-server); the worker spent {bus.per_line_us('worker', N_LINES):.2f}; "
        f"bare parse_line of these lines alone costs {parse_us:.2f}",
    ]


def run() -> list[str]:
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-bench-") as tmp_name,
        NatsServer(Path(tmp_name) / "nats") as ns,
        InfluxDB(Path(tmp_name) / "influx") as influx,
    ):
        tmp = Path(tmp_name)
        messages = payloads(N_LINES, "tp")
        assert_equal_bodies(ns.url, messages)
        mix = agent_mix_row(ns.url)
        # baselines before and after the workers' runs, best kept: the baseline is never the unlucky one
        plain = direct(influx, "direct_plain", messages, gzipped=False)
        zipped = direct(influx, "direct_gzip", messages, gzipped=True)
        gzipped = zipped.seconds < plain.seconds
        two = direct(influx, "direct_two", messages, gzipped=gzipped, connections=2)

        one_worker, procs = bus_run(ns, influx, "bench", "bus", messages, tmp, 1, gzipped)
        try:
            lat = latency(ns.url, influx, "bench", "bus")
            rss = peak_rss_mb(procs[0].pid)
        finally:
            stop(procs)
        two_workers, procs = bus_run(ns, influx, "bench2", "bus2", messages, tmp, 2, gzipped)
        stop(procs)

        plain = best(plain, direct(influx, "direct_plain", messages, gzipped=False))
        zipped = best(zipped, direct(influx, "direct_gzip", messages, gzipped=True))
        two = best(two, direct(influx, "direct_two", messages, gzipped=gzipped, connections=2))
    single_run = best(plain, zipped)
    parse_us = parse_cost_us(messages)
    single = "gzip" if zipped.seconds < plain.seconds else "plain"
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    speedup = one_worker.seconds / two_workers.seconds
    # A second worker helps only where the first one is the limit. Here InfluxDB, nats-server and the
    # workers share the same cores: when one worker's run already keeps them busy, the machine is the limit.
    cores = os.cpu_count() or 1
    busy = one_worker.cores_busy / cores
    limit = (
        f"limit: this machine's {cores} cores ({busy:.0%} busy with 1 worker; influxd "
        f"{one_worker.processes['influxd'] / one_worker.busy:.0%} of that)"
        if busy >= 0.85
        else f"limit: the worker ({busy:.0%} of the cores busy with 1 worker)"
    )
    return [
        f"{'InfluxDB direct writers, 500k lines':<56} plain {N_LINES / plain.seconds:,.0f}  gzip "
        f"{N_LINES / zipped.seconds:,.0f}  2 connections ({single}) {N_LINES / two.seconds:,.0f} lines/s",
        _row(
            "InfluxDB consumer vs best 1-connection writer", one_worker, single_run, f"1 conn, {single}", 0.85
        ),
        _row("InfluxDB consumer vs 2-connection writer", one_worker, two, "2 conns", 0.7),
        _cpu_row(f"InfluxDB CPU per line: direct, 1 conn {single}", single_run),
        _cpu_row("InfluxDB CPU per line: direct, 2 conns", two),
        _cpu_row("InfluxDB CPU per line: via the bus, 1 worker", one_worker),
        *ceiling_rows(single_run, one_worker, parse_us, 0.85),
        worker_row(one_worker, parse_us),
        mix,
        f"{'InfluxDB consumer: 2 workers vs 1':<56} {N_LINES / two_workers.seconds:>12,.0f} lines/s  1 worker "
        f"{N_LINES / one_worker.seconds:>12,.0f} lines/s  ratio {speedup:5.2f}x  target >= 1.50x where InfluxDB "
        f"is not the limit: {verdict(speedup >= 1.5)} ({limit})",
        _cpu_row("InfluxDB CPU per line: via the bus, 2 workers", two_workers),
        f"{'InfluxDB consumer: publish->queryable at 20k lines/s':<56} p50 {p50 * 1000:,.0f} ms  "
        f"p99 {p99 * 1000:,.0f} ms  ({len(lat)} messages)",
        f"{'InfluxDB consumer peak RSS at full rate':<56} {rss:8.1f} MB  target <= 100 MB: {verdict(rss <= 100)}",
    ]


async def _ensure_stream(url: str, cluster: str) -> None:
    from hpcbus.streams import ensure_stream, telemetry_stream

    nc = await nats.connect(url)
    await ensure_stream(nc.jetstream(), telemetry_stream(cluster, max_bytes=1 << 30))
    await nc.close()
