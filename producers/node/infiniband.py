"""InfiniBand port counters from sysfs (ClusterCockpit ibstat: `ib_recv`, `ib_xmit`, `ib_recv_pkts`,
`ib_xmit_pkts`; Slurm acct_gather_interconnect/ofed gathers the same four).

`port_rcv_data` / `port_xmit_data` count 4-byte words ("octets divided by 4" in the IBA spec), so they are
multiplied by 4 here. The kernel exposes the 64-bit extended counters when the HCA has them; old HCAs
have 32-bit counters that stop at 2^32-1 instead of wrapping, which shows as a rate of zero.
"""

from __future__ import annotations

import os

import msgspec

from hpcbus.producers.node._io import join_root, list_dir, read_int, read_text
from hpcbus.producers.node._rates import rate

IB_DATA_WORD_BYTES = 4


class IbPort(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one port of one HCA since they were last reset."""

    device: str
    """HCA name, e.g. `mlx5_0`."""
    port: int
    rcv_bytes: int
    """port_rcv_data x 4, bytes received."""
    xmit_bytes: int
    """port_xmit_data x 4, bytes sent."""
    rcv_packets: int
    xmit_packets: int
    state: str = ""
    """e.g. `4: ACTIVE`."""
    link_layer: str = ""
    """`InfiniBand` or `Ethernet` (RoCE)."""


class IbRate(msgspec.Struct, frozen=True, kw_only=True):
    """Per-second rates of one port between two readings."""

    device: str
    port: int
    rcv_bytes_per_s: float
    xmit_bytes_per_s: float
    rcv_packets_per_s: float
    xmit_packets_per_s: float


class InfinibandReader:
    """Reads `<root>/sys/class/infiniband/<dev>/ports/<n>/counters`. No HCA -> empty list."""

    def __init__(self, root: str = "/"):
        self.base = join_root(root, "/sys/class/infiniband")

    def read(self) -> list[IbPort]:
        out: list[IbPort] = []
        for dev in list_dir(self.base):
            ports = os.path.join(self.base, dev, "ports")
            for port in list_dir(ports):
                if not port.isdigit():
                    continue
                pdir = os.path.join(ports, port)
                c = os.path.join(pdir, "counters")
                rcv = read_int(os.path.join(c, "port_rcv_data"))
                xmit = read_int(os.path.join(c, "port_xmit_data"))
                if rcv is None or xmit is None:
                    continue
                out.append(
                    IbPort(
                        device=dev,
                        port=int(port),
                        rcv_bytes=rcv * IB_DATA_WORD_BYTES,
                        xmit_bytes=xmit * IB_DATA_WORD_BYTES,
                        rcv_packets=read_int(os.path.join(c, "port_rcv_packets")) or 0,
                        xmit_packets=read_int(os.path.join(c, "port_xmit_packets")) or 0,
                        state=read_text(os.path.join(pdir, "state")),
                        link_layer=read_text(os.path.join(pdir, "link_layer")),
                    )
                )
        return out


def ib_rates(prev: list[IbPort], cur: list[IbPort], dt: float) -> list[IbRate]:
    """Rates for ports present in both readings; a counter reset gives no rate."""
    before = {(p.device, p.port): p for p in prev}
    out: list[IbRate] = []
    for p in cur:
        o = before.get((p.device, p.port))
        if o is None:
            continue
        values = (
            rate(o.rcv_bytes, p.rcv_bytes, dt),
            rate(o.xmit_bytes, p.xmit_bytes, dt),
            rate(o.rcv_packets, p.rcv_packets, dt),
            rate(o.xmit_packets, p.xmit_packets, dt),
        )
        if any(v is None for v in values):
            continue
        rb, xb, rp, xp = (float(v or 0.0) for v in values)
        out.append(
            IbRate(
                device=p.device,
                port=p.port,
                rcv_bytes_per_s=rb,
                xmit_bytes_per_s=xb,
                rcv_packets_per_s=rp,
                xmit_packets_per_s=xp,
            )
        )
    return out
