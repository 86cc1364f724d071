"""A job summary as `consume jobs` makes one (`schemas.jobsummary.Summary`), for tests that need the event
or the point without running the jobs worker: the gateway's refusals, `consume influx`'s derived point."""

from __future__ import annotations

from typing import Any

from hpcbus.schemas.jobsummary import DEFAULT_THRESHOLDS, NodeSummary, Summary


def a_summary(cluster: str, job: str = "4242", end: int = 1_764_000_100, **fields: Any) -> Summary:
    """A finished Slurm job of two nodes on `cluster`, ended at `end`; `fields` replace any of its values."""
    values: dict[str, Any] = {
        "cluster": cluster,
        "job": job,
        "scheduler": "slurm",
        "user": "alice",
        "account": "proj",
        "partition": "gpu",
        "state": "completed",
        "start": end - 100,
        "end": end,
        "elapsed": 100.0,
        "nodes": 2,
        "cores": 4,
        "samples": 20,
        "cpu_seconds": 91.0,
        "cpu_eff": 22.75,
        "mem_peak": 12 * 2**20,
        "mem_avg": 7864320.0,
        "mem_requested": 2**30,
        "mem_eff": 1.172,
        "flags": ["mem_overrequested", "cpu_underused"],
        "closed": "end",
        "thresholds": DEFAULT_THRESHOLDS,
        "per_node": [NodeSummary(hostname="n1", samples=10), NodeSummary(hostname="n2", samples=10)],
        "per_gpu": [],
        **fields,
    }
    return Summary(**values)
