"""Node detail: every metric family the node producer writes, per hwthread, GPU, disk, interface, port and file system."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grafana_foundation_sdk.builders import timeseries

from hpcbus.commands.deploy.dashboards.influxql import Measures
from hpcbus.commands.deploy.dashboards.panels import (
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
from hpcbus.commands.deploy.dashboards.units import unit_of
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
FROM_REGISTRY = None
"""A panel's unit: the registry's unit of its measurements (`units.unit_of`); rates and panels that mix
counts of several kinds name theirs."""
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
        unit: str | None,
        names: Iterable[str],
        by: list[str],
        extra: list[str] | None = None,
        agg: str = 'mean("value")',
        width: int = 12,
    ) -> timeseries.Panel:
        """A time series panel of `names`; `unit` None (`FROM_REGISTRY`): the registry's, as `unit_of`."""
        names = list(names)
        legend = "$col " + " ".join(f"$tag_{t}" for t in by)
        unit = unit_of(names) if unit is None else unit
        return graph(title, unit, *fam(names, by, extra or [], agg), width=width, legend=legend)

    rate = 'non_negative_derivative(max("value"), 1s)'
    host = ["hostname"]
    disk = ["hostname", "stype-id"]
    card = ["hostname", "type-id"]
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Load and CPU",
            [
                panel("Load", FROM_REGISTRY, ["cpu_load", "load_five", "load_fifteen"], host),
                panel("Processes (runnable, existing)", FROM_REGISTRY, ["proc_run", "proc_total"], host),
                panel(
                    "CPU (% of one hwthread, summed over the node)",
                    FROM_REGISTRY,
                    [f"cpu_{f}" for f in DEFAULT_CPU_FIELDS],
                    host,
                    [NODE],
                ),
                panel(
                    "CPU used per hwthread", FROM_REGISTRY, ["cpu_used"], ["hostname", "type-id"], [HWTHREAD]
                ),
                panel(
                    "CPU busy seconds per second, per hwthread (cpu_time)",
                    "none",
                    ["cpu_time"],
                    ["hostname", "type-id"],
                    [HWTHREAD],
                    rate,
                ),
                panel("Clock per hwthread", FROM_REGISTRY, ["cpufreq"], ["hostname", "type-id"], [HWTHREAD]),
            ],
        ),
        (
            "Memory",
            [
                panel("Memory", FROM_REGISTRY, MEMORY, host),
                panel("Swap", FROM_REGISTRY, ["swap_total", "swap_free"], host, width=6),
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
                panel("Disk throughput", FROM_REGISTRY, ["io_read_bw", "io_write_bw"], disk, width=8),
                panel(
                    "Disk requests per second",
                    FROM_REGISTRY,
                    ["io_reads_rate", "io_writes_rate"],
                    disk,
                    width=8,
                ),
                panel("Disk utilisation (iostat %util)", FROM_REGISTRY, ["io_util"], disk, width=8),
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
                    "Network bytes per second",
                    FROM_REGISTRY,
                    ["net_bytes_in_bw", "net_bytes_out_bw"],
                    disk,
                    width=8,
                ),
                panel(
                    "Network packets per second",
                    FROM_REGISTRY,
                    ["net_pkts_in_bw", "net_pkts_out_bw"],
                    disk,
                    width=8,
                ),
                panel(
                    "Network counters",
                    "short",
                    ["net_bytes_in", "net_bytes_out", "net_pkts_in", "net_pkts_out"],
                    disk,
                    agg='max("value")',
                    width=8,
                ),
                panel(
                    "InfiniBand bytes per second", FROM_REGISTRY, ["ib_recv_bw", "ib_xmit_bw"], disk, width=8
                ),
                panel(
                    "InfiniBand packets per second",
                    FROM_REGISTRY,
                    ["ib_recv_pkts_bw", "ib_xmit_pkts_bw"],
                    disk,
                    width=8,
                ),
                panel(
                    "InfiniBand counters",
                    FROM_REGISTRY,
                    ["ib_recv", "ib_xmit", "ib_recv_pkts", "ib_xmit_pkts"],
                    disk,
                    agg='max("value")',
                    width=8,
                ),
                panel(
                    "Lustre throughput", FROM_REGISTRY, ["lustre_read_bw", "lustre_write_bw"], disk, width=8
                ),
                panel(
                    "Lustre requests per second",
                    FROM_REGISTRY,
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
                    FROM_REGISTRY,
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
                    "GPU utilisation",
                    FROM_REGISTRY,
                    ["acc_utilization", "acc_mem_util"],
                    card,
                    [GPU],
                    width=8,
                ),
                panel("GPU memory used", FROM_REGISTRY, ["acc_mem_used"], card, [GPU], width=8),
                panel(
                    "GPU power and its limit",
                    FROM_REGISTRY,
                    ["acc_power", "acc_power_limit"],
                    card,
                    [GPU],
                    width=8,
                ),
                panel("GPU temperature", FROM_REGISTRY, ["acc_temp"], card, [GPU], width=8),
                panel("GPU fan", FROM_REGISTRY, ["acc_fan"], card, [GPU], width=8),
                panel(
                    "GPU clocks (SM, memory)",
                    FROM_REGISTRY,
                    ["acc_clock", "acc_mem_clock"],
                    card,
                    [GPU],
                    width=8,
                ),
                panel(
                    "GPU performance state and failure code",
                    FROM_REGISTRY,
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
                panel(
                    "Processes per job", FROM_REGISTRY, ["job_processes"], ["hostname", "stype-id"], width=8
                ),
                panel(
                    "CPU per job (% of a core)",
                    FROM_REGISTRY,
                    ["process_cpu_util"],
                    ["hostname", "stype-id"],
                    width=8,
                ),
                panel(
                    "Resident memory per job",
                    FROM_REGISTRY,
                    ["process_rss"],
                    ["hostname", "stype-id"],
                    width=8,
                ),
            ],
        ),
        (
            "hpcbus node producer",
            [
                panel(
                    "Collection time",
                    FROM_REGISTRY,
                    ["hpcbus_collect_seconds"],
                    host,
                    agg='max("value")',
                    width=8,
                ),
                panel("Processes read", FROM_REGISTRY, ["hpcbus_processes"], host, width=8),
                panel(
                    "Outbox (backlog, dropped)",
                    FROM_REGISTRY,
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
