"""What the jobs worker's state costs in JetStream (`[jobs] state = "jetstream"`, consumers/jobs/kvstate.py):
bytes per open job, entries written per save, and how fast a save writes them on one nats-server.

N open Slurm jobs, each on two nodes with four processes (the lines `consume jobs` reads: `process_cpu_time`,
`_rss`, `_read`, `_written`), are folded into a state exactly as the worker folds them, then saved through a
held lease, on one nats-server (R1) and on a 3-node cluster on loopback (R3): the first save writes everything, a save after one more sample of every job writes what a
30 s sample round costs, a save after one more sample of a tenth of the jobs what a save each second
writes when samples arrive spread over the interval. Run: `python -m bench.jobs_state [N ...]`."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import nats

from hpcbus.consumers.jobs.kvstate import KvStore, entries
from hpcbus.lease import FencedStore, Lease
from hpcbus.retry import Stopping
from hpcbus.schemas.jobsummary import Limits, State, add_metric, encode_state
from hpcbus.schemas.lineprotocol import parse_payload
from tests.services import NatsServer
from tests.services.nats_cluster import NatsCluster

SIZES = (1_000, 5_000)
NODES_PER_JOB = 2
PROCS = 4


def sample(jobs: Iterable[int], t: int, i: int) -> bytes:
    lines = []
    for job in jobs:
        for n in range(NODES_PER_JOB):
            host = f"n{(job * NODES_PER_JOB + n) % 100_000:05d}"
            for p in range(PROCS):
                tags = f"cluster=c,hostname={host},job={job},pid={p + 10},ppid=1,stype=process,stype-id={job}/{p + 10}"
                for name, value in (
                    ("cpu_time", 30 * i),
                    ("rss", 1024 * (p + 1)),
                    ("read", 5 * i),
                    ("written", 2 * i),
                ):
                    lines.append(f"process_{name},{tags},type=node,type-id=0,user=u value={value}i {t}")
    return ("\n".join(lines) + "\n").encode()


def fold(state: State, data: bytes, now: float, limits: Limits) -> None:
    for line in parse_payload(data, now=int(now)).lines:
        add_metric(state, "c", line, now, limits)


async def measure(urls: list[str], n: int, replicas: int) -> list[str]:
    nc = await nats.connect(urls)
    try:
        lease = Lease(nc, f"BENCH_{n}_{time.time_ns()}", "jobs", ttl=60, replicas=replicas)
        await lease._try_take(Stopping())
        kv = KvStore(FencedStore(lease))
        state, limits = State(cluster="c", durable="hpcbus-jobs"), Limits()
        t0 = int(time.time()) - 3600
        out = []
        rounds = (
            ("first save", range(n)),
            ("every job one more sample", range(n)),
            ("a tenth of the jobs", range(0, n, 10)),
        )
        for i, (what, jobs) in enumerate(rounds):
            fold(state, sample(jobs, t0 + 30 * i, i), time.time(), limits)
            started = time.perf_counter()
            await kv.save(state)
            took = time.perf_counter() - started
            out.append(
                f"jobs state {n:>6} jobs, {what:<28} {kv.last_writes:>7} writes {kv.last_bytes / 1e6:>6.2f} MB "
                f"in {took:5.2f} s ({kv.last_writes / took:,.0f} writes/s)"
            )
        held = sum(len(v) for v in entries(state).values())
        out.append(
            f"jobs state {n:>6} jobs: {held / n:,.0f} B per open job of {NODES_PER_JOB} nodes x {PROCS} processes "
            f"in the bucket ({held / 1e6:.1f} MB; the state file: {len(encode_state(state)) / n:,.0f} B per job)"
        )
        return out
    finally:
        await nc.close()


def run(sizes: Iterable[int] = SIZES) -> Iterable[str]:
    with tempfile.TemporaryDirectory(prefix="hpcbus-jobs-state-") as tmp:
        with NatsServer(Path(tmp) / "nats") as ns:
            for n in sizes:
                yield from (f"R1 {line}" for line in asyncio.run(measure([ns.url], n, 1)))
        with NatsCluster(Path(tmp) / "cluster") as cluster:
            for n in sizes:
                yield from (f"R3 {line}" for line in asyncio.run(measure(cluster.urls, n, 3)))


if __name__ == "__main__":
    for line in run([int(a) for a in sys.argv[1:]] or SIZES):
        print(line, flush=True)
