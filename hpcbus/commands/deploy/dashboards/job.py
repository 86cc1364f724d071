"""Job detail: one job's (or a few jobs') series per node and per GPU card, its summary and flags."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcbus.commands.deploy.dashboards.influxql import Measures, match
from hpcbus.commands.deploy.dashboards.panels import (
    IN_CLUSTER,
    OF_JOB,
    Panel,
    cluster_variable,
    dashboard,
    graph,
    grid,
    rp_variable,
    tag_variable,
)

SUMMARY_COLUMNS = (
    "state", "nodes", "cores", "gpus", "elapsed", "cpu_eff", "mem_peak", "mem_requested", "mem_eff", "gpu_util", "gpu_mem_peak", "read_bytes", "write_bytes", "coverage", "samples",
)  # fmt: skip
FLAG_COLUMNS = (
    "flags",
    "flag_idle_gpu",
    "flag_mem_overrequested",
    "flag_cpu_underused",
    "flag_no_samples",
    "flag_stop_missing",
)


def fields(names: Iterable[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def job_detail(raw_rp: str, m: Measures) -> dict[str, Any]:
    where = [IN_CLUSTER, OF_JOB]
    summary = m.src("job_summary")
    by_node = ["hostname", "stype-id"]
    by_card = ["hostname", "type-id", "stype-id"]
    node_legend = "$tag_stype-id@$tag_hostname"
    card_legend = "$tag_stype-id@$tag_hostname $tag_type-id"
    rate = 'non_negative_derivative(max("value"), 1s)'
    s = m.series
    sel = f'WHERE {IN_CLUSTER} AND {match("job", "job")} AND $timeFilter GROUP BY "job", "user", "account", "partition"'
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Summary",
            [
                grid(
                    "Job summary (at job end)",
                    f"SELECT {fields(SUMMARY_COLUMNS)} FROM {summary} {sel}",
                    height=6,
                ),
                grid("Flags", f"SELECT {fields(FLAG_COLUMNS)} FROM {summary} {sel}", height=5),
            ],
        ),
        (
            "Per node",
            [
                graph(
                    "CPU (% of a core, summed over the job's processes)",
                    "percent",
                    s("process_cpu_util", where, by_node),
                    legend=node_legend,
                ),
                graph("Resident memory", "kbytes", s("process_rss", where, by_node), legend=node_legend),
                graph(
                    "Virtual memory", "kbytes", s("process_vmem", where, by_node), width=8, legend=node_legend
                ),
                graph("Processes", "none", s("job_processes", where, by_node), width=8, legend=node_legend),
                graph(
                    "Threads beyond the first, summed",
                    "none",
                    s("process_threads", where, by_node),
                    width=8,
                    legend=node_legend,
                ),
                graph(
                    "CPU seconds per second",
                    "none",
                    s("process_cpu_time", where, by_node, rate),
                    width=8,
                    legend=node_legend,
                ),
                graph(
                    "Read (KiB per second)",
                    "KiBs",
                    s("process_read", where, by_node, rate),
                    width=8,
                    legend=node_legend,
                ),
                graph(
                    "Written (KiB per second)",
                    "KiBs",
                    s("process_written", where, by_node, rate),
                    width=8,
                    legend=node_legend,
                ),
            ],
        ),
        (
            "Per GPU card",
            [
                graph(
                    "GPU utilisation of the job's processes",
                    "percent",
                    s("process_acc_utilization", where, by_card),
                    width=8,
                    legend=card_legend,
                ),
                graph(
                    "GPU memory of the job's processes",
                    "mbytes",
                    s("process_acc_mem_used", where, by_card),
                    width=8,
                    legend=card_legend,
                ),
                graph(
                    "GPU memory utilisation of the job's processes",
                    "percent",
                    s("process_acc_mem_util", where, by_card),
                    width=8,
                    legend=card_legend,
                ),
            ],
        ),
    ]
    job = tag_variable("job", "job", "job_processes", "stype-id", IN_CLUSTER, m).include_all(False)
    return dashboard(
        "hpcbus-job",
        "hpcbus / Job detail",
        "One job (or several): per node and per card series, its summary and flags. Set the time range to cover the job.",
        [rp_variable(raw_rp), cluster_variable(m), job],
        rows,
    )
