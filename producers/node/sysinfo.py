"""What the node is: OS, CPU topology, memory, NUMA layout, GPUs, and an lstopo picture (Sonar sysinfo;
the `topology` of a ClusterCockpit cluster.json subcluster).

Read rarely (at start and, in Sonar's practice, daily), so it may do what the per-interval readers must
not: run `lstopo` once. That subprocess lives here only, is optional, and has a timeout; it is skipped
for fixture roots, since it would describe the real machine rather than the tree.

psutil vs hand reads (development VM, best of 5 x 2000 calls): the boot time comes from
`psutil.boot_time()` (21 us bare, 25 us with the PROCFS_PATH swap of `psutil_procfs`, against 40 us for
reading all of /proc/stat and searching it), so psutil it is. MemTotal stays hand-read: 14 us against
46 us for `psutil.virtual_memory()`. The topology stays hand-read too: `psutil.cpu_count()` gives counts
only (no socket/core/NUMA per hwthread) and reads the real /sys whatever the root.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import subprocess
import time

import msgspec
import psutil

from hpcbus.producers.node._io import (
    join_root,
    list_dir,
    parse_range_list,
    psutil_procfs,
    read_bytes,
    read_int,
    read_text,
)
from hpcbus.producers.node.gpu_nvml import GpuCard, NvmlGpuReader

log = logging.getLogger(__name__)

_NODE_MEMTOTAL = re.compile(rb"MemTotal:\s+(\d+)\s+kB")


class HwthreadTopology(msgspec.Struct, frozen=True, kw_only=True):
    """Where one online hardware thread sits."""

    hwthread: int
    socket: int
    """physical_package_id."""
    die: int = 0
    core: int
    """core_id (unique within a socket and die, not across the node)."""
    numa: int = 0
    """NUMA node holding the hwthread (0 without NUMA information)."""


class NumaNode(msgspec.Struct, frozen=True, kw_only=True):
    node: int
    hwthreads: list[int]
    memory_kib: int | None = None
    """MemTotal of the node, KiB."""


class Sysinfo(msgspec.Struct, kw_only=True):
    """The node's description (Sonar `SysinfoAttributes` plus the topology ClusterCockpit needs)."""

    time: float
    """When it was read, seconds since the epoch."""
    hostname: str
    os_name: str
    """uname sysname, e.g. `Linux`."""
    os_release: str
    """uname release (kernel version)."""
    architecture: str
    """uname machine, e.g. `x86_64`."""
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    cpu_model: str
    memory_kib: int
    """MemTotal, KiB (Sonar `memory`)."""
    numa_nodes: int
    distances: list[list[int]]
    """NUMA distance matrix (`/sys/devices/system/node/node<i>/distance`), row i = from node i."""
    numa: list[NumaNode]
    topology: list[HwthreadTopology]
    topo_svg: str | None = None
    """Base64 of `lstopo --of svg` when hwloc is installed and it ran in time."""
    cards: list[GpuCard] = msgspec.field(default_factory=list)
    boot_time: int | None = None
    """btime of /proc/stat, seconds since the epoch."""


def _cpuinfo(data: bytes) -> tuple[str, list[dict[str, str]]]:
    """(model name, per-processor key/value blocks) of /proc/cpuinfo."""
    blocks: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    model = ""
    arm: dict[str, str] = {}
    for raw in data.decode("utf-8", "replace").split("\n"):
        key, sep, value = raw.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        if key == "processor" and cur:
            blocks.append(cur)
            cur = {}
        cur[key] = value
        if not model and key in ("model name", "cpu model", "Model", "cpu"):
            model = value
        if key in ("CPU implementer", "CPU architecture", "CPU variant", "CPU part"):
            arm.setdefault(key, value)
    if cur:
        blocks.append(cur)
    if not model and arm:
        # Sonar's naming for aarch64, which has no model string in cpuinfo.
        model = f"ARMv{arm.get('CPU architecture', '?')}.{_int0(arm.get('CPU variant', '0'))}"
    return model, blocks


