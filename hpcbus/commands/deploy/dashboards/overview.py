"""Cluster overview: nodes reporting, load, memory, GPUs, running jobs, and the pipeline's own health."""

from __future__ import annotations

from typing import Any

from hpcbus.commands.deploy.dashboards.influxql import Measures
from hpcbus.commands.deploy.dashboards.panels import (
    IN_CLUSTER,
    NODE,
    Panel,
    cluster_variable,
    count_series,
    dashboard,
    graph,
    rp_variable,
    single,
)


def overview(raw_rp: str, m: Measures) -> dict[str, Any]:
    s = m.series
    per_node = [IN_CLUSTER]
    reporting = count_series(m, "mem_used", ["hostname"], "nodes", "last")
    gpus = count_series(m, "acc_utilization", ["hostname", "type-id"], "gpus", "last")
    running = count_series(m, "job_processes", ["stype-id"], "jobs", "max")
    rate = 'non_negative_derivative(max("value"), 1s)'
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Cluster",
            [
                single("Nodes reporting", "none", reporting),
                single("Jobs with processes", "none", running),
                single("GPUs reporting", "none", gpus),
                single("Mean GPU utilisation", "percent", s("acc_utilization", [IN_CLUSTER], [])),
                graph("Nodes reporting", "none", reporting, width=8),
                graph("Jobs with processes", "none", running, width=8),
                graph("Mean load", "none", s("cpu_load", per_node, []), width=8),
            ],
        ),
        (
            "Nodes",
            [
                graph(
                    "Load (1 min) per node",
                    "none",
                    s("cpu_load", per_node, ["hostname"]),
                    legend="$tag_hostname",
                ),
                graph(
                    "CPU used per node (% of one hwthread, summed)",
                    "percent",
                    s("cpu_used", [*per_node, NODE], ["hostname"]),
                    legend="$tag_hostname",
                ),
                graph(
                    "Memory used per node",
                    "kbytes",
                    s("mem_used", per_node, ["hostname"]),
                    legend="$tag_hostname",
                ),
                graph(
                    "GPU utilisation per card",
                    "percent",
                    s("acc_utilization", per_node, ["hostname", "type-id"]),
                    legend="$tag_hostname $tag_type-id",
                ),
            ],
        ),
        (
            "Ingest health (hpcbus_* self-telemetry)",
            [
                graph(
                    "Node producer backlog (unacknowledged messages)",
                    "none",
                    s("hpcbus_outbox_messages", per_node, ["hostname"], 'max("value")'),
                    width=8,
                    legend="$tag_hostname",
                ),
                graph(
                    "Node producer messages dropped (since start)",
                    "none",
                    s("hpcbus_outbox_dropped", per_node, ["hostname"], 'max("value")'),
                    width=8,
                    legend="$tag_hostname",
                ),
                graph(
                    "Node sample collection time",
                    "s",
                    s("hpcbus_collect_seconds", per_node, ["hostname"], 'max("value")'),
                    width=8,
                    legend="$tag_hostname",
                ),
                graph(
                    "Worker messages delivered per second",
                    "none",
                    s("hpcbus_delivered", per_node, ["hostname", "stype-id"], rate),
                    width=8,
                    legend="$tag_stype-id@$tag_hostname",
                ),
                graph(
                    "Worker messages received per second",
                    "none",
                    s("hpcbus_received", per_node, ["hostname", "stype-id"], rate),
                    width=8,
                    legend="$tag_stype-id@$tag_hostname",
                ),
                graph(
                    "Worker problems (since start)",
                    "none",
                    s(
                        "hpcbus_rejected",
                        per_node,
                        ["hostname", "stype-id"],
                        'max("value")',
                        name="rejected",
                    ),
                    s(
                        "hpcbus_deadlettered",
                        per_node,
                        ["hostname", "stype-id"],
                        'max("value")',
                        name="dead-lettered",
                    ),
                    s(
                        "hpcbus_pending",
                        per_node,
                        ["hostname", "stype-id"],
                        'max("value")',
                        name="pending",
                    ),
                    width=8,
                    legend="$col $tag_stype-id@$tag_hostname",
                ),
            ],
        ),
    ]
    return dashboard(
        "hpcbus-overview",
        "hpcbus / Cluster overview",
        "Nodes reporting, load, memory, GPUs, running jobs and the health of the hpcbus pipeline.",
        [rp_variable(raw_rp), cluster_variable(m)],
        rows,
    )
