"""ClusterCockpit-style metric lines for what a Sonar sample has no field for.

The Sonar part of a sample (memory used, load, busy seconds, GPUs, disks counters, jobs and processes) goes
through the translator; this module adds the measurements a ClusterCockpit site expects from a node agent
and the Slurm profiling plugins record: CPU percentages per hwthread and node, the rest of /proc/meminfo,
network, disk, InfiniBand and Lustre counters and rates, RAPL power, clock frequency per hwthread, and a
few GPU figures. Every name, with its unit, type, levels and aggregation, is declared once in the metric
registry (`schemas.metrics.node.NODE`); this module writes them, each value in the registry's type
(converted where the reading has another type, checked once at import where it has that type: `_typed`,
`_as_read`), and docs/mapping.md's table is generated from the registry.

Rules, and why:

- **Names, units and types of cc-metric-collector** where it has the measurement (why: the registry,
  `schemas/metrics/node.py`): counters are integers, their rates separate `_bw`/`_rate` floats.
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

import msgspec

from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.cpu import CpuPercent
from hpcbus.producers.node.infiniband import IbPort
from hpcbus.producers.node.lustre import LustreStats
from hpcbus.producers.node.net import NetDevice
from hpcbus.schemas.lineprotocol import (
    STYPE_DISK,
    STYPE_FILESYSTEM,
    STYPE_INFINIBAND,
    STYPE_NETWORK,
    Line,
    node_level_tags,
)
from hpcbus.schemas.metrics import BY_NAME
from hpcbus.schemas.metrics.node import CPU_FIELDS, DEFAULT_CPU_FIELDS, HUGEPAGES, LUSTRE_OPS, MEMINFO
from hpcbus.schemas.translate.common import device_key, unique_keys

__all__ = [
    "CPU_FIELDS",
    "DEFAULT_CPU_FIELDS",
    "cc_lines",
    "self_lines",
]


def _typed(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str, type], ...]:
    """(measurement, attribute, the registry's type of the measurement) for each (measurement, attribute):
    for readings whose type is not the registry's (meminfo's kB ints are written as floats, as memstat
    sends them); the type is looked up once here, not per line."""
    return tuple((name, attr, BY_NAME[name].kind) for name, attr in pairs)


def _as_read(struct: type[msgspec.Struct], pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """(measurement, attribute of `struct`) pairs whose values are written as `struct` holds them: checked
    once here that each attribute has the registry's type of its measurement (TypeError at import
    otherwise), so no line pays for a conversion."""
    read = {f.name: f.type for f in msgspec.structs.fields(struct)}
    pairs = tuple(pairs)
    for name, attr in pairs:
        if read[attr] is not BY_NAME[name].kind:
            kind = BY_NAME[name].kind.__name__
            raise TypeError(f"{name}: the registry says {kind}, {struct.__name__}.{attr} holds {read[attr]}")
    return pairs


_MEM = _typed(MEMINFO)
_HUGE = _typed(HUGEPAGES)
_NET = _as_read(
    NetDevice,
    (
        ("net_bytes_in", "rx_bytes"),
        ("net_bytes_out", "tx_bytes"),
        ("net_pkts_in", "rx_packets"),
        ("net_pkts_out", "tx_packets"),
    ),
)
_IB = _as_read(
    IbPort,
    (
        ("ib_recv", "rcv_bytes"),
        ("ib_xmit", "xmit_bytes"),
        ("ib_recv_pkts", "rcv_packets"),
        ("ib_xmit_pkts", "xmit_packets"),
    ),
)
_LUSTRE = _as_read(
    LustreStats,
    (
        ("lustre_read_bytes", "read_bytes"),
        ("lustre_write_bytes", "write_bytes"),
        ("lustre_read_requests", "reads"),
        ("lustre_write_requests", "writes"),
    ),
)
_LUSTRE_OPS = tuple((f"lustre_{op}", op) for op in LUSTRE_OPS)
if any(BY_NAME[name].kind is not int for name, _ in _LUSTRE_OPS):  # `LustreStats.ops` holds ints
    raise TypeError("the lustre_<op> counters are ints in LustreStats.ops")
_ENERGY = BY_NAME["nv_energy_abs"].kind
_GPU_PROCESSES = BY_NAME["nv_compute_processes"].kind


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
        for name, attr, kind in _MEM:
            add(Line(name, node_tags, {"value": kind(getattr(mem, attr))}, ts))
        if mem.hugepage_size:  # the kernel has huge pages: 0 of them configured is a value, written
            for name, attr, kind in _HUGE:
                add(Line(name, node_tags, {"value": kind(getattr(mem, attr))}, ts))

    def dev_tags(stype: str, key: str) -> dict[str, str]:
        tags = {**node_tags, "stype": stype, "stype-id": key}
        node_level_tags(tags)
        return tags

    net_keys = dict(zip((d.interface for d in s.net), unique_keys(d.interface for d in s.net), strict=True))
    for d in s.net:
        tags = dev_tags(STYPE_NETWORK, net_keys[d.interface])
        for name, attr in _NET:
            add(Line(name, tags, {"value": getattr(d, attr)}, ts))
    for r in s.net_rates:
        key = net_keys.get(r.interface)
        if key is None:
            continue
        tags = dev_tags(STYPE_NETWORK, key)
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
        tags = dev_tags(STYPE_DISK, key)
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
        tags = dev_tags(STYPE_INFINIBAND, ib_keys[f"{port.device}:{port.port}"])
        for name, attr in _IB:
            add(Line(name, tags, {"value": getattr(port, attr)}, ts))
    for ir in s.infiniband_rates:
        ib_key = ib_keys.get(f"{ir.device}:{ir.port}")
        if ib_key is None:
            continue
        tags = dev_tags(STYPE_INFINIBAND, ib_key)
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
        tags = dev_tags(STYPE_FILESYSTEM, fs_keys[st.mount])
        for name, attr in _LUSTRE:
            add(Line(name, tags, {"value": getattr(st, attr)}, ts))
        for name, op in _LUSTRE_OPS:  # llite stats lists only counters that moved: a missing one is 0
            add(Line(name, tags, {"value": st.ops.get(op, 0)}, ts))
    for lr in s.lustre_rates:
        fs_key = fs_keys.get(lr.mount)
        if fs_key is None:
            continue
        tags = dev_tags(STYPE_FILESYSTEM, fs_key)
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
    for g, key in zip(s.gpus, unique_keys(gpu_ids, safe=device_key), strict=True):
        tags = {**base, "type": "accelerator", "type-id": key}
        if g.memory_total_kib is not None:
            add(Line("nv_fb_mem_total", tags, {"value": g.memory_total_kib / 1024}, ts))
        if g.energy_j is not None and _finite(g.energy_j):
            add(Line("nv_energy_abs", tags, {"value": _ENERGY(g.energy_j)}, ts))
        if g.failing == 0:
            compute = sum(1 for p in g.processes if p.kind == "compute")
            add(Line("nv_compute_processes", tags, {"value": _GPU_PROCESSES(compute)}, ts))
            add(
                Line("nv_graphics_processes", tags, {"value": _GPU_PROCESSES(len(g.processes) - compute)}, ts)
            )
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
