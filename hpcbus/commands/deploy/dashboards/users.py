"""Users and accounts: finished jobs and their efficiency, from the `job_summary` points."""

from __future__ import annotations

from typing import Any

from hpcbus.commands.deploy.dashboards.influxql import Measures, match
from hpcbus.commands.deploy.dashboards.panels import (
    IN_CLUSTER,
    Panel,
    cluster_variable,
    dashboard,
    graph,
    grid,
    rp_variable,
    tag_variable,
)


def user_view(raw_rp: str, m: Measures) -> dict[str, Any]:
    summary = m.src("job_summary")
    who = [IN_CLUSTER, match("user", "user"), match("account", "account")]
    cond = " AND ".join([*who, "$timeFilter"])
    per = 'GROUP BY time($__interval), "user" fill(none)'
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Jobs",
            [
                grid(
                    "Finished jobs",
                    f'SELECT "state", "elapsed", "nodes", "cores", "gpus", "cpu_eff", "mem_eff", "gpu_util", "flags" FROM {summary} WHERE {cond} GROUP BY "job", "user", "account", "partition"',
                    height=10,
                ),
                grid(
                    "Per user and account",
                    f'SELECT count("elapsed") AS "jobs", sum("cpu_seconds") / 3600 AS "cpu_hours", mean("cpu_eff") AS "cpu_eff", mean("mem_eff") AS "mem_eff", mean("gpu_util") AS "gpu_util" FROM {summary} WHERE {cond} GROUP BY "user", "account"',
                    width=12,
                ),
                grid(
                    "Flagged jobs per user",
                    f'SELECT count("elapsed") AS "flagged" FROM {summary} WHERE {cond} AND "flags" <> \'\' GROUP BY "user", "account"',
                    width=12,
                ),
            ],
        ),
        (
            "Efficiency over time",
            [
                graph(
                    "Jobs finished",
                    "none",
                    f'SELECT count("elapsed") AS "jobs" FROM {summary} WHERE {cond} {per}',
                    width=8,
                    legend="$tag_user",
                ),
                graph(
                    "CPU efficiency (mean over jobs)",
                    "percent",
                    f'SELECT mean("cpu_eff") AS "cpu_eff" FROM {summary} WHERE {cond} {per}',
                    width=8,
                    legend="$tag_user",
                ),
                graph(
                    "Memory efficiency (peak / requested)",
                    "percent",
                    f'SELECT mean("mem_eff") AS "mem_eff" FROM {summary} WHERE {cond} {per}',
                    width=8,
                    legend="$tag_user",
                ),
                graph(
                    "GPU utilisation (mean over GPU jobs)",
                    "percent",
                    f'SELECT mean("gpu_util") AS "gpu_util" FROM {summary} WHERE {cond} {per}',
                    width=12,
                    legend="$tag_user",
                ),
                graph(
                    "CPU hours",
                    "none",
                    f'SELECT sum("cpu_seconds") / 3600 AS "cpu_hours" FROM {summary} WHERE {cond} {per}',
                    width=12,
                    legend="$tag_user",
                ),
            ],
        ),
    ]
    return dashboard(
        "hpcbus-users",
        "hpcbus / Users and accounts",
        "Finished jobs and their efficiency per user and account, from the job_summary points.",
        [
            rp_variable(raw_rp),
            cluster_variable(m),
            # All = any value or none: a process-group job has no account (tags are absent, never invented).
            tag_variable("user", "user", "job_summary", "user", IN_CLUSTER, m).all_value(".*"),
            tag_variable("account", "account", "job_summary", "account", IN_CLUSTER, m).all_value(".*"),
        ],
        rows,
    )
