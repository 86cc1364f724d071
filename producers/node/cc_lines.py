"""ClusterCockpit-style metric lines for what a Sonar sample has no field for.

The Sonar part of a sample (memory used, load, busy seconds, GPUs, disks counters, jobs and processes) goes
through the translator; this module adds the measurements a ClusterCockpit site expects from a node agent
and the Slurm profiling plugins record: CPU percentages per hwthread and node, the rest of /proc/meminfo,
network, disk, InfiniBand and Lustre counters and rates, RAPL power, clock frequency per hwthread, and a
few GPU figures. Everything is declared once in `CC_METRICS` (name, level, unit, type, source), so the
table in docs/mapping.md and the tests come from the same place as the lines.

Rules, and why:

- **Names, units and types of cc-metric-collector** where it has the measurement (`cpustat`, `memstat`,
  `netstat`, `ibstat`, `lustrestat`, `rapl`, `cpufreq`, `nvidia`): a site that mixes hpcbus nodes and
  cc-metric-collector nodes in one InfluxDB or cc-metric-store must not get two units or two field types
  under one name (InfluxDB drops the points of the second type). So counters are integers and their rates
  are separate `_bw`/`_rate` floats, exactly as the collectors send them; percentages and kB are floats.
- **Node level as the metric store reads it** (`schemas.lineprotocol.node_level_tags`): node values are
  `type=node` without a `type-id` (stored at the host itself, as cc-metric-collector sends them), so a
  node-level query returns the node's `cpu_user`, not its mean with the hwthreads' values.
- **Device identity goes in `stype`/`stype-id`** (`stype=network,stype-id=eth0`), never in a free tag:
  cc-metric-store only reads `type`, `type-id`, `stype`, `stype-id`, so two interfaces under one free tag
  would overwrite each other there; a device's `type-id` is its `stype` (`type=node,type-id=network`), which
  puts it at `network` / `networketh0` below the host. RAPL package zones are `type=socket,type-id=<package>`,
  their sub-zones (dram, core) add `stype=rapl,stype-id=<name>`, zones outside a package (psys) are
  node-level.
- **Zeros are written**, as for the translator's node, hwthread, GPU and disk lines (docs/mapping.md
  principle 7): these are series a CC consumer plots, and cc-metric-store reads a missing point as "no
  data", not 0 (counters a source lists only once non-zero, such as Lustre's `open`, are written as 0
  until then). What the node does not have (no IB, no RAPL, no Lustre, no GPU, no huge pages in the
  kernel) simply has no lines.
- **Rates need two readings**: the first sample after start has counters but no rates and no CPU percent.
- Node-level `cpu_*` are what `cpustat` sends at node level: percent of *one* hwthread, summed over the
  node (0..100 x hwthreads); hwthread-level values are 0..100. `cpu_used` is 100 - idle (iowait counts as
  used, as in `cpustat`).
- A value that is not a finite number gets no line (line protocol cannot carry NaN or infinity).

Lines share their tag dicts per device: do not mutate them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.cpu import CpuPercent
from hpcbus.schemas.lineprotocol import Line, node_level_tags
from hpcbus.schemas.translate.common import unique_keys

__all__ = [
    "CC_METRICS",
    "CPU_FIELDS",
    "DEFAULT_CPU_FIELDS",
    "CcMetric",
    "cc_lines",
    "markdown_table",
    "self_lines",
]


class CcMetric(NamedTuple):
    """One measurement this module writes."""

    name: str
    level: str
    """Tags: `node`, `hwthread`, `socket`, `accelerator`, or `node/<stype>` for a device below the node."""
    unit: str
    kind: type
    """`int` or `float`: the one line-protocol type of the measurement."""
    source: str
    """Where the value comes from."""
    cc: str
    """cc-metric-collector collector that sends the same name ("" when the name is hpcbus')."""


_F, _I = float, int

CPU_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
    "used",
)
"""Every `cpu_<field>` percentage that can be written (`CpuPercent` attributes)."""

