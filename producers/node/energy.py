"""CPU package and DRAM energy from the RAPL powercap interface (ClusterCockpit rapl:
`rapl_average_power`; Slurm acct_gather_energy/rapl reads the same counters).

Each zone `/sys/class/powercap/intel-rapl:<pkg>[:<sub>]` has a cumulative `energy_uj` counter that wraps
at `max_energy_range_uj`; power is the energy difference over time, with one wrap allowed per interval.
(The AMD Zen driver registers under the same `intel-rapl` names.) Since Linux 5.10 `energy_uj` is
readable by root only; the collector reports that once as an error and carries on.
"""

from __future__ import annotations

import os

import msgspec

from hpcbus.producers.node._io import join_root, list_dir, read_bytes, read_int, read_text
from hpcbus.producers.node._rates import counter_delta


class RaplZone(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of one RAPL zone."""

    zone: str
    """sysfs name, e.g. `intel-rapl:0` (package 0) or `intel-rapl:0:1` (its sub-zone 1)."""
    name: str
    """Kernel's name of the domain: `package-0`, `dram`, `core`, `uncore`, `psys`."""
    package: int
    """Package (socket) number from the zone name; -1 when it has none."""
    energy_uj: int
    """Cumulative energy, microjoules (wraps at `max_energy_range_uj`)."""
    max_energy_range_uj: int
    """Counter range, microjoules; 0 when the kernel does not say."""


class RaplPower(msgspec.Struct, frozen=True, kw_only=True):
    """Average power of one zone between two readings."""

    zone: str
    name: str
    package: int
    power_w: float
    """Watts (joules per second) averaged over the interval."""
    energy_j: float
    """Joules consumed during the interval."""


class RaplReader:
    """Reads `<root>/sys/class/powercap/intel-rapl:*`. No zones (no RAPL, VM) -> empty list."""

    def __init__(self, root: str = "/"):
        self.base = join_root(root, "/sys/class/powercap")

    def read(self) -> list[RaplZone]:
        out: list[RaplZone] = []
        for entry in list_dir(self.base):
            if not entry.startswith("intel-rapl") or ":" not in entry:
                continue  # `intel-rapl` itself is the control type, not a zone
            zdir = os.path.join(self.base, entry)
            path = os.path.join(zdir, "energy_uj")
            if not os.path.exists(path):
                continue
            energy = int(read_bytes(path))  # PermissionError on >= 5.10 without root: reported once
            parts = entry.split(":")
            try:
                package = int(parts[1])
            except (IndexError, ValueError):
                package = -1
            out.append(
                RaplZone(
                    zone=entry,
                    name=read_text(os.path.join(zdir, "name"), entry),
                    package=package,
                    energy_uj=energy,
                    max_energy_range_uj=read_int(os.path.join(zdir, "max_energy_range_uj")) or 0,
                )
            )
        return out


def rapl_power(prev: list[RaplZone], cur: list[RaplZone], dt: float) -> list[RaplPower]:
    """Power per zone between two readings `dt` seconds apart (wrap-aware)."""
    if dt <= 0:
        return []
    before = {z.zone: z for z in prev}
    out: list[RaplPower] = []
    for z in cur:
        p = before.get(z.zone)
        if p is None:
            continue
        delta = counter_delta(p.energy_uj, z.energy_uj, z.max_energy_range_uj)
        if delta is None:
            continue
        joules = delta / 1e6
        out.append(
            RaplPower(zone=z.zone, name=z.name, package=z.package, power_w=joules / dt, energy_j=joules)
        )
    return out
