"""The InfluxDB consumer end to end: NATS JetStream -> `hpcbus consume influx` -> InfluxDB 1.x.

Throughput: 500k CC lines in 1000-line messages are put in the stream first, then a worker is started and
timed until InfluxDB holds every point; the baseline POSTs the same lines straight to the same InfluxDB in
5000-line gzip batches (what the worker itself sends). Target: >= 0.6x of the direct rate.
Latency: messages published at a steady 20k lines/s; each carries a marker line whose value is its number;
InfluxDB is polled for the highest marker, giving when each message became queryable; p50/p99 printed.
"""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nats

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


def direct(influx: InfluxDB, db: str, messages: list[bytes]) -> float:
    influx.create_db(db)
    body = b"".join(messages)
    lines = body.splitlines(keepends=True)
    start = time.monotonic()
    for i in range(0, len(lines), 5000):
        data = gzip.compress(b"".join(lines[i : i + 5000]), compresslevel=1)
        req = urllib.request.Request(
            f"{influx.url}/write?db={db}&precision=s", data=data, headers={"Content-Encoding": "gzip"}
        )
        urllib.request.urlopen(req, timeout=60).read()
    return time.monotonic() - start


async def fill_stream(url: str, subject: str, messages: list[bytes]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for m in messages:
        await js.publish(subject, m)
    await nc.close()


def start_worker(nats_url: str, influx_url: str, cluster: str, db: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
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


def run() -> list[str]:
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-bench-") as tmp,
        NatsServer(Path(tmp) / "nats") as ns,
        InfluxDB(Path(tmp) / "influx") as influx,
    ):
        messages = payloads(N_LINES, "tp")
        t_direct = direct(influx, "direct", messages)

        cluster = "bench"
        asyncio.run(_ensure_stream(ns.url, cluster))
        asyncio.run(fill_stream(ns.url, f"{cluster}.metrics", messages))
        worker_log = Path(tmp) / "worker.log"
        worker = start_worker(ns.url, influx.url, cluster, "bus", worker_log)
        try:
            while "consuming" not in worker_log.read_text():  # start-up is not ingest time
                time.sleep(0.01)
            start = time.monotonic()
            end = asyncio.run(wait_all_acked(ns.url, cluster, len(messages), 600))
            t_bus = end - start
            assert count(influx, "bus", "tp") == N_LINES, "acked but not stored"
            sent: dict[int, float] = {}
            seen: dict[int, float] = {}

            async def poll() -> None:
                highest = -1
                while len(seen) < RATE // PER_MSG * LATENCY_SECONDS:
                    try:
                        rows = await asyncio.to_thread(
                            influx.points, 'SELECT max("value") FROM "latmark"', "bus"
                        )
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
                await steady_publish(ns.url, f"{cluster}.metrics", sent)
                await asyncio.wait_for(poller, 60)

            asyncio.run(both())
        finally:
            worker.terminate()
            worker.wait(30)
    lat = sorted(seen[i] - sent[i] for i in sent)
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    ratio = t_direct / t_bus
    verdict = "OK" if ratio >= 0.6 else "MISSED"
    return [
        f"{'InfluxDB consumer: 500k lines NATS->InfluxDB v1':<56} {N_LINES / t_bus:>12,.0f} lines/s  baseline "
        f"{N_LINES / t_direct:>12,.0f} lines/s  ratio {ratio:5.2f}x  target >= 0.60x: {verdict}",
        f"{'InfluxDB consumer: publish->queryable at 20k lines/s':<56} p50 {p50 * 1000:,.0f} ms  p99 {p99 * 1000:,.0f} ms"
        f"  ({len(lat)} messages)",
    ]


async def _ensure_stream(url: str, cluster: str) -> None:
    from hpcbus.bus import ensure_stream, telemetry_stream

    nc = await nats.connect(url)
    await ensure_stream(nc.jetstream(), telemetry_stream(cluster, max_bytes=1 << 30))
    await nc.close()