DEFAULT_CPU_FIELDS = ("user", "system", "idle", "iowait", "used")
"""The ones written unless configured otherwise: five lines per hwthread keep a 256-thread node's sample
small; `nice`, `irq`, `softirq`, `steal`, `guest`, `guest_nice` can be switched on."""

# (measurement, MemInfo attribute) in memstat's names; kB floats like memstat.
_MEM = (
    ("mem_total", "total"),
    ("mem_free", "free"),
    ("mem_available", "available"),
    ("mem_buffers", "buffers"),
    ("mem_cached", "cached"),
    ("mem_shared", "shmem"),
    ("mem_slab", "slab"),
    ("mem_sreclaimable", "sreclaimable"),
    ("mem_dirty", "dirty"),
    ("mem_writeback", "writeback"),
    ("mem_anon_pages", "anon_pages"),
    ("mem_mapped", "mapped"),
    ("swap_total", "swap_total"),
    ("swap_free", "swap_free"),
)
_HUGE = (
    ("mem_hugepages_total", "hugepages_total"),
    ("mem_hugepages_free", "hugepages_free"),
    ("mem_hugepages_size", "hugepage_size"),
)

_LUSTRE_OPS = ("open", "close", "getattr", "setattr", "statfs", "inode_permission")

CC_METRICS: tuple[CcMetric, ...] = (
    *(
        CcMetric(
            f"cpu_{f}",
            lvl,
            "%" if lvl == "hwthread" else "% of one hwthread, summed (0..100 x hwthreads)",
            _F,
            "/proc/stat, two readings: "
            + ("100 - idle (iowait counts as used)" if f == "used" else f"{f} ticks"),
            "cpustat",
        )
        for lvl in ("hwthread", "node")
        for f in CPU_FIELDS
    ),
    CcMetric("cpufreq", "hwthread", "MHz", _F, "cpufreq scaling_cur_freq (or /proc/cpuinfo)", "cpufreq"),
    *(CcMetric(n, "node", "kB (KiB)", _F, f"/proc/meminfo {a}", "memstat") for n, a in _MEM),
    CcMetric("mem_hugepages_total", "node", "count", _F, "/proc/meminfo HugePages_Total", "memstat"),
    CcMetric("mem_hugepages_free", "node", "count", _F, "/proc/meminfo HugePages_Free", "memstat"),
    CcMetric("mem_hugepages_size", "node", "kB (KiB)", _F, "/proc/meminfo Hugepagesize", "memstat"),
    CcMetric("net_bytes_in", "node/network", "bytes", _I, "/proc/net/dev counter", "netstat"),
    CcMetric("net_bytes_out", "node/network", "bytes", _I, "/proc/net/dev counter", "netstat"),
    CcMetric("net_pkts_in", "node/network", "packets", _I, "/proc/net/dev counter", "netstat"),
    CcMetric("net_pkts_out", "node/network", "packets", _I, "/proc/net/dev counter", "netstat"),
    CcMetric("net_bytes_in_bw", "node/network", "bytes/s", _F, "rate of net_bytes_in", "netstat"),
    CcMetric("net_bytes_out_bw", "node/network", "bytes/s", _F, "rate of net_bytes_out", "netstat"),
    CcMetric("net_pkts_in_bw", "node/network", "packets/s", _F, "rate of net_pkts_in", "netstat"),
    CcMetric("net_pkts_out_bw", "node/network", "packets/s", _F, "rate of net_pkts_out", "netstat"),
    CcMetric("io_read_bw", "node/disk", "bytes/s", _F, "/proc/diskstats sectors read x 512, rate", ""),
    CcMetric("io_write_bw", "node/disk", "bytes/s", _F, "/proc/diskstats sectors written x 512, rate", ""),
    CcMetric("io_reads_rate", "node/disk", "requests/s", _F, "/proc/diskstats reads completed, rate", ""),
    CcMetric("io_writes_rate", "node/disk", "requests/s", _F, "/proc/diskstats writes completed, rate", ""),
    CcMetric("io_util", "node/disk", "%", _F, "/proc/diskstats time with I/O in flight (iostat %util)", ""),
    CcMetric("rapl_average_power", "socket", "W", _F, "RAPL energy_uj, rate (package zone)", "rapl"),
    CcMetric("rapl_average_power", "socket/rapl", "W", _F, "RAPL energy_uj, rate (sub-zone)", "rapl"),
    CcMetric("rapl_average_power", "node/rapl", "W", _F, "RAPL energy_uj, rate (zone of no package)", "rapl"),
    CcMetric("ib_recv", "node/infiniband", "bytes", _I, "port_rcv_data x 4", "ibstat"),
    CcMetric("ib_xmit", "node/infiniband", "bytes", _I, "port_xmit_data x 4", "ibstat"),
    CcMetric("ib_recv_pkts", "node/infiniband", "packets", _I, "port_rcv_packets", "ibstat"),
    CcMetric("ib_xmit_pkts", "node/infiniband", "packets", _I, "port_xmit_packets", "ibstat"),
    CcMetric("ib_recv_bw", "node/infiniband", "bytes/s", _F, "rate of ib_recv", "ibstat"),
    CcMetric("ib_xmit_bw", "node/infiniband", "bytes/s", _F, "rate of ib_xmit", "ibstat"),
    CcMetric("ib_recv_pkts_bw", "node/infiniband", "packets/s", _F, "rate of ib_recv_pkts", "ibstat"),
    CcMetric("ib_xmit_pkts_bw", "node/infiniband", "packets/s", _F, "rate of ib_xmit_pkts", "ibstat"),
    CcMetric("lustre_read_bytes", "node/filesystem", "bytes", _I, "llite stats read_bytes sum", "lustrestat"),
    CcMetric(
        "lustre_write_bytes", "node/filesystem", "bytes", _I, "llite stats write_bytes sum", "lustrestat"
    ),
    CcMetric(
        "lustre_read_requests",
        "node/filesystem",
        "requests",
        _I,
        "llite stats read_bytes count",
        "lustrestat",
    ),
    CcMetric(
        "lustre_write_requests",
        "node/filesystem",
        "requests",
        _I,
        "llite stats write_bytes count",
        "lustrestat",
    ),
    *(
        CcMetric(f"lustre_{op}", "node/filesystem", "count", _I, f"llite stats {op} count", "lustrestat")
        for op in _LUSTRE_OPS
    ),
    CcMetric("lustre_read_bw", "node/filesystem", "bytes/s", _F, "rate of lustre_read_bytes", "lustrestat"),
    CcMetric("lustre_write_bw", "node/filesystem", "bytes/s", _F, "rate of lustre_write_bytes", "lustrestat"),
    CcMetric(
        "lustre_read_requests_rate",
        "node/filesystem",
        "requests/s",
        _F,
        "rate of read requests",
        "lustrestat",
    ),
    CcMetric(
        "lustre_write_requests_rate",
        "node/filesystem",
        "requests/s",
        _F,
        "rate of write requests",
        "lustrestat",
    ),
    CcMetric("nv_fb_mem_total", "accelerator", "MiB", _F, "NVML memory total (KiB / 1024)", "nvidia"),
    CcMetric("nv_energy_abs", "accelerator", "J", _I, "NVML total energy since driver load", "nvidia"),
    CcMetric("nv_compute_processes", "accelerator", "count", _I, "NVML compute processes", "nvidia"),
    CcMetric("nv_graphics_processes", "accelerator", "count", _I, "NVML graphics processes", "nvidia"),
    CcMetric("hpcbus_collect_seconds", "node", "s", _F, "wall time of this sample's reading (self)", ""),
    CcMetric("hpcbus_processes", "node", "count", _I, "processes read, kernel threads excluded (self)", ""),
    CcMetric("hpcbus_outbox_messages", "node", "count", _I, "messages not yet acknowledged (self)", ""),
    CcMetric(
        "hpcbus_outbox_dropped", "node", "count", _I, "messages dropped by a full backlog since start", ""
    ),
)
"""Everything `cc_lines` can write. A name may appear at several levels, always with one unit and type."""

