"""Issue 10: envelopes with every optional field left out are valid, and translate without a crash or an
invented value: at the caller's `cluster` and `now` where they say neither, and a sample that names no node
(or time, or cluster) travels as its skeleton event alone, with a warning instead of metric lines."""

from __future__ import annotations

import types
from typing import Any

import pytest
from nats.aio.msg import Msg

from hpcbus.consumers.sonar.to_lp import ToLpSink
from hpcbus.schemas.lineprotocol import format_lines, parse_payload
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import decode_envelope, validate_envelope
from hpcbus.schemas.translate import LpToSonar, envelope_to_lines

NOW = 1_760_000_000
SPARSE = {
    "sample": b'{"data":{"type":"sample"}}',
    "sysinfo": b'{"data":{"type":"sysinfo"}}',
    "job": b'{"data":{"type":"job","attributes":{"slurm_jobs":[{"job_id":5,"job_state":"RUNNING"}]}}}',
    "cluster": b'{"data":{"type":"cluster","attributes":{"nodes":[{"names":["c[1-2]"]}]}}}',
}


def _round_trip(env: Any, **kw: Any) -> tuple[list[Any], list[Problem]]:
    problems: list[Problem] = []
    lines = envelope_to_lines(env, now=NOW, problems=problems, **kw)
    parsed = parse_payload(format_lines(lines), now=NOW)
    assert [p for p in parsed.problems if p.severity == "error"] == []
    back = LpToSonar()
    unmade: list[Problem] = []
    out = back.add_lines(parsed.lines, now=0, problems=unmade) + back.flush_all()
    assert [a.envelope for a in out] == [env] and unmade == []  # back unchanged: nothing was filled in
    return lines, problems


@pytest.mark.parametrize("kind", SPARSE)
def test_sparse_envelope_is_valid_and_translates(kind: str) -> None:
    env = decode_envelope(SPARSE[kind], expect=kind)
    assert validate_envelope(env) == []
    lines, problems = _round_trip(env, cluster="fox")
    assert lines and all(line.time == NOW for line in lines)  # no time: when it was received
    assert all(line.tags.get("cluster") == "fox" for line in lines)  # no cluster: the caller's
    assert all("hostname" not in line.tags for line in lines)  # no node: no hostname made up
    assert all(p.severity == "warning" for p in problems)


def test_sample_without_node_is_its_skeleton_alone_with_a_warning() -> None:
    raw = b'{"meta":{"producer":"sonar","version":"0.19.0"},"data":{"type":"sample","attributes":{"time":"2025-03-01T00:00:01+01:00","cluster":"fox","system":{"used_memory":5}}}}'
    env = decode_envelope(raw)
    lines, problems = _round_trip(env)
    assert [(line.measurement, line.tags["function"]) for line in lines] == [("sample", "skeleton")]
    assert lines[0].time == 1740783601 and lines[0].tags["cluster"] == "fox"
    assert [(p.path, p.severity) for p in problems] == [("data.attributes.node", "warning")]
    assert "sample without node: no metric lines" in problems[0].reason


def test_jobs_without_any_cluster_get_no_cc_backend_events() -> None:
    env = decode_envelope(
        SPARSE["job"].replace(b'"job_state"', b'"start_time":"2025-03-01T00:00:01Z","job_state"')
    )
    lines, problems = _round_trip(env)  # neither the envelope nor the caller names a cluster
    assert [line.measurement for line in lines] == ["slurm"] and "cluster" not in lines[0].tags
    assert [p.path for p in problems] == ["data.attributes.cluster"]
    with_cluster, _ = _round_trip(env, cluster="fox")
    assert [line.measurement for line in with_cluster] == ["slurm"]  # no user_name/nodes: no start_job


def test_the_consumer_reports_the_warning_and_still_publishes_the_skeleton() -> None:
    outlet = types.SimpleNamespace(cluster="fox", prefix="", message_limit=lambda: 1 << 20)
    sink = ToLpSink(outlet, "test", None)  # type: ignore[arg-type]
    assert sink.take(Msg(None, "fox.sonar.sample", "", SPARSE["sample"])) == 1  # type: ignore[arg-type]
    [out] = sink.cut().outs  # no BadInput was raised: nothing for the runner to dead-letter
    assert [n for _, _, n in out.payloads] == [1]
    assert [(p.place, p.path, p.severity) for p in out.warnings] == [
        ("fox.sonar.sample", "data.attributes.time", "warning")
    ]
