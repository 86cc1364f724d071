"""Node detail: every metric family the node producer writes, per hwthread, GPU, disk, interface, port and file system."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grafana_foundation_sdk.builders import timeseries

from hpcbus.commands.dashboards.influxql import Measures
from hpcbus.commands.dashboards.panels import (
    GPU,
    HWTHREAD,
    IN_CLUSTER,
    NODE,
    ON_HOST,
    Panel,
    cluster_variable,
    dashboard,
    graph,
    host_variable,
    rp_variable,
)
from hpcbus.schemas.metrics import SONAR
from hpcbus.schemas.metrics.node import DEFAULT_CPU_FIELDS, LUSTRE_OPS

MEMORY = [
    "mem_total",
    "mem_used",
    "mem_free",
    "mem_available",
    "mem_buffers",
    "mem_cached",
    "mem_shared",
    "mem_slab",
    "mem_sreclaimable",
    "mem_anon_pages",
    "mem_mapped",
    "mem_dirty",
    "mem_writeback",
]
DISKSTATS = [m.name for m in SONAR if m.level == "disk"]
"""/proc/diskstats columns as the registry names them (the open-ended `diskstat_<k+1>` of newer kernels is
not in the registry and not shown)."""


def node_detail(raw_rp: str, m: Measures) -> dict[str, Any]:
    where = [IN_CLUSTER, ON_HOST]

    def fam(
        measurements: Iterable[str], by: list[str], extra: list[str], agg: str = 'mean("value")'
    ) -> list[str]:
        return [m.series(name, [*where, *extra], by, agg, name=name) for name in measurements]

    def panel(
        title: str,
        unit: str,
        names: Iterable[str],
        by: list[str],
        extra: list[str] | None = None,
        agg: str = 'mean("value")',
        width: int = 12,
    ) -> timeseries.Panel:
        legend = "$col " + " ".join(f"$tag_{t}" for t in by)
        return graph(title, unit, *fam(names, by, extra or [], agg), width=width, legend=legend)

    rate = 'non_negative_derivative(max("value"), 1s)'
    host = ["hostname"]
    disk = ["hostname", "stype-id"]
    card = ["hostname", "type-id"]
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Load and CPU",
            [
                panel("Load", "none", ["cpu_load", "load_five", "load_fifteen"], host),
                panel("Processes (runnable, existing)", "none", ["proc_run", "proc_total"], host),
                panel(
                    "CPU (% of one hwthread, summed over the node)",
                    "percent",
                    [f"cpu_{f}" for f in DEFAULT_CPU_FIELDS],
                    host,
                    [NODE],
                ),
                panel("CPU used per hwthread", "percent", ["cpu_used"], ["hostname", "type-id"], [HWTHREAD]),
                panel(
                    "CPU busy seconds per second, per hwthread (cpu_time)",
                    "none",
                    ["cpu_time"],
                    ["hostname", "type-id"],
                    [HWTHREAD],
                    rate,
                ),
                panel("Clock per hwthread", "rotmhz", ["cpufreq"], ["hostname", "type-id"], [HWTHREAD]),
            ],
        ),
        (
            "Memory",
            [
                panel(
                    "Memory",
                    "kbytes",
                    MEMORY,
                    host,
                ),
                panel("Swap", "kbytes", ["swap_total", "swap_free"], host, width=6),
                panel(
                    "Huge pages (count; size in KiB)",
                    "none",
                    ["mem_hugepages_total", "mem_hugepages_free", "mem_hugepages_size"],
                    host,
                    width=6,
                ),
            ],
        ),
        (
            "Disks",
            [
                panel("Disk throughput", "Bps", ["io_read_bw", "io_write_bw"], disk, width=8),
                panel(
                    "Disk requests per second", "reqps", ["io_reads_rate", "io_writes_rate"], disk, width=8
                ),
                panel("Disk utilisation (iostat %util)", "percent", ["io_util"], disk, width=8),
                panel(
                    "Disk counters per second (/proc/diskstats)",
                    "none",
                    DISKSTATS,
                    disk,
                    agg=rate,
                    width=24,
                ),
            ],
        ),
        (
            "Network, InfiniBand, Lustre",
            [
                panel(
                    "Network bytes per second", "Bps", ["net_bytes_in_bw", "net_bytes_out_bw"], disk, width=8
                ),
                panel(
                    "Network packets per second", "pps", ["net_pkts_in_bw", "net_pkts_out_bw"], disk, width=8
                ),
                panel(
                    "Network counters",
                    "short",
                    ["net_bytes_in", "net_bytes_out", "net_pkts_in", "net_pkts_out"],
                    disk,
                    agg='max("value")',
                    width=8,
                ),
                panel("InfiniBand bytes per second", "Bps", ["ib_recv_bw", "ib_xmit_bw"], disk, width=8),
                panel(
                    "InfiniBand packets per second",
                    "pps",
                    ["ib_recv_pkts_bw", "ib_xmit_pkts_bw"],
                    disk,
                    width=8,
                ),
                panel(
                    "InfiniBand counters",
                    "none",
                    ["ib_recv", "ib_xmit", "ib_recv_pkts", "ib_xmit_pkts"],
                    disk,
                    agg='max("value")',
                    width=8,
                ),
                panel("Lustre throughput", "Bps", ["lustre_read_bw", "lustre_write_bw"], disk, width=8),
                panel(
                    "Lustre requests per second",
                    "reqps",
                    ["lustre_read_requests_rate", "lustre_write_requests_rate"],
                    disk,
                    width=8,
                ),
                panel(
                    "Lustre metadata operations per second",
                    "ops",
                    [
                        *(f"lustre_{op}" for op in LUSTRE_OPS),
                        "lustre_read_requests",
                        "lustre_write_requests",
                        "lustre_read_bytes",
                        "lustre_write_bytes",
                    ],
                    disk,
                    agg=rate,
                    width=8,
                ),
            ],
        ),
        (
            "Energy",
            [
                panel(
                    "RAPL power per package and zone",
                    "watt",
                    ["rapl_average_power"],
                    ["hostname", "type", "type-id", "stype-id"],
                    width=24,
                )
            ],
        ),
        (
            "GPUs",
            [
                panel(
                    "GPU utilisation", "percent", ["acc_utilization", "acc_mem_util"], card, [GPU], width=8
                ),
                panel("GPU memory used", "mbytes", ["acc_mem_used"], card, [GPU], width=8),
                panel(
                    "GPU power and its limit", "watt", ["acc_power", "acc_power_limit"], card, [GPU], width=8
                ),
                panel("GPU temperature", "celsius", ["acc_temp"], card, [GPU], width=8),
                panel("GPU fan", "percent", ["acc_fan"], card, [GPU], width=8),
                panel(
                    "GPU clocks (SM, memory)", "rotmhz", ["acc_clock", "acc_mem_clock"], card, [GPU], width=8
                ),
                panel(
                    "GPU performance state and failure code",
                    "none",
                    ["acc_pstate", "acc_failing"],
                    card,
                    [GPU],
                    agg='max("value")',
                    width=8,
                ),
            ],
        ),
        (
            "Jobs on the node",
            [
                panel("Processes per job", "none", ["job_processes"], ["hostname", "stype-id"], width=8),
                panel(
                    "CPU per job (% of a core)",
                    "percent",
                    ["process_cpu_util"],
                    ["hostname", "stype-id"],
                    width=8,
                ),
                panel(
                    "Resident memory per job", "kbytes", ["process_rss"], ["hostname", "stype-id"], width=8
                ),
            ],
        ),
        (
            "hpcbus node producer",
            [
                panel("Collection time", "s", ["hpcbus_collect_seconds"], host, agg='max("value")', width=8),
                panel("Processes read", "none", ["hpcbus_processes"], host, width=8),
                panel(
                    "Outbox (backlog, dropped)",
                    "none",
                    ["hpcbus_outbox_messages", "hpcbus_outbox_dropped"],
                    host,
                    agg='max("value")',
                    width=8,
                ),
            ],
        ),
    ]
    return dashboard(
        "hpcbus-node",
        "hpcbus / Node detail",
        "Every metric family the node producer writes, per hwthread, GPU, disk, interface, HCA port and file system.",
        [rp_variable(raw_rp), cluster_variable(m), host_variable(m)],
        rows,
    )