_KIND: dict[str, type] = {}
for _m in CC_METRICS:
    if _KIND.setdefault(_m.name, _m.kind) is not _m.kind:  # pragma: no cover - a declaration mistake
        raise AssertionError(f"{_m.name} declared with two types")


def _finite(v: float) -> bool:
    return math.isfinite(v)


def _cpu(
    out: list[Line], pct: CpuPercent, fields: tuple[str, ...], tags: dict[str, str], scale: float, ts: int
) -> None:
    for f in fields:
        # cpustat's cpu_used is everything but idle (iowait included); CpuPercent.used leaves iowait out.
        v = (100.0 - pct.idle if f == "used" else getattr(pct, f)) * scale
        if _finite(v):
            out.append(Line(f"cpu_{f}", tags, {"value": float(v)}, ts))


def cc_lines(
    s: NodeSample,
    cluster: str,
    *,
    node: str = "",
    cpu_fields: Iterable[str] = DEFAULT_CPU_FIELDS,
) -> list[Line]:
    """The ClusterCockpit-style lines of one reading, timestamped with its whole second (as the Sonar lines).

    `node` overrides `s.hostname`; `cpu_fields` picks the `cpu_<field>` percentages (see `CPU_FIELDS`).
    """
    host = node or s.hostname
    ts = math.floor(s.time)
    out: list[Line] = []
    add = out.append
    base = {"cluster": cluster, "hostname": host}
    node_tags = {**base, "type": "node"}
    fields = tuple(cpu_fields)

    usage = s.cpu_usage
    if usage is not None and fields:
        for h in usage.hwthreads:
            _cpu(out, h, fields, {**base, "type": "hwthread", "type-id": str(h.hwthread)}, 1.0, ts)
        # cpustat's node level: percent of one hwthread summed over the node.
        _cpu(out, usage.node, fields, node_tags, float(max(1, len(usage.hwthreads))), ts)

    for f in s.cpufreq:
        if _finite(f.mhz):
            tags = {**base, "type": "hwthread", "type-id": str(f.hwthread)}
            add(Line("cpufreq", tags, {"value": float(f.mhz)}, ts))

    mem = s.memory
    if mem is not None:
        for name, attr in _MEM:
            add(Line(name, node_tags, {"value": float(getattr(mem, attr))}, ts))
        if mem.hugepage_size:  # the kernel has huge pages: 0 of them configured is a value, written
            for name, attr in _HUGE:
                add(Line(name, node_tags, {"value": float(getattr(mem, attr))}, ts))

    def dev_tags(stype: str, key: str) -> dict[str, str]:
        tags = {**node_tags, "stype": stype, "stype-id": key}
        node_level_tags(tags)
        return tags

    net_keys = dict(zip((d.interface for d in s.net), unique_keys(d.interface for d in s.net), strict=True))
    for d in s.net:
        tags = dev_tags("network", net_keys[d.interface])
        add(Line("net_bytes_in", tags, {"value": d.rx_bytes}, ts))
        add(Line("net_bytes_out", tags, {"value": d.tx_bytes}, ts))
        add(Line("net_pkts_in", tags, {"value": d.rx_packets}, ts))
        add(Line("net_pkts_out", tags, {"value": d.tx_packets}, ts))
    for r in s.net_rates:
        key = net_keys.get(r.interface)
        if key is None:
            continue
        tags = dev_tags("network", key)
        for name, v in (
            ("net_bytes_in_bw", r.rx_bytes_per_s),
            ("net_bytes_out_bw", r.tx_bytes_per_s),
            ("net_pkts_in_bw", r.rx_packets_per_s),
            ("net_pkts_out_bw", r.tx_packets_per_s),
        ):
            if _finite(v):
                add(Line(name, tags, {"value": float(v)}, ts))

    disk_keys = dict(zip((d.name for d in s.disks), unique_keys(d.name for d in s.disks), strict=True))
    for dr in s.disk_rates:
        key = disk_keys.get(dr.name, dr.name)
        tags = dev_tags("disk", key)
        for name, v in (
            ("io_read_bw", dr.read_bytes_per_s),
            ("io_write_bw", dr.write_bytes_per_s),
            ("io_reads_rate", dr.reads_per_s),
            ("io_writes_rate", dr.writes_per_s),
            ("io_util", dr.busy_percent),
        ):
            if _finite(v):
                add(Line(name, tags, {"value": float(v)}, ts))

    parents = {z.zone: z.name for z in s.rapl}
    for p in s.rapl_power:
        if not _finite(p.power_w):
            continue
        add(Line("rapl_average_power", _rapl_tags(base, p.zone, p.name, parents), {"value": p.power_w}, ts))

    ib_names = [f"{p.device}:{p.port}" for p in s.infiniband]
    ib_keys = dict(zip(ib_names, unique_keys(ib_names), strict=True))
    for port in s.infiniband:
        tags = dev_tags("infiniband", ib_keys[f"{port.device}:{port.port}"])
        add(Line("ib_recv", tags, {"value": port.rcv_bytes}, ts))
        add(Line("ib_xmit", tags, {"value": port.xmit_bytes}, ts))
        add(Line("ib_recv_pkts", tags, {"value": port.rcv_packets}, ts))
        add(Line("ib_xmit_pkts", tags, {"value": port.xmit_packets}, ts))
    for ir in s.infiniband_rates:
        ib_key = ib_keys.get(f"{ir.device}:{ir.port}")
        if ib_key is None:
            continue
        tags = dev_tags("infiniband", ib_key)
        for name, v in (
            ("ib_recv_bw", ir.rcv_bytes_per_s),
            ("ib_xmit_bw", ir.xmit_bytes_per_s),
            ("ib_recv_pkts_bw", ir.rcv_packets_per_s),
            ("ib_xmit_pkts_bw", ir.xmit_packets_per_s),
        ):
            if _finite(v):
                add(Line(name, tags, {"value": float(v)}, ts))

    # Lustre: the file system name, not the llite instance (`scratch-ffff...` changes at every mount).
    fs_keys = dict(zip((m.mount for m in s.lustre), unique_keys(m.fs for m in s.lustre), strict=True))
    for st in s.lustre:
        tags = dev_tags("filesystem", fs_keys[st.mount])
        add(Line("lustre_read_bytes", tags, {"value": st.read_bytes}, ts))
        add(Line("lustre_write_bytes", tags, {"value": st.write_bytes}, ts))
        add(Line("lustre_read_requests", tags, {"value": st.reads}, ts))
        add(Line("lustre_write_requests", tags, {"value": st.writes}, ts))
        for op in _LUSTRE_OPS:  # llite stats lists only counters that moved: a missing one is 0
            add(Line(f"lustre_{op}", tags, {"value": st.ops.get(op, 0)}, ts))
    for lr in s.lustre_rates:
        fs_key = fs_keys.get(lr.mount)
        if fs_key is None:
            continue
        tags = dev_tags("filesystem", fs_key)
        for name, v in (
            ("lustre_read_bw", lr.read_bytes_per_s),
            ("lustre_write_bw", lr.write_bytes_per_s),
            ("lustre_read_requests_rate", lr.reads_per_s),
            ("lustre_write_requests_rate", lr.writes_per_s),
        ):
            if _finite(v):
                add(Line(name, tags, {"value": float(v)}, ts))

    # GPUs: type-id is the reading's bus identity (NVML uuid, or PCI bus id with `gpu_type_id = "pci"`), the
    # same as the translator's acc_* lines and the job events' accelerators (docs/mapping.md section 3).
    gpu_ids = [g.uuid or g.bus_id or f"unknown-gpu-{g.index}" for g in s.gpus]
    for g, key in zip(s.gpus, unique_keys(gpu_ids), strict=True):
        tags = {**base, "type": "accelerator", "type-id": key}
        if g.memory_total_kib is not None:
            add(Line("nv_fb_mem_total", tags, {"value": g.memory_total_kib / 1024}, ts))
        if g.energy_j is not None and _finite(g.energy_j):
            add(Line("nv_energy_abs", tags, {"value": int(g.energy_j)}, ts))
        if g.failing == 0:
            compute = sum(1 for p in g.processes if p.kind == "compute")
            add(Line("nv_compute_processes", tags, {"value": compute}, ts))
            add(Line("nv_graphics_processes", tags, {"value": len(g.processes) - compute}, ts))
    return out


