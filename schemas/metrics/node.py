"""The node agent's ClusterCockpit lines: what a Sonar sample has no field for.

Names, units and types of cc-metric-collector where it has the measurement (`cpustat`, `memstat`, `netstat`,
`ibstat`, `lustrestat`, `rapl`, `cpufreq`, `nvidia`): a site that mixes hpcbus nodes and cc-metric-collector
nodes in one InfluxDB or cc-metric-store must not get two units or two field types under one name. So
counters are integers and their rates are separate `_bw`/`_rate` floats, as the collectors send them;
percentages and kB are floats. `producers.node.cc_lines` writes them; the groups below (`CPU_FIELDS`,
`MEMINFO`, `HUGEPAGES`, `LUSTRE_OPS`) are the names it loops over.
"""

from __future__ import annotations

from hpcbus.schemas.metrics.model import Metric

__all__ = ["CPU_FIELDS", "DEFAULT_CPU_FIELDS", "HUGEPAGES", "LUSTRE_OPS", "MEMINFO", "NODE"]

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

MEMINFO = (
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
"""(measurement, `MemInfo` attribute) in memstat's names; kB floats like memstat."""
HUGEPAGES = (
    ("mem_hugepages_total", "hugepages_total"),
    ("mem_hugepages_free", "hugepages_free"),
    ("mem_hugepages_size", "hugepage_size"),
)
"""Written only where the kernel has huge pages (0 configured included)."""

LUSTRE_OPS = ("open", "close", "getattr", "setattr", "statfs", "inode_permission")
"""llite stats counters written as `lustre_<op>` (0 while the stats file does not list one yet)."""

_F, _I = float, int
_NET = ("network",)
_IB = ("infiniband",)
_FS = ("filesystem",)
_GPU = ("accelerator",)
_N = ("node",)

NODE: tuple[Metric, ...] = (
    *(
        Metric(
            f"cpu_{f}",
            ("hwthread", "node"),
            "%",
            _F,
            "sum",
            "/proc/stat, two readings: "
            + ("100 - idle (iowait counts as used)" if f == "used" else f"{f} ticks")
            + "; node: the sum over its hwthreads (0..100 x hwthreads)",
            "cpustat",
        )
        for f in CPU_FIELDS
    ),
    Metric(
        "cpufreq", ("hwthread",), "MHz", _F, "avg", "cpufreq scaling_cur_freq (or /proc/cpuinfo)", "cpufreq"
    ),
    *(Metric(n, _N, "kB (KiB)", _F, "sum", f"/proc/meminfo {a}", "memstat") for n, a in MEMINFO),
    Metric("mem_hugepages_total", _N, "count", _F, "sum", "/proc/meminfo HugePages_Total", "memstat"),
    Metric("mem_hugepages_free", _N, "count", _F, "sum", "/proc/meminfo HugePages_Free", "memstat"),
    Metric("mem_hugepages_size", _N, "kB (KiB)", _F, "max", "/proc/meminfo Hugepagesize", "memstat"),
    Metric("net_bytes_in", _NET, "bytes", _I, "sum", "/proc/net/dev counter", "netstat"),
    Metric("net_bytes_out", _NET, "bytes", _I, "sum", "/proc/net/dev counter", "netstat"),
    Metric("net_pkts_in", _NET, "packets", _I, "sum", "/proc/net/dev counter", "netstat"),
    Metric("net_pkts_out", _NET, "packets", _I, "sum", "/proc/net/dev counter", "netstat"),
    Metric("net_bytes_in_bw", _NET, "bytes/s", _F, "sum", "rate of net_bytes_in", "netstat"),
    Metric("net_bytes_out_bw", _NET, "bytes/s", _F, "sum", "rate of net_bytes_out", "netstat"),
    Metric("net_pkts_in_bw", _NET, "packets/s", _F, "sum", "rate of net_pkts_in", "netstat"),
    Metric("net_pkts_out_bw", _NET, "packets/s", _F, "sum", "rate of net_pkts_out", "netstat"),
    Metric("io_read_bw", ("disk",), "bytes/s", _F, "sum", "/proc/diskstats sectors read x 512, rate", ""),
    Metric("io_write_bw", ("disk",), "bytes/s", _F, "sum", "/proc/diskstats sectors written x 512, rate", ""),
    Metric("io_reads_rate", ("disk",), "requests/s", _F, "sum", "/proc/diskstats reads completed, rate", ""),
    Metric(
        "io_writes_rate", ("disk",), "requests/s", _F, "sum", "/proc/diskstats writes completed, rate", ""
    ),
    Metric(
        "io_util", ("disk",), "%", _F, "avg", "/proc/diskstats time with I/O in flight (iostat %util)", ""
    ),
    Metric(
        "rapl_average_power",
        ("socket", "socket_rapl", "rapl"),
        "W",
        _F,
        "sum",
        "RAPL energy_uj, rate: a package zone at its socket, its sub-zones (dram, core) below it, a zone of no "
        "package (psys) at the node",
        "rapl",
    ),
    Metric("ib_recv", _IB, "bytes", _I, "sum", "port_rcv_data x 4", "ibstat"),
    Metric("ib_xmit", _IB, "bytes", _I, "sum", "port_xmit_data x 4", "ibstat"),
    Metric("ib_recv_pkts", _IB, "packets", _I, "sum", "port_rcv_packets", "ibstat"),
    Metric("ib_xmit_pkts", _IB, "packets", _I, "sum", "port_xmit_packets", "ibstat"),
    Metric("ib_recv_bw", _IB, "bytes/s", _F, "sum", "rate of ib_recv", "ibstat"),
    Metric("ib_xmit_bw", _IB, "bytes/s", _F, "sum", "rate of ib_xmit", "ibstat"),
    Metric("ib_recv_pkts_bw", _IB, "packets/s", _F, "sum", "rate of ib_recv_pkts", "ibstat"),
    Metric("ib_xmit_pkts_bw", _IB, "packets/s", _F, "sum", "rate of ib_xmit_pkts", "ibstat"),
    Metric("lustre_read_bytes", _FS, "bytes", _I, "sum", "llite stats read_bytes sum", "lustrestat"),
    Metric("lustre_write_bytes", _FS, "bytes", _I, "sum", "llite stats write_bytes sum", "lustrestat"),
    Metric("lustre_read_requests", _FS, "requests", _I, "sum", "llite stats read_bytes count", "lustrestat"),
    Metric(
        "lustre_write_requests", _FS, "requests", _I, "sum", "llite stats write_bytes count", "lustrestat"
    ),
    *(
        Metric(f"lustre_{op}", _FS, "count", _I, "sum", f"llite stats {op} count", "lustrestat")
        for op in LUSTRE_OPS
    ),
    Metric("lustre_read_bw", _FS, "bytes/s", _F, "sum", "rate of lustre_read_bytes", "lustrestat"),
    Metric("lustre_write_bw", _FS, "bytes/s", _F, "sum", "rate of lustre_write_bytes", "lustrestat"),
    Metric("lustre_read_requests_rate", _FS, "requests/s", _F, "sum", "rate of read requests", "lustrestat"),
    Metric(
        "lustre_write_requests_rate", _FS, "requests/s", _F, "sum", "rate of write requests", "lustrestat"
    ),
    Metric("nv_fb_mem_total", _GPU, "MiB", _F, "sum", "NVML memory total (KiB / 1024)", "nvidia"),
    Metric("nv_energy_abs", _GPU, "J", _I, "sum", "NVML total energy since driver load", "nvidia"),
    Metric("nv_compute_processes", _GPU, "count", _I, "sum", "NVML compute processes", "nvidia"),
    Metric("nv_graphics_processes", _GPU, "count", _I, "sum", "NVML graphics processes", "nvidia"),
    Metric("hpcbus_collect_seconds", _N, "s", _F, "max", "wall time of this sample's reading (self)", ""),
    Metric("hpcbus_processes", _N, "count", _I, "sum", "processes read, kernel threads excluded (self)", ""),
    Metric("hpcbus_outbox_messages", _N, "count", _I, "sum", "messages not yet acknowledged (self)", ""),
    Metric(
        "hpcbus_outbox_dropped", _N, "count", _I, "sum", "messages dropped by a full backlog since start", ""
    ),
)
"""Everything `producers.node.cc_lines` can write; zeros are written (docs/mapping.md section 10)."""
