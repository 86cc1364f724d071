"""How long `hpcbus status` takes on a site of 2,000 nodes (the issue's target: under 5 s).

`hpcbus simulate --nodes 2000` puts three samples of each node in the stream (a 128-core, 4-GPU node's
sample: about 130 kB of metric lines and a 3 kB skeleton), then `hpcbus status --json` is timed as a person
runs it (a new process: start-up included), best and worst of 3, with what it found (nodes seen, silent).
The reference row is the same status on an empty cluster: what the skeleton reading adds."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from tests.services import NatsServer

NODES = 2000
SAMPLES = 3


def _status(url: str, cluster: str) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "hpcbus", "status", "--nats", url, "--cluster", cluster, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    if p.returncode not in (0, 1):
        raise RuntimeError(f"hpcbus status exited {p.returncode}: {p.stderr}")
    report: dict[str, object] = json.loads(p.stdout)
    return took, report


def run() -> Iterable[str]:
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-status-") as tmp_name,
        NatsServer(Path(tmp_name) / "nats") as ns,
    ):
        bus = ["--nats", ns.url, "--cluster", "big"]
        simulate = [
            sys.executable,
            "-m",
            "hpcbus",
            "simulate",
            *bus,
            "--nodes",
            str(NODES),
            "--interval",
            "15",
        ]
        simulate += ["--samples", str(SAMPLES), "--no-align", "--max-bytes", str(1 << 30)]
        with open(Path(tmp_name) / "simulate.log", "ab") as log:
            subprocess.run(simulate, stdout=log, stderr=log, check=True, timeout=900)
        empty = [_status(ns.url, "empty")[0] for _ in range(3)]
        runs = [_status(ns.url, "big") for _ in range(3)]
        times = sorted(t for t, _ in runs)
        (cluster,) = runs[-1][1]["clusters"]  # type: ignore[misc]
        nodes = cluster["nodes"]
        yield (
            f"{'status: ' + str(NODES) + ' nodes x ' + str(SAMPLES) + ' samples':<56} {times[0]:>6.2f} s best, "
            f"{times[-1]:.2f} s worst (target < 5 s; {nodes['seen']} nodes seen, {len(nodes['silent'])} silent)"
        )
        yield f"{'status: no stream (start-up and connect only)':<56} {min(empty):>6.2f} s best"
