"""The four Grafana dashboards, built with grafana-foundation-sdk (typed panels, variables and layout).

Names are the ones the pipeline writes (docs/mapping.md sections 3, 4 and 10; `job_summary` of issue 11),
and only those a test could see written by the real pipeline: the node producer on a real host and on the
`hpc` fixture tree (RAPL, InfiniBand, Lustre), a real Sonar GPU sample translated onto the bus, `consume
influx` with its default `processes = "aggregate"` (process series folded per job, `stype-id` = the job
key), and `job_summary` points. Names the test pipeline cannot produce (NVML-only `nv_*` extras, rarely
non-zero per-process counters, optional `cpu_*` fields) are left out rather than shown untested.

Every query reads `"$rp"."<measurement>"`: the `rp` variable switches between raw data and the 5-minute
means `hpcbus deploy influx-retention` keeps for a year (the means keep the field name `value`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcbus.commands.deploy.dashboards.influxql import Measures
from hpcbus.commands.deploy.dashboards.job import job_detail
from hpcbus.commands.deploy.dashboards.node import node_detail
from hpcbus.commands.deploy.dashboards.overview import overview
from hpcbus.commands.deploy.dashboards.panels import DOWNSAMPLED_RP
from hpcbus.commands.deploy.dashboards.users import user_view

BOARDS: dict[str, Callable[[str, Measures], dict[str, Any]]] = {
    "cluster-overview.json": overview,
    "node-detail.json": node_detail,
    "job-detail.json": job_detail,
    "users-accounts.json": user_view,
}
"""File name under `dashboards/` -> builder."""


def dashboards(raw_rp: str = "autogen") -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Every dashboard (file name -> JSON data) and the measurements their queries read."""
    m = Measures()
    return {name: build(raw_rp, m) for name, build in BOARDS.items()}, m.names


def measurements() -> set[str]:
    """The measurements the dashboards read: what the retention command downsamples."""
    return dashboards()[1]


__all__ = ["DOWNSAMPLED_RP", "dashboards", "measurements"]
