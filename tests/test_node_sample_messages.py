"""The node agent publishes `Pipeline.sample_messages` (the Sonar metric lines written as text), which must be
byte for byte `messages(*sample_lines(...))`, the `Line` path every other node test checks: same subjects
in the same order, same cuts, same ids. Held on every fixture tree and on this machine's own /proc, over
two readings (rates, job starts and ends), for each switch that changes what a sample holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.schemas.message import Message
from tests.node_fixtures import FIX
from tests.test_node_producer import CLUSTER

CASES = sorted(p.name for p in FIX.iterdir() if p.is_dir())
CONFIGS = {
    "default": AgentConfig(),
    "no-cc-lines": AgentConfig(cc_lines=False),
    "cc-job-events+sonar": AgentConfig(cc_job_events=True, sonar_subjects=True),
}


def _both(
    collector: NodeCollector, config: AgentConfig, times: list[float | None], max_bytes: int, prefix: str
) -> tuple[list[Message], list[Message]]:
    reference = Pipeline(CLUSTER, "c1-10", config, prefix=prefix)
    fast = Pipeline(CLUSTER, "c1-10", config, prefix=prefix)
    want: list[Message] = []
    got: list[Message] = []
    for t in times:
        s = collector.collect() if t is None else collector.collect(now=t)
        lines, sonar = reference.sample_lines(s, queued=5, dropped=1)
        want += reference.messages(lines, max_bytes, sonar=("sample", sonar) if sonar else None)
        got += fast.sample_messages(s, max_bytes, queued=5, dropped=1)
    return want, got


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("case", CASES)
def test_fixture_trees(tmp_path: Path, case: str, config: str) -> None:
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    collector = NodeCollector(
        NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0), job_events="all")
    )
    now = collector.collect().time
    want, got = _both(collector, CONFIGS[config], [now + 30.0, now + 60.0], 1 << 20, "")
    assert len(want) >= 2
    assert got == want


@pytest.mark.parametrize("max_bytes", [1 << 20, 3000])
def test_this_machine_with_a_prefix_and_cuts(max_bytes: int) -> None:
    collector = NodeCollector(NodeCollectorConfig(gpus=False, jobs=JobOptions(min_uid=0), job_events="all"))
    collector.collect()
    want, got = _both(collector, AgentConfig(sonar_subjects=True), [None, None], max_bytes, "cc")
    assert [m.subject for m in got] == [m.subject for m in want]
    assert got == want
    metrics = [m for m in got if m.subject == f"cc.{CLUSTER}.metrics"]
    assert metrics and all(m.payload.endswith(b"\n") for m in metrics)
    if max_bytes == 3000:
        assert len(metrics) > 2 and all(len(m.payload) <= 3000 for m in metrics)