def _int0(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return 0


class SysinfoReader:
    """Reads the node description under `root`; `gpus` (optional) adds GPU cards."""

    def __init__(
        self,
        root: str = "/",
        gpus: NvmlGpuReader | None = None,
        topo_svg: bool = True,
        lstopo_timeout_s: float = 10.0,
    ):
        self.root = root
        self.gpus = gpus
        self.topo_svg = topo_svg and root in ("", "/")
        self.lstopo_timeout_s = lstopo_timeout_s

    def _p(self, path: str) -> str:
        return join_root(self.root, path)

    def read(self, now: float | None = None) -> Sysinfo:
        now = time.time() if now is None else now
        uname = os.uname()
        try:
            model, blocks = _cpuinfo(read_bytes(self._p("/proc/cpuinfo"), 1 << 20))
        except OSError:
            model, blocks = "", []
        try:
            meminfo = read_bytes(self._p("/proc/meminfo"))
            m = re.search(rb"MemTotal:\s+(\d+)", meminfo)
            memory = int(m.group(1)) if m else 0
        except OSError:
            memory = 0
        boot_time = self._boot_time()
        numa = self._numa()
        topology = self._topology(numa, blocks)
        sockets, cores_per_socket, threads_per_core = _counts(topology)
        distances = self._distances([n.node for n in numa])
        info = Sysinfo(
            time=now,
            hostname=read_text(self._p("/proc/sys/kernel/hostname"), uname.nodename),
            os_name=read_text(self._p("/proc/sys/kernel/ostype"), uname.sysname),
            os_release=read_text(self._p("/proc/sys/kernel/osrelease"), uname.release),
            architecture=uname.machine,
            sockets=sockets,
            cores_per_socket=cores_per_socket,
            threads_per_core=threads_per_core,
            cpu_model=model,
            memory_kib=memory,
            numa_nodes=max(1, len(numa)),
            distances=distances,
            numa=numa,
            topology=topology,
            boot_time=boot_time,
        )
        if self.gpus is not None:
            info.cards = self.gpus.read_cards()
        if self.topo_svg:
            info.topo_svg = self._lstopo()
        return info

    def _boot_time(self) -> int | None:
        """btime of `<root>/proc/stat` through psutil (stops at the btime line instead of reading the
        whole file: 21 us against 40 us by hand, see the module docstring); None when unreadable."""
        try:
            with psutil_procfs(self.root):
                return int(psutil.boot_time())
        except (OSError, RuntimeError, ValueError):  # no file / no btime line / not a number
            return None

    def _numa(self) -> list[NumaNode]:
        base = self._p("/sys/devices/system/node")
        out: list[NumaNode] = []
        for entry in list_dir(base):
            if not entry.startswith("node") or not entry[4:].isdigit():
                continue
            d = os.path.join(base, entry)
            mem = None
            try:
                m = _NODE_MEMTOTAL.search(read_bytes(os.path.join(d, "meminfo")))
                mem = int(m.group(1)) if m else None
            except OSError:
                pass
            out.append(
                NumaNode(
                    node=int(entry[4:]),
                    hwthreads=parse_range_list(read_text(os.path.join(d, "cpulist"))),
                    memory_kib=mem,
                )
            )
        out.sort(key=lambda n: n.node)
        return out

    def _distances(self, nodes: list[int]) -> list[list[int]]:
        rows: list[list[int]] = []
        for n in nodes:
            text = read_text(self._p(f"/sys/devices/system/node/node{n}/distance"))
            try:
                rows.append([int(x) for x in text.split()])
            except ValueError:
                rows.append([])
        return rows

    def _topology(self, numa: list[NumaNode], blocks: list[dict[str, str]]) -> list[HwthreadTopology]:
        numa_of = {cpu: n.node for n in numa for cpu in n.hwthreads}
        base = self._p("/sys/devices/system/cpu")
        out: list[HwthreadTopology] = []
        for entry in list_dir(base):
            if not entry.startswith("cpu") or not entry[3:].isdigit():
                continue
            t = os.path.join(base, entry, "topology")
            socket = read_int(os.path.join(t, "physical_package_id"))
            core = read_int(os.path.join(t, "core_id"))
            if socket is None or core is None:
                continue  # offline CPU: no topology directory
            cpu = int(entry[3:])
            out.append(
                HwthreadTopology(
                    hwthread=cpu,
                    socket=max(socket, 0),
                    die=max(read_int(os.path.join(t, "die_id")) or 0, 0),
                    core=core,
                    numa=numa_of.get(cpu, 0),
                )
            )
        if not out:
            # No sysfs topology (old kernel, odd container): fall back to /proc/cpuinfo.
            for b in blocks:
                if "processor" not in b:
                    continue
                cpu = _int0(b["processor"])
                out.append(
                    HwthreadTopology(
                        hwthread=cpu,
                        socket=_int0(b.get("physical id", "0")),
                        core=_int0(b.get("core id", b["processor"])),
                        numa=numa_of.get(cpu, 0),
                    )
                )
        out.sort(key=lambda h: h.hwthread)
        return out

    def _lstopo(self) -> str | None:
        exe = shutil.which("lstopo") or shutil.which("lstopo-no-graphics")
        if exe is None:
            return None
        try:
            res = subprocess.run(
                [exe, "--of", "svg", "-"],
                capture_output=True,
                timeout=self.lstopo_timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("lstopo failed: %s", exc)
            return None
        if res.returncode != 0 or not res.stdout.lstrip().startswith((b"<?xml", b"<svg")):
            log.info("lstopo failed: exit %s", res.returncode)
            return None
        return base64.b64encode(res.stdout).decode("ascii")


def _counts(topology: list[HwthreadTopology]) -> tuple[int, int, int]:
    """(sockets, cores per socket, threads per core); all 1 at least, as Sonar requires nonzero."""
    if not topology:
        return 1, 1, 1
    sockets = len({h.socket for h in topology})
    cores = len({(h.socket, h.die, h.core) for h in topology})
    return sockets, max(1, cores // sockets), max(1, len(topology) // max(1, cores))
