"""Current clock frequency per hardware thread (ClusterCockpit cpufreq; Slurm's CPUFrequency).

The cpufreq sysfs attribute `scaling_cur_freq` (kHz) is cheap and per hwthread. Machines without a
cpufreq driver (many VMs) have none; there `cpu MHz` of /proc/cpuinfo is used instead when allowed,
and `source` says which one it was.

Not psutil: `psutil.cpu_freq(percpu=True)` is faster on the development VM (52 us against 111 us here, both
ending up in /proc/cpuinfo since the VM has no cpufreq driver), but it reads the real
/sys/devices/system/cpu whatever psutil.PROCFS_PATH says (so a fixture root would report the host) and
returns a bare list without hwthread numbers (an offline CPU would shift every later one).
"""

from __future__ import annotations

import os

import msgspec

from hpcbus.producers.node._io import join_root, list_dir, read_bytes, read_optional


class CpuFreq(msgspec.Struct, frozen=True, kw_only=True):
    """Clock of one hwthread at reading time."""

    hwthread: int
    mhz: float
    """Megahertz."""
    source: str = "cpufreq"
    """`cpufreq` (sysfs scaling_cur_freq, kHz / 1000) or `cpuinfo` (/proc/cpuinfo `cpu MHz`)."""


class CpuFreqReader:
    """Reads `<root>/sys/devices/system/cpu/cpu<N>/cpufreq/scaling_cur_freq`."""

    def __init__(self, root: str = "/", cpuinfo_fallback: bool = True):
        self.base = join_root(root, "/sys/devices/system/cpu")
        self.cpuinfo = join_root(root, "/proc/cpuinfo")
        self.cpuinfo_fallback = cpuinfo_fallback

    def read(self) -> list[CpuFreq]:
        out: list[CpuFreq] = []
        for entry in list_dir(self.base):
            if not entry.startswith("cpu") or not entry[3:].isdigit():
                continue
            data = read_optional(os.path.join(self.base, entry, "cpufreq", "scaling_cur_freq"))
            if data is None:
                continue
            try:
                out.append(CpuFreq(hwthread=int(entry[3:]), mhz=int(data) / 1000.0))
            except ValueError:
                continue
        out.sort(key=lambda f: f.hwthread)
        if out or not self.cpuinfo_fallback:
            return out
        return self._from_cpuinfo()

    def _from_cpuinfo(self) -> list[CpuFreq]:
        try:
            data = read_bytes(self.cpuinfo, 262144)
        except OSError:
            return []
        out: list[CpuFreq] = []
        cpu = -1
        for line in data.split(b"\n"):
            key, sep, value = line.partition(b":")
            if not sep:
                continue
            key = key.strip()
            try:
                if key == b"processor":
                    cpu = int(value)
                elif key == b"cpu MHz" and cpu >= 0:
                    out.append(CpuFreq(hwthread=cpu, mhz=float(value), source="cpuinfo"))
            except ValueError:
                continue
        return out
