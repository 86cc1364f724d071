"""The shortcuts of the text path (a `%` template per pattern of zeros, tag templates per job and for the
hwthreads) give the bytes of the `Line` path for values and tags they must not take: wrong types, values past
int64, NaN, `%` in tag values, every shape of pid/cmd/ppid."""

from __future__ import annotations

import msgspec
import pytest

from bench.translate import node_envelope
from hpcbus.schemas.lineprotocol.format import FormatError
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.translate import batch, envelope_payloads, envelope_to_lines, route


def _both(env: SampleEnvelope) -> tuple[dict[str, list[bytes]], dict[str, list[bytes]]]:
    want = {s: list(batch(g)) for s, g in route(envelope_to_lines(env)).items()}
    return envelope_payloads(env), want


def _with(**changes: object) -> SampleEnvelope:
    """The bench node with process `i` of job 0 changed by `changes["p<i>"]` (a dict of fields)."""
    env = node_envelope(2)
    assert env.data is not None
    job = env.data.attributes.jobs[0]
    procs = list(job.processes)
    for name, fields in changes.items():
        i = int(name[1:])
        procs[i] = msgspec.structs.replace(procs[i], **fields)  # type: ignore[arg-type]
    env.data.attributes.jobs[0] = msgspec.structs.replace(job, processes=procs, user="50% a,b")
    return env


@pytest.mark.parametrize(
    "changes",
    [
        {"p0": {"cpu_avg": 7}, "p1": {"num_threads": True}, "p2": {"data_read": 2**63}},
        {"p0": {"cpu_util": 1e300 * 10}, "p1": {"cpu_avg": 1e-310}, "p2": {"resident_memory": -(2**63)}},
        {"p0": {"ppid": 0}, "p1": {"pid": 0, "ppid": 0}, "p2": {"cmd": ""}, "p3": {"cmd": "%s %d,x=y"}},
        {"p0": {"rolledup": 2.5}, "p1": {"cmd": "a\\b\nc"}, "p2": {"data_cancelled": 3, "cpu_time": 0}},
    ],
)
def test_odd_processes_match_the_line_path(changes: dict[str, dict[str, object]]) -> None:
    ours, want = _both(_with(**changes))
    assert ours == want


def test_nan_is_refused_by_both_paths() -> None:
    env = _with(p4={"cpu_util": float("nan")})
    with pytest.raises(FormatError):
        envelope_payloads(env)
    with pytest.raises(FormatError):
        list(batch(envelope_to_lines(env)))


@pytest.mark.parametrize("cpus", [[1, 2.5, 3], [0, 2**63, 1], [True, 0, 5], [7, -3, 0]])
def test_odd_hwthreads_and_disks_match_the_line_path(cpus: list[object]) -> None:
    env = node_envelope(1)
    assert env.data is not None
    system = env.data.attributes.system
    disk = msgspec.structs.replace(system.disks[0], stats=cpus)
    env.data.attributes.system = msgspec.structs.replace(
        system,
        cpus=cpus,
        disks=[disk, *system.disks[1:]],
    )
    ours, want = _both(env)
    assert ours == want
