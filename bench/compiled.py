"""The compiled line scan (`schemas/lineprotocol/_scan.c`) on a node agent's metric lines, against bare
`line_protocol_parser.parse_line` of the same lines and against the pure path (`parse_payload`, what the
InfluxDB sink reads every message with today).

The lines are what `hpcbus produce node` publishes (`format_line`: seconds, hwthread, node, accelerator and
device levels), as 1000-line NATS payloads (bytes). Before timing, the compiled scan's output must equal the
pure path's on every payload (`scan_compiled` == `scan_pure`) and the C scan must have taken every line
itself; without the extension (no compiler, `HPCBUS_PURE=1`) the row says so instead of timing.
"""

from __future__ import annotations

import time

from line_protocol_parser import parse_line

from bench.timing import interleaved, report
from hpcbus.schemas.lineprotocol import format_line, metric, parse_payload, scan
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE

N_LINES = 200_000


def node_payloads(now: int, n: int = N_LINES) -> list[bytes]:
    """`n` lines as 64 nodes of 128 hwthreads send them each 30 s, cut into 1000-line payloads."""
    out: list[str] = []
    ts = now - 3600
    i = 0
    while len(out) < n:
        host = f"c{i % 64:03d}.fox"
        for cpu in range(128):
            line = metric("cpu_user", cpu * 0.37, hostname=host, time=ts, type="hwthread", type_id=str(cpu))
            out.append(format_line(line))
        out.append(format_line(metric("mem_used", 123456789 + i, hostname=host, time=ts)))
        out.append(format_line(metric("cpu_load", 12.5, hostname=host, time=ts, job="4711")))
        out.append(
            format_line(metric("disk_read", 1.5, hostname=host, time=ts, stype="disk", stype_id="sda"))
        )
        for g in range(4):
            gpu = f"00000000:{g + 1:02x}:00.0"
            out.append(
                format_line(metric("nv_util", 87, hostname=host, time=ts, type="accelerator", type_id=gpu))
            )
        i += 1
        if i % 64 == 0:
            ts += 30
    out = out[:n]
    return [("\n".join(out[k : k + 1000]) + "\n").encode() for k in range(0, n, 1000)]


def run() -> list[str]:
    name = "LP scan (compiled) vs bare parse_line"
    if scan.scan is scan.scan_pure:
        return [f"{name:<56} not measured: the C extension is not built or HPCBUS_PURE=1 (pure Python)"]
    now = int(time.time())
    payloads = node_payloads(now)
    for payload in payloads:  # equal output first, and the C scan took every line itself
        fast = scan.scan_compiled(payload, now=now, max_future=DEFAULT_MAX_FUTURE)
        assert fast == scan.scan_pure(payload, now=now, max_future=DEFAULT_MAX_FUTURE)
        assert len(fast.items) == 1000 and all(type(item) is str for item in fast.items)
        assert not fast.problems

    def bare() -> None:
        for payload in payloads:
            kept = []  # any consumer keeps what it parsed until the message is handled
            for s in payload.decode().split("\n"):
                if s:
                    kept.append(parse_line(s))

    def compiled() -> None:
        for payload in payloads:
            scan.scan_compiled(payload, now=now, max_future=DEFAULT_MAX_FUTURE)

    def pure() -> None:
        for payload in payloads:
            parse_payload(payload, now=now, max_future=DEFAULT_MAX_FUTURE)

    t_bare, t_compiled, t_pure = interleaved([bare, compiled, pure])
    return [
        report(name, t_compiled, t_bare, N_LINES, "lines"),
        report("LP scan (compiled) vs pure path (parse_payload)", t_compiled, t_pure, N_LINES, "lines"),
        report("LP scan (pure path) vs bare parse_line", t_pure, t_bare, N_LINES, "lines"),
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
