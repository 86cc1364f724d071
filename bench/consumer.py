"""The InfluxDB consumer end to end: NATS JetStream -> `hpcbus consume influx` -> InfluxDB 1.x.

Throughput: 500k CC lines in 1000-line messages are put in the stream first, then a worker is started and
timed until every message is acked (it acks only after InfluxDB took the batch). Baselines, measured in the
same run on the same InfluxDB, each into a database of its own: the same lines POSTed straight to InfluxDB
in 5000-line batches over one kept-alive connection, plain and gzip level 1 (compression counted); the
faster of the two is the single-connection baseline (and the encoding the worker is given), and the same
over two connections in parallel is the best direct writer. Then two workers sharing the durable against
one. Peak RSS of the worker (`VmHWM`) is read before it is stopped.
Latency: messages published at a steady 20k lines/s; each carries a marker line whose value is its number;
InfluxDB is polled for the highest marker, giving when each message became queryable; p50/p99 printed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import http.client
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import nats

from bench.timing import verdict
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


def direct(influx: InfluxDB, db: str, messages: list[bytes], *, gzipped: bool, connections: int = 1) -> float:
    """Seconds to POST every line in 5000-line batches over `connections` kept-alive connections in
    parallel (each takes every `connections`-th batch), compressing inside the timing when `gzipped`."""
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

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        for done in [pool.submit(post, batches[k::connections]) for k in range(connections)]:
            done.result()
    return time.monotonic() - start


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


async def wait_all_acked(url: str, cluster: str, n_msgs: int, timeout: float) -> float:
    """When the worker has acked every message: it acks only after InfluxDB accepted the batch. Polling
    JetStream costs InfluxDB nothing (a count() query over the growing data would slow it down)."""
    from hpcbus.bus import stream_name

    nc = await nats.connect(url)
    js = nc.jetstream()
    start = time.monotonic()
    try:
        while True:
            try:
                info = await js.consumer_info(stream_name("HPCBUS", cluster), "hpcbus-influx")
                if info.ack_floor.stream_seq >= n_msgs and info.num_ack_pending == 0:
                    return time.monotonic()
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


def peak_rss_mb(pid: int) -> float:
    """The process' peak resident set (`VmHWM`), MB."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bus_run(
    ns_url: str,
    influx: InfluxDB,
    cluster: str,
    db: str,
    messages: list[bytes],
    tmp: Path,
    workers: int,
    gzipped: bool,
) -> tuple[float, float, list[subprocess.Popen[bytes]]]:
    """(seconds until `workers` workers bound to one durable have acked every message, CPU seconds they
    used meanwhile, the workers): started after the stream holds every message (start-up is not ingest
    time); the workers are left running."""
    asyncio.run(_ensure_stream(ns_url, cluster))
    asyncio.run(fill_stream(ns_url, f"{cluster}.metrics", messages))
    logs = [tmp / f"{cluster}-worker{k}.log" for k in range(workers)]
    procs = [start_worker(ns_url, influx.url, cluster, db, log, gzipped=gzipped) for log in logs]
    for log in logs:
        while "consuming" not in log.read_text():
            time.sleep(0.01)
    start = time.monotonic()
    cpu_before = sum(cpu_seconds(p.pid) for p in procs)
    end = asyncio.run(wait_all_acked(ns_url, cluster, len(messages), 900))
    cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
    assert count(influx, db, "tp") == N_LINES, "acked but not stored"
    return end - start, cpu, procs


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


def _row(name: str, ours: float, baseline: float, what: str, target: float) -> str:
    ratio = baseline / ours
    return (
        f"{name:<56} {N_LINES / ours:>12,.0f} lines/s  baseline {N_LINES / baseline:>12,.0f} lines/s ({what})  "
        f"ratio {ratio:5.2f}x  target >= {target:.2f}x: {verdict(ratio >= target)}"
    )


def run() -> list[str]:
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-bench-") as tmp_name,
        NatsServer(Path(tmp_name) / "nats") as ns,
        InfluxDB(Path(tmp_name) / "influx") as influx,
    ):
        tmp = Path(tmp_name)
        messages = payloads(N_LINES, "tp")
        # baselines before and after the workers' runs, best kept: the baseline is never the unlucky one
        t_plain = direct(influx, "direct_plain", messages, gzipped=False)
        t_gzip = direct(influx, "direct_gzip", messages, gzipped=True)
        gzipped = t_gzip < t_plain
        t_two = direct(influx, "direct_two", messages, gzipped=gzipped, connections=2)

        t_one_worker, cpu_one, procs = bus_run(ns.url, influx, "bench", "bus", messages, tmp, 1, gzipped)
        try:
            lat = latency(ns.url, influx, "bench", "bus")
            rss = peak_rss_mb(procs[0].pid)
        finally:
            stop(procs)
        t_two_workers, _cpu, procs = bus_run(ns.url, influx, "bench2", "bus2", messages, tmp, 2, gzipped)
        stop(procs)

        t_plain = min(t_plain, direct(influx, "direct_plain", messages, gzipped=False))
        t_gzip = min(t_gzip, direct(influx, "direct_gzip", messages, gzipped=True))
        t_two = min(t_two, direct(influx, "direct_two", messages, gzipped=gzipped, connections=2))
    t_single = min(t_plain, t_gzip)
    single = "gzip" if t_gzip < t_plain else "plain"
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    speedup = t_one_worker / t_two_workers
    # InfluxDB (with everything else on this machine) is the limit when one worker already writes about as
    # fast as the best direct writer: a second worker can then only compete for the same CPU.
    bound = "InfluxDB-bound" if t_two / t_one_worker >= 0.7 else "worker-bound"
    return [
        f"{'InfluxDB direct writers, 500k lines':<56} plain {N_LINES / t_plain:,.0f}  gzip {N_LINES / t_gzip:,.0f}  "
        f"2 connections ({single}) {N_LINES / t_two:,.0f} lines/s",
        _row(
            "InfluxDB consumer vs best 1-connection writer", t_one_worker, t_single, f"1 conn, {single}", 0.85
        ),
        _row("InfluxDB consumer vs 2-connection writer", t_one_worker, t_two, "2 conns", 0.7),
        f"{'InfluxDB consumer: 2 workers vs 1':<56} {N_LINES / t_two_workers:>12,.0f} lines/s  1 worker "
        f"{N_LINES / t_one_worker:>12,.0f} lines/s  ratio {speedup:5.2f}x  target >= 1.50x where InfluxDB is "
        f"not the limit: {verdict(speedup >= 1.5)} ({bound}: "
        f"1 worker = {t_two / t_one_worker:.2f}x of the 2-connection writer)",
        f"{'InfluxDB consumer: publish->queryable at 20k lines/s':<56} p50 {p50 * 1000:,.0f} ms  "
        f"p99 {p99 * 1000:,.0f} ms  ({len(lat)} messages)",
        f"{'InfluxDB consumer: CPU of one worker':<56} {cpu_one / N_LINES * 1e6:8.2f} us/line  "
        f"({cpu_one / t_one_worker * 100:.0f}% of a core while draining: below 100% = it waited, for InfluxDB "
        "or for a CPU this machine shares)",
        f"{'InfluxDB consumer peak RSS at full rate':<56} {rss:8.1f} MB  target <= 100 MB: {verdict(rss <= 100)}",
    ]


async def _ensure_stream(url: str, cluster: str) -> None:
    from hpcbus.bus import ensure_stream, telemetry_stream

    nc = await nats.connect(url)
    await ensure_stream(nc.jetstream(), telemetry_stream(cluster, max_bytes=1 << 30))
    await nc.close()
