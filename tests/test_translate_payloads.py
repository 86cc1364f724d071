"""`envelope_payloads` (text written straight from the sample walk) gives the messages of the reference path
(`route(envelope_to_lines(...))` + `batch`), byte for byte: corpus envelopes of every kind, a busy node,
values and names that need the general formatter, and small message sizes that cut mid-sample."""

from __future__ import annotations

import msgspec
import pytest

from bench.translate import node_envelope
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import SampleEnvelope, SampleProcess
from hpcbus.schemas.translate import batch, envelope_payloads, envelope_to_lines, format_shared, route
from hpcbus.schemas.translate.bus import split_payloads
from tests.test_translate_corpus import SONAR_FILES, _valid


def _reference(env: object, max_bytes: int = 512 * 1024, prefix: str = "") -> dict[str, list[bytes]]:
    lines = envelope_to_lines(env, cluster="fallback", now=1_700_000_000)  # type: ignore[arg-type]
    return {s: list(batch(g, max_bytes)) for s, g in route(lines, "fallback", prefix=prefix).items()}


def _ours(env: object, max_bytes: int = 512 * 1024, prefix: str = "") -> dict[str, list[bytes]]:
    return envelope_payloads(
        env,  # type: ignore[arg-type]
        cluster="fallback",
        now=1_700_000_000,
        max_bytes=max_bytes,
        prefix=prefix,
    )


def test_corpus_envelopes() -> None:
    envelopes = [env for path in SONAR_FILES for _line, env, _raw in _valid(path)]
    assert sum(isinstance(env, SampleEnvelope) for env in envelopes) >= 3 and len(envelopes) >= 10
    for env in envelopes:
        assert _ours(env) == _reference(env)
        assert _ours(env, 700, "cc") == _reference(env, 700, "cc")


def _odd_node() -> SampleEnvelope:
    """The bench node with processes whose values and tags take the general formatter."""
    env = node_envelope(3)
    assert env.data is not None
    job = env.data.attributes.jobs[0]
    odd = [
        msgspec.structs.replace(job.processes[0], cmd="my prog,x=1", cpu_avg=5e-324, num_threads=0),
        msgspec.structs.replace(job.processes[1], cmd="tab\\slash", cpu_util=-0.0, data_read=2**62),
        msgspec.structs.replace(job.processes[2], pid=0, cmd="", resident_memory=2**60 + 1),
    ]
    procs: list[SampleProcess] = odd + job.processes[3:]
    job = msgspec.structs.replace(job, processes=procs, user="a b")
    env.data.attributes.jobs[0] = job
    return env


@pytest.mark.parametrize("max_bytes", [1, 200, 4096, 512 * 1024])
def test_busy_and_odd_nodes(max_bytes: int) -> None:
    for env in (node_envelope(0), _odd_node()):
        assert _ours(env, max_bytes) == _reference(env, max_bytes)


def test_unplaced_sample_warns_like_the_reference() -> None:
    env = node_envelope(1)
    assert env.data is not None
    env.data.attributes.node = ""
    ours: list[Problem] = []
    reference: list[Problem] = []
    got = envelope_payloads(env, problems=ours)
    want = {s: list(batch(g)) for s, g in route(envelope_to_lines(env, problems=reference)).items()}
    assert got == want and ours == reference and len(ours) == 1


def test_split_payloads_cuts_where_batch_does() -> None:
    text = b"".join(b"x" * n + b"\n" for n in (3, 10, 1, 25, 4, 4, 4))
    lines = text.splitlines(keepends=True)
    for max_bytes in (1, 5, 12, 20, 30, 100):
        got = split_payloads(text, max_bytes)
        assert b"".join(got) == text and got == _greedy(lines, max_bytes)


def _greedy(texts: list[bytes], max_bytes: int) -> list[bytes]:
    """The packing `batch` promises, one line at a time."""
    out: list[bytes] = []
    buf = b""
    for text in texts:
        if buf and len(buf) + len(text) > max_bytes:
            out.append(buf)
            buf = b""
        buf += text
    return [*out, buf] if buf else out


@pytest.mark.parametrize("max_bytes", [1, 150, 1000, 70_000, 512 * 1024])
def test_batch_packs_whole_lines_greedily_across_slices(max_bytes: int) -> None:
    lines = envelope_to_lines(_odd_node())  # ~2,700 lines: three of batch's 1024-line slices
    texts = [t.encode() for t in format_shared(lines)]
    assert len(texts) > 2048
    assert list(batch(lines, max_bytes)) == _greedy(texts, max_bytes)
