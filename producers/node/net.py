"""Network interface counters from /proc/net/dev (ClusterCockpit netstat: `net_bytes_in/out`,
`net_pkts_in/out`, and their `_bw` rates).

/proc/net/dev shows the network namespace of the reading process, which for a node agent is the host's.
The loopback interface is skipped by default: its traffic never leaves the node.

Hand-parsed rather than psutil (development VM, 4 interfaces, best of 5 x 2000 calls): `NetReader.read()`
takes 37 us; `psutil.net_io_counters(pernic=True, nowrap=False)` 54 us (1.5x) before the exclusion
patterns and the structs (it decodes the file as text and builds a named tuple per interface).
"""

from __future__ import annotations

import fnmatch

import msgspec

from hpcbus.producers.node._io import join_root, read_bytes
from hpcbus.producers.node._rates import rate


class NetDevice(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one interface since it was created. Units: bytes and packets."""

    interface: str
    rx_bytes: int
    rx_packets: int
    tx_bytes: int
    tx_packets: int


class NetRate(msgspec.Struct, frozen=True, kw_only=True):
    """Per-second rates of one interface between two readings."""

    interface: str
    rx_bytes_per_s: float
    tx_bytes_per_s: float
    rx_packets_per_s: float
    tx_packets_per_s: float


def parse_net_dev(data: bytes, exclude: list[str]) -> list[NetDevice]:
    """Parse /proc/net/dev, leaving out interfaces that match one of the glob patterns in `exclude`."""
    out: list[NetDevice] = []
    for line in data.split(b"\n")[2:]:
        name_b, sep, rest = line.partition(b":")
        if not sep:
            continue
        name = name_b.strip().decode("utf-8", "replace")
        if any(fnmatch.fnmatchcase(name, pat) for pat in exclude):
            continue
        v = [int(x) for x in rest.split()]
        if len(v) < 16:
            continue
        out.append(
            NetDevice(
                interface=name,
                rx_bytes=v[0],
                rx_packets=v[1],
                tx_bytes=v[8],
                tx_packets=v[9],
            )
        )
    return out


class NetReader:
    """Reads `<root>/proc/net/dev`."""

    def __init__(self, root: str = "/", exclude: list[str] | None = None):
        self.path = join_root(root, "/proc/net/dev")
        self.exclude = ["lo"] if exclude is None else list(exclude)

    def read(self) -> list[NetDevice]:
        return parse_net_dev(read_bytes(self.path), self.exclude)


def net_rates(prev: list[NetDevice], cur: list[NetDevice], dt: float) -> list[NetRate]:
    """Rates for interfaces present in both readings; counters that went down (interface re-created)
    give no rate rather than a spike. /proc/net/dev counters are 64-bit, so no wrap is assumed."""
    before = {d.interface: d for d in prev}
    out: list[NetRate] = []
    for d in cur:
        p = before.get(d.interface)
        if p is None:
            continue
        rates = (
            rate(p.rx_bytes, d.rx_bytes, dt),
            rate(p.tx_bytes, d.tx_bytes, dt),
            rate(p.rx_packets, d.rx_packets, dt),
            rate(p.tx_packets, d.tx_packets, dt),
        )
        if any(r is None for r in rates):
            continue
        rx_b, tx_b, rx_p, tx_p = (float(r or 0.0) for r in rates)
        out.append(
            NetRate(
                interface=d.interface,
                rx_bytes_per_s=rx_b,
                tx_bytes_per_s=tx_b,
                rx_packets_per_s=rx_p,
                tx_packets_per_s=tx_p,
            )
        )
    return out
