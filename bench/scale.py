"""How many nodes one and two `hpcbus consume influx` workers keep up with: the numbers docs/scaling.md
is derived from.

The load is `hpcbus simulate` (128-core, 4-GPU nodes with jobs, through the node agent's pipeline and the
producer runtime: about 1,250 lines and 130 kB per node sample), the path the real one: nats-server with
JetStream -> N workers sharing the durable -> InfluxDB 1.x, all on this machine.

For 1 and then 2 workers:

1. Capacity: `PREFILL_NODES` x `PREFILL_SAMPLES` samples are put in the stream first (the simulator exits
   once JetStream acknowledged them), then the workers are started and timed until they acknowledged all
   of it (they acknowledge only what InfluxDB took). That is the drain rate, lines/s.
   Meanwhile the CPU seconds of the workers, nats-server and InfluxDB are read from /proc: lines per CPU
   second of each, i.e. what one core of each carries (the figure that scales to a site's machines).
2. Sustained: the simulator publishes `SUSTAIN_SHARES` of that rate in turn (nodes sampled every second)
   for `SUSTAIN_SECONDS` each; the durable's backlog (`num_pending` + `num_ack_pending`) is read every
   0.2 s. A rate counts as sustained when the backlog did not grow over the second half of its run
   (least-squares slope below one node sample per second); the highest sustained rate is reported, and the
   step-up stops at the first rate that is not.
   Meanwhile InfluxDB is polled for the newest sample of the last node: publish-to-queryable latency per
   tick (from the tick's wall-clock second, when the simulator builds and sends it), p50 and p99.
3. Worker RSS: peak `VmHWM` of each worker over both phases.

The node count at a 30 s interval is the sustained lines/s x 30 / lines per node sample. Everything shares
two cores (simulator, nats-server, InfluxDB, workers), so the figures are lower bounds for a site where
InfluxDB and the broker have machines of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec
import nats
from nats.js.errors import NotFoundError

from bench.procstat import Cpu
from hpcbus.streams import stream_name
from tests.services import InfluxDB, NatsServer, PeakRss, ServiceError

PREFILL_NODES = 30
PREFILL_SAMPLES = 8
SUSTAIN_SECONDS = 30
SUSTAIN_SHARES = (0.7, 0.95)
INTERVAL_AT_SITE = 30.0
DURABLE = "hpcbus-influx"


def _hpcbus(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpcbus", *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )


def _simulate(url: str, cluster: str, nodes: int, samples: int, log: Path) -> subprocess.Popen[bytes]:
    args = ["simulate", "--nats", url, "--cluster", cluster, "--nodes", str(nodes), "--interval", "1"]
    args += ["--samples", str(samples), "--stats-seconds", "5", "--max-pending", "8"]
    return _hpcbus(args, log)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _backlog(url: str, cluster: str) -> tuple[int, int, int]:
    """(stream's last sequence, durable's ack floor, durable's num_pending + num_ack_pending)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stream = stream_name("HPCBUS", cluster)
        last = int((await js.stream_info(stream)).state.last_seq)
        try:
            info = await js.consumer_info(stream, DURABLE)
        except NotFoundError:
            return last, 0, last
        return (
            last,
            int(info.ack_floor.stream_seq),
            int(info.num_pending or 0) + int(info.num_ack_pending or 0),
        )
    finally:
        await nc.close()


def _workers(
    tmp: Path, ns: NatsServer, influx: InfluxDB, cluster: str, n: int
) -> tuple[list[subprocess.Popen[bytes]], list[PeakRss]]:
    """`n` workers sharing the durable, writing to database `cluster`, and their peak-RSS watchers."""
    args = ["consume", "influx", "--nats", ns.url, "--cluster", cluster, "--influx-url", influx.url]
    workers = [_hpcbus([*args, "--db", cluster], tmp / f"{cluster}-w{i}.log") for i in range(n)]
    return workers, [PeakRss(w.pid) for w in workers]


def _lines(log: Path) -> int:
    """Lines the simulator built (its last summary)."""
    found = re.findall(r"(\d+) lines", log.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def _slope(points: list[tuple[float, int]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points) or 1.0
    return sum((t - mx) * (v - my) for t, v in points) / den


def _wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Drain(msgspec.Struct):
    """What the drain of a prefilled stream measured."""

    rate: float
    """Lines per second, wall clock."""
    per_sample: int
    """Lines per node sample."""
    cpu: dict[str, float]
    """Component -> lines per CPU second it used (what one core of it would carry)."""
    peaks: list[PeakRss]


def _capacity(tmp: Path, ns: NatsServer, influx: InfluxDB, n_workers: int) -> Drain:
    """Drain a prefilled stream with `n_workers`: rate, lines per sample, lines per CPU second of each part."""
    cluster = f"cap{n_workers}"
    log = tmp / f"prefill-{n_workers}.log"
    sim = _simulate(ns.url, cluster, PREFILL_NODES, PREFILL_SAMPLES, log)
    if sim.wait(600) != 0:
        raise RuntimeError(f"simulate failed:\n{log.read_text()[-2000:]}")
    lines = _lines(log)
    last, _, _ = asyncio.run(_backlog(ns.url, cluster))
    workers, peaks = _workers(tmp, ns, influx, cluster, n_workers)
    logs = [tmp / f"{cluster}-w{i}.log" for i in range(n_workers)]
    # start-up (imports, connecting, binding the durable) is not ingest: time from the first "consuming"
    _wait("the workers consuming", lambda: all("consuming" in p.read_text() for p in logs), 120)
    pids: dict[str, list[int | None]] = {
        "nats-server": [ns.pid],
        "influxd": [influx.pid],
        "workers": [w.pid for w in workers],
    }
    with Cpu(pids) as meter:
        # The workers also publish their own reports into the stream: done when the flood's last message is
        # acked.
        _wait(
            "the prefilled stream acknowledged",
            lambda: asyncio.run(_backlog(ns.url, cluster))[1] >= last,
            600,
        )
    rate = lines / meter.usage.seconds
    for w in workers:
        _stop(w)
    cpu = {name: lines / max(0.01, used) for name, used in meter.usage.processes.items()}
    return Drain(rate, lines // (PREFILL_NODES * PREFILL_SAMPLES), cpu, peaks)


def _sustain(
    tmp: Path, ns: NatsServer, influx: InfluxDB, n_workers: int, rate: float, per_sample: int, attempt: int
) -> tuple[bool, float, list[float], float, list[PeakRss]]:
    """(no growing lag, offered lines/s, latencies in s, backlog slope per s, RSS watchers) at `rate`."""
    nodes = max(1, int(rate / per_sample))
    cluster = f"sus{n_workers}x{attempt}"
    workers, peaks = _workers(tmp, ns, influx, cluster, n_workers)
    sim_log = tmp / f"{cluster}-sim.log"
    sim = _simulate(ns.url, cluster, nodes, SUSTAIN_SECONDS, sim_log)
    last_host = f"sim{nodes:05d}"
    backlog: list[tuple[float, int]] = []
    queryable: dict[int, float] = {}
    try:
        start = time.monotonic()
        while sim.poll() is None and time.monotonic() - start < SUSTAIN_SECONDS * 3:
            now = time.monotonic()
            with contextlib.suppress(NotFoundError, OSError, nats.errors.Error):
                backlog.append((now, asyncio.run(_backlog(ns.url, cluster))[2]))
            try:
                rows = influx.points(
                    f'SELECT last("value") FROM "mem_used" WHERE hostname = \'{last_host}\'',
                    cluster,
                    epoch="s",
                )
            except ServiceError:  # the database is created by the first worker
                rows = []
            wall = time.time()
            if rows:
                queryable.setdefault(int(rows[0]["time"]), wall)
            time.sleep(max(0.0, 0.2 - (time.monotonic() - now)))
        offered = _lines(sim_log) / max(1.0, SUSTAIN_SECONDS)
    finally:
        _stop(sim)
        for w in workers:
            _stop(w)
    half = (
        [p for p in backlog if p[0] >= backlog[0][0] + (backlog[-1][0] - backlog[0][0]) / 2]
        if backlog
        else []
    )
    slope = _slope(half)
    # Ticks seen one after another: the first poll that showed a tick is when it became queryable.
    latencies = sorted(seen - tick for tick, seen in queryable.items())
    # messages per node sample: 2 (metrics, events.sample); growth below one node sample a second is noise
    steady = slope < 2.0
    return steady, offered, latencies, slope, peaks


def run() -> Iterable[str]:
    out: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-scale-") as tmp_name,
        NatsServer(Path(tmp_name) / "nats") as ns,
        InfluxDB(Path(tmp_name) / "influx") as influx,
    ):
        tmp = Path(tmp_name)
        for n_workers in (1, 2):
            drain = _capacity(tmp, ns, influx, n_workers)
            per_sample = drain.per_sample
            best: tuple[float, list[float], float] | None = None
            tried: list[str] = []
            for share in SUSTAIN_SHARES:
                steady, offered, lat, slope, peaks = _sustain(
                    tmp, ns, influx, n_workers, drain.rate * share, per_sample, len(tried)
                )
                drain.peaks += peaks
                tried.append(f"{offered:,.0f} {'steady' if steady else 'lag grows'} ({slope:+.1f} msg/s)")
                if not steady:
                    break
                best = (offered, lat, slope)
            rss = max(p.wait(1) for p in drain.peaks)
            label = f"scale: {n_workers} worker{'s' if n_workers > 1 else ''} -> InfluxDB v1"
            cpu = ", ".join(f"{name} {rate:,.0f}" for name, rate in drain.cpu.items())
            out += [
                f"{label + ' drain':<56} {drain.rate:>12,.0f} lines/s  ({per_sample} lines per node sample)",
                f"{label + ' lines per CPU second':<56} {cpu}",
                f"{label + ' sustained tries':<56} {'; '.join(tried)} lines/s",
            ]
            if best is None:
                out.append(f"{label + ' sustained':<56} none of the tried rates kept up")
                continue
            offered, lat, slope = best
            p50 = lat[len(lat) // 2] if lat else float("nan")
            p99 = lat[max(0, int(len(lat) * 0.99) - 1)] if lat else float("nan")
            nodes_30s = offered * INTERVAL_AT_SITE / max(1, per_sample)
            out += [
                f"{label + ' sustained':<56} {offered:>12,.0f} lines/s  no growing lag "
                f"= {nodes_30s:,.0f} nodes at {INTERVAL_AT_SITE:.0f} s",
                f"{label + ' publish->queryable':<56} p50 {p50 * 1000:,.0f} ms  p99 {p99 * 1000:,.0f} ms"
                f"  ({len(lat)} ticks)  worker peak RSS {rss / 2**20:,.0f} MB",
            ]
    out.append("scale: all processes share this 2-core machine (shared with other jobs): lower bounds")
    return out


if __name__ == "__main__":
    for line in run():
        print(line, flush=True)