def self_lines(
    s: NodeSample, cluster: str, *, node: str = "", queued: int | None = None, dropped: int | None = None
) -> list[Line]:
    """The agent's own cost and backlog, so a site can see what monitoring costs it and when data is at risk:
    the reading's wall time and process count, and (from the agent) the outbox length and drop count."""
    tags = {"cluster": cluster, "hostname": node or s.hostname, "type": "node"}
    ts = math.floor(s.time)
    out = [
        Line("hpcbus_collect_seconds", tags, {"value": float(s.collect_s)}, ts),
        Line("hpcbus_processes", tags, {"value": int(s.process_count)}, ts),
    ]
    if queued is not None:
        out.append(Line("hpcbus_outbox_messages", tags, {"value": int(queued)}, ts))
    if dropped is not None:
        out.append(Line("hpcbus_outbox_dropped", tags, {"value": int(dropped)}, ts))
    return out


def _rapl_tags(base: dict[str, str], zone: str, name: str, names: dict[str, str]) -> dict[str, str]:
    """Socket level for a package zone (`package-<n>`) and its sub-zones, node level for any other zone.

    Decided by the kernel's zone *name*, not the sysfs index: on many machines `intel-rapl:1` is `psys`
    (the whole platform), not package 1.
    """
    if name.startswith("package-") and name[8:].isdigit():
        return {**base, "type": "socket", "type-id": name[8:]}
    parent_zone = zone.rsplit(":", 1)[0] if zone.count(":") >= 2 else ""
    parent = names.get(parent_zone, "")
    if parent.startswith("package-") and parent[8:].isdigit():
        return {**base, "type": "socket", "type-id": parent[8:], "stype": "rapl", "stype-id": name or zone}
    tags = {**base, "type": "node", "stype": "rapl", "stype-id": name or zone}
    node_level_tags(tags)
    return tags


def markdown_table() -> str:
    """The table for docs/mapping.md (one row per measurement and level)."""
    levels = {
        "node": "`node` / none",
        "hwthread": "`hwthread` / `<i>`",
        "socket": "`socket` / `<package>`",
        "socket/rapl": "`socket` / `<package>`, `stype=rapl`, `stype-id=<zone name>`",
        "accelerator": "`accelerator` / `<uuid>`",
    }
    rows = [
        "| measurement | level (`type` / `type-id`, sub-type) | unit | type | source | cc-metric-collector |",
        "|---|---|---|---|---|---|",
    ]
    for m in CC_METRICS:
        if m.level in levels:
            level = levels[m.level]
        else:
            stype = m.level.split("/", 1)[1]
            what = {"rapl": "zone name", "network": "interface", "disk": "device"}.get(stype, "")
            what = what or {"infiniband": "<hca>:<port>", "filesystem": "fs name"}.get(stype, stype)
            level = f"`node` / `{stype}`, `stype={stype}`, `stype-id=<{what.strip('<>')}>`"
        kind = "int" if m.kind is int else "float"
        rows.append(f"| `{m.name}` | {level} | {m.unit} | {kind} | {m.source} | {m.cc or '-'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
