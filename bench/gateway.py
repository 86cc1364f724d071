"""`hpcbus gateway` end to end: an InfluxDB client POSTing to the gateway, answered once JetStream stored it.

One client, one keep-alive HTTP connection, 5000-line gzip batches of ClusterCockpit lines (`precision=s`);
the gateway's rate is lines per second acknowledged (204, after JetStream's PubAck). The baseline is the same
client POSTing the same batches to InfluxDB 1.x's `/write` directly, in the same run. Target: >= 0.8x.
"""

from __future__ import annotations

import gzip
import http.client
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from tests.services import LOOPBACK, InfluxDB, NatsServer, free_port, wait_until

N_LINES = 300_000
BATCH = 5000
T0 = 1_700_000_000
TARGET = 0.8


def batches(measurement: str) -> list[bytes]:
    """Gzip bodies of `BATCH` lines each (compressed before timing: the client's cost is not measured)."""
    out = []
    for b in range(N_LINES // BATCH):
        ts = T0 + b
        body = "".join(
            f"{measurement},hostname=c{b % 64:03d},type=hwthread,type-id={j} value={j * 0.5 + b} {ts}\n"
            for j in range(BATCH)
        )
        out.append(gzip.compress(body.encode(), compresslevel=1))
    return out


def post_all(host: str, port: int, path: str, bodies: Iterable[bytes], ok: int) -> float:
    """Seconds to POST every body over one keep-alive connection, each answer awaited."""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain"}
    try:
        start = time.monotonic()
        for body in bodies:
            conn.request("POST", path, body=body, headers=headers)
            answer = conn.getresponse()
            text = answer.read()
            if answer.status != ok:
                raise RuntimeError(f"POST {path}: {answer.status} {text[:200]!r}")
        return time.monotonic() - start
    finally:
        conn.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def run() -> list[str]:
    with (
        tempfile.TemporaryDirectory(prefix="hpcbus-bench-") as tmp,
        NatsServer(Path(tmp) / "nats") as ns,
        InfluxDB(Path(tmp) / "influx") as influx,
    ):
        influx.create_db("direct")
        port = free_port()
        log = Path(tmp) / "gateway.log"
        argv = ["gateway", "--nats", ns.url, "--cluster", "bench", "--listen", f"{LOOPBACK}:{port}"]
        with open(log, "wb") as out:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "hpcbus", *argv],
                stdout=out,
                stderr=out,
            )
        try:
            wait_until("gateway healthy", lambda: healthy(f"http://{LOOPBACK}:{port}"), 30, interval=0.1)
            warm = batches("warm")[:2]
            post_all(LOOPBACK, port, "/write?db=bench&precision=s", warm, 204)
            post_all(LOOPBACK, influx.port, "/write?db=direct&precision=s", warm, 204)
            t_direct = post_all(LOOPBACK, influx.port, "/write?db=direct&precision=s", batches("tp"), 204)
            t_gateway = post_all(LOOPBACK, port, "/write?db=bench&precision=s", batches("tp"), 204)
        finally:
            gateway.terminate()
            gateway.wait(30)
    ratio = t_direct / t_gateway
    verdict = "OK" if ratio >= TARGET else "MISSED"
    return [
        f"{'gateway: 300k lines HTTP->JetStream-acked vs InfluxDB':<56} {N_LINES / t_gateway:>12,.0f} lines/s  "
        f"baseline {N_LINES / t_direct:>12,.0f} lines/s  ratio {ratio:5.2f}x  target >= {TARGET:.2f}x: {verdict}"
    ]


if __name__ == "__main__":
    for line in run():
        print(line)
