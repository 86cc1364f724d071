"""CPU accounting of processes and of the whole machine, read from /proc, for the end-to-end benchmarks.

When InfluxDB, nats-server and a worker share the machine's cores, a throughput ratio only means something
next to where the CPU went: `Cpu` takes a snapshot of named processes and of the machine's busy time, and
the difference of two snapshots says how many CPU seconds each used and how many of the machine's cores
were busy meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from hpcbus.producers.node.cpu import CpuReader

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a running process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent not idle (nor waiting for I/O) since boot."""
    stat = CpuReader().read()
    node = stat.node  # `total` is user..steal: guest time is already inside user
    return (node.total - node.idle - node.iowait) / stat.clock_ticks


class Usage(msgspec.Struct):
    """CPU used between two snapshots."""

    seconds: float
    """Wall clock."""
    processes: dict[str, float]
    """Name -> CPU seconds."""
    busy: float
    """CPU seconds the whole machine was busy (every process, ours or not)."""

    @property
    def cores_busy(self) -> float:
        return self.busy / self.seconds if self.seconds else 0.0

    def per_line_us(self, name: str, lines: int) -> float:
        return self.processes.get(name, 0.0) / lines * 1e6

    def total_us(self, lines: int) -> float:
        """CPU of the named processes per line, µs."""
        return sum(self.processes.values()) / lines * 1e6


class Cpu:
    """`with Cpu({"influxd": [pid], "workers": [pid, pid]}) as cpu: ...`, then `cpu.usage`."""

    def __init__(self, pids: dict[str, list[int | None]]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}
        self._t0 = 0.0
        self._busy0 = 0.0
        self.usage = Usage(0.0, {}, 0.0)

    def _snapshot(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in self.pids.items()}

    def __enter__(self) -> Cpu:
        self._start = self._snapshot()
        self._t0 = time.monotonic()
        self._busy0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._snapshot()
        self.usage = Usage(
            time.monotonic() - self._t0,
            {name: end[name] - self._start[name] for name in end},
            machine_busy_seconds() - self._busy0,
        )


def peak_rss_mb(pid: int) -> float:
    """The process' peak resident set (`VmHWM`), MB."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")
