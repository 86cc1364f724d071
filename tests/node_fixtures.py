"""The node agent's fixture trees (tests/fixtures/node/<case>: the /proc and /sys files of real machines,
see its PROVENANCE.md) and a writable copy of one for a test to change."""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline

FIX = Path(__file__).parent / "fixtures" / "node"


def tree(tmp_path: Path, case: str = "hpc") -> Path:
    """A copy of fixture `case` under `tmp_path`, as the collector's root."""
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    return root


def agent_messages(tmp_path: Path, case: str) -> list[tuple[str, bytes]]:
    """(subject, payload) of all `produce node` publishes for fixture `case` but its Sonar JSON (two readings
    30 s apart: node, hwthread and device metrics, jobs and their processes, job events, its own telemetry):
    the line-protocol messages a `consume influx` worker gets from a node."""
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    collector = NodeCollector(
        NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0), job_events="all")
    )
    now = collector.collect().time
    pipeline = Pipeline("lab", "c1-10", AgentConfig(cc_job_events=True))
    out = []
    for t in (now + 30.0, now + 60.0):
        for m in pipeline.sample_messages(collector.collect(now=t), 1 << 20, queued=5, dropped=1):
            if ".sonar" not in m.subject:  # JSON, not for this sink
                out.append((m.subject, m.payload))
    return out
