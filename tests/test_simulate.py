"""`hpcbus simulate`: the simulated node has the shape it claims, a sample is the same message whenever it
is built, and a bounded run publishes exactly nodes x samples samples and exits 0."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.simulate.shape import SimulatedNode, Template
from tests.consumer_helpers import ROOT, Worker, bus_messages
from tests.services import NatsServer

T = 1_763_900_000.0


def messages(index: int, t: float) -> list[tuple[str, bytes, str]]:
    node = SimulatedNode(Template.from_corpus(), index, f"sim{index:05d}", 30.0)
    pipeline = Pipeline("c", node.hostname, AgentConfig(control=False))
    lines, _ = pipeline.sample_lines(node.sample(t))
    return [(m.subject, m.payload, m.msg_id) for m in pipeline.messages(lines, 1 << 20)]


def test_a_node_has_the_corpus_shape() -> None:
    node = SimulatedNode(Template.from_corpus(), 1, "sim00001", 30.0)
    s = node.sample(T)
    assert s.cpu is not None and len(s.cpu.hwthreads) == 128
    assert len(s.gpus) == 4 and len({g.uuid for g in s.gpus}) == 4
    assert len(s.jobs) == 4 and any(p.gpus for j in s.jobs for p in j.processes)
    assert sum(len(p) for _, p, _ in messages(1, T)) > 100_000  # the size of a real node's sample


def test_a_sample_is_the_same_message_whenever_it_is_built() -> None:
    assert messages(3, T) == messages(3, T)
    assert [i for *_, i in messages(3, T)] != [i for *_, i in messages(4, T)]
    assert [i for *_, i in messages(3, T)] != [i for *_, i in messages(3, T + 30)]


def test_bad_settings_exit_2_naming_the_setting() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "hpcbus", "simulate", "--cluster", "c", "--interval", "0.5"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 2
    assert "interval" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.services
def test_a_bounded_run_publishes_every_sample_and_exits_0(
    nats_server: NatsServer, cluster: str, tmp_path: Path
) -> None:
    args = ["simulate", "--nats", nats_server.url, "--cluster", cluster, "--nodes", "2", "--interval", "1"]
    w = Worker([*args, "--samples", "2", "--hostname-prefix", "s"], tmp_path / "simulate.log")
    w.start(ready=None)
    assert w.wait(120) == 0, w.log()
    skeletons = bus_messages(nats_server.url, cluster, f"{cluster}.events.sample")
    hosts = sorted((m.data or b"").split(b"hostname=")[1].split(b",")[0].decode() for m in skeletons)
    assert hosts == ["s00001", "s00001", "s00002", "s00002"]
    assert "4 samples acknowledged" in w.log()


@pytest.mark.services
def test_sigterm_stops_an_unbounded_run_within_5s(
    nats_server: NatsServer, cluster: str, tmp_path: Path
) -> None:
    args = ["simulate", "--nats", nats_server.url, "--cluster", cluster, "--nodes", "50", "--interval", "1"]
    w = Worker([*args, "--stats-seconds", "1"], tmp_path / "simulate.log")
    w.start(ready="ticks built", timeout=120)  # publishing, with a tick of 50 nodes being built
    started = time.monotonic()
    assert w.terminate(timeout=15) == 0
    assert time.monotonic() - started < 5.0, w.log()
    assert "stopped:" in w.log() and "Traceback" not in w.log()
