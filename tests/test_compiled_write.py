"""The compiled Sonar -> line protocol writer (`schemas/translate/_write.c`) gives what the pure path gives.

`envelope_payloads` with the extension (C writes the jobs and processes it is sure of, `_JobWalk.step` the
others) must equal, byte for byte, the same function on the pure path (`payloads._write` set to None, as
`HPCBUS_PURE=1` leaves it) and the reference `Line` path (`route(envelope_to_lines(...))` + `batch`, which no
C touches): on the corpus, on generated envelopes (the spec's strategies of test_translate_hypothesis.py, and
busy nodes whose processes hold edge values the C must hand back), and on hostile ones (NaN, infinities,
subnormals, huge and negative numbers, names that need escapes or are not UTF-8, repeated keys, wrong types
in a struct built in-process). The C parts are also held to their pure twins one by one (`jobs` to
`each_job`, `float_repr` to `repr`, `string_field` to `_string_field`), and a loop over good and hostile input
checks that nothing leaks (references to the input, RSS).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.translate import node_envelope
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.lineprotocol.format import FormatError, _string_field
from hpcbus.schemas.native import implementation
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    SampleEnvelope,
    SampleGpu,
    SampleJob,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
)
from hpcbus.schemas.translate import (
    batch,
    envelope_payloads,
    envelope_texts,
    envelope_to_lines,
    payloads,
    route,
    sample_fields,
)
from hpcbus.schemas.translate.bus import format_shared, split_chunks, split_payloads
from hpcbus.schemas.translate.payloads import _TextWriter
from hpcbus.schemas.translate.sample_fields import PROCESS_FIELDS, PROCESS_GPU_FIELDS
from hpcbus.schemas.translate.sample_to_lp import _JobWalk, each_job
from tests.compiled_inputs import rss_kib
from tests.test_translate_corpus import SONAR_FILES, _valid
from tests.test_translate_hypothesis import envelopes

_write: Any = payloads._write
NOW = 1_700_000_000
replace = msgspec.structs.replace


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert _write is not None, "hpcbus.schemas.translate._write is not built (pip install -e . with gcc)"
    assert "Sonar->LP write" in implementation()


@contextmanager
def pure_path() -> Iterator[None]:
    """`envelope_payloads` on its pure path, as `HPCBUS_PURE=1` makes it (no `_write`)."""
    saved = payloads._write
    payloads._write = None
    try:
        yield
    finally:
        payloads._write = saved


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The result, or the error (its type and text) for input that cannot be written."""
    try:
        return fn(*args, **kwargs)
    except (FormatError, ValueError, TypeError) as e:
        return (type(e), str(e))


def same(env: Any, max_bytes: int = 512 * 1024, prefix: str = "") -> Any:
    """The compiled path, the pure path and the `Line` path on `env`: equal (also the problems); the result."""
    context = {"cluster": "fallback", "now": NOW, "prefix": prefix}
    problems: list[Problem] = []
    fast = outcome(envelope_payloads, env, max_bytes=max_bytes, problems=problems, **context)
    with pure_path():
        pure_problems: list[Problem] = []
        pure = outcome(envelope_payloads, env, max_bytes=max_bytes, problems=pure_problems, **context)
        texts = outcome(envelope_texts, env, **context)
    assert fast == pure
    assert problems == pure_problems
    assert outcome(envelope_texts, env, **context) == texts

    def reference() -> dict[str, list[bytes]]:
        lines = envelope_to_lines(env, cluster="fallback", now=NOW)
        return {s: list(batch(g, max_bytes)) for s, g in route(lines, "fallback", prefix=prefix).items()}

    ref = outcome(reference)
    if isinstance(ref, dict) or isinstance(fast, dict):
        assert fast == ref
    return fast


# --- the corpus and the bench node ---------------------------------------------------------------------------


def test_corpus_envelopes() -> None:
    envs = [env for path in SONAR_FILES for _line, env, _raw in _valid(path)]
    assert sum(isinstance(env, SampleEnvelope) for env in envs) >= 3
    for env in envs:
        same(env)
        same(env, 700, "cc")


def jobs_taken(env: SampleEnvelope) -> tuple[int, int]:
    """(jobs the C wrote itself, jobs it handed to `step`) of a sample."""
    assert env.data is not None
    a = env.data.attributes
    handed: list[SampleJob] = []
    walk = _JobWalk(_TextWriter(0), a.cluster, a.node, set(), set(), {}, 0)

    def step(job: SampleJob) -> tuple[SampleJob, int]:
        handed.append(job)
        return walk.step(job)

    _write.jobs(a.jobs, a.cluster, a.node, set(), set(), PROCESS_FIELDS, PROCESS_GPU_FIELDS, payloads._PROCESS_LAYOUT, [], " 0\n",
                replace, step)  # fmt: skip
    return len(a.jobs) - len(handed), len(handed)


def test_the_bench_node_is_written_by_the_c_writer() -> None:
    """Every job of the bench's node, GPU processes included, is the C writer's own (no job handed back)."""
    for k in range(3):
        env = node_envelope(k)
        assert jobs_taken(env) == (20, 0)
        for max_bytes in (1, 300, 64 * 1024, 512 * 1024):
            same(env, max_bytes)


# --- hostile envelopes ----------------------------------------------------------------------------------------


def with_job(env: SampleEnvelope, i: int, **changes: Any) -> SampleEnvelope:
    assert env.data is not None
    jobs = list(env.data.attributes.jobs)
    jobs[i] = replace(jobs[i], **changes)
    return replace(env, data=replace(env.data, attributes=replace(env.data.attributes, jobs=jobs)))


def with_process(env: SampleEnvelope, job: int, i: int, **changes: Any) -> SampleEnvelope:
    assert env.data is not None
    procs = list(env.data.attributes.jobs[job].processes)
    procs[i] = replace(procs[i], **changes)
    return with_job(env, job, processes=procs)


def with_node(env: SampleEnvelope, **changes: Any) -> SampleEnvelope:
    assert env.data is not None
    return replace(env, data=replace(env.data, attributes=replace(env.data.attributes, **changes)))


GPU = SampleProcessGpu(index=0, uuid="GPU-1", gpu_util=12.5, gpu_memory=2048, gpu_memory_util=3.0)

HOSTILE_PROCESS: list[dict[str, Any]] = [
    {"cpu_util": math.nan},
    {"cpu_avg": math.inf},
    {"cpu_avg": -math.inf},
    {"cpu_util": 5e-324},
    {"cpu_util": -2.2250738585072014e-308},
    {"cpu_util": 1e300, "cpu_avg": -1e-300},
    {"cpu_util": 0.1 + 0.2, "cpu_avg": 1e15, "num_threads": 0},
    {"cpu_util": -0.0, "cpu_avg": 0.0},
    {"resident_memory": 2**63 - 1, "virtual_memory": 2**63},
    {"resident_memory": 2**64 - 1},
    {"data_read": 2**62, "data_written": 2**62, "cpu_time": 2**62},
    {"rolledup": -5},
    {"rolledup": 2**63 - 1},
    {"rolledup": -(2**63)},
    {"pid": 0},
    {"ppid": 0},
    {"cmd": ""},
    {"cmd": "my prog,x=1"},
    {"cmd": "tab\tand\\slash"},
    {"cmd": "new\nline"},
    {"cmd": "ünïcode"},
    {"cmd": "x" * 1025},
    {"cmd": "x" * 1024},
    {"cmd": '"quoted"%s%%'},
    {"cmd": "\ud800"},
    {"pid": 100_001},  # the pid of the next process: two processes, one key
    {"pid": 10**18},
    {"gpus": [GPU]},
    {"gpus": [GPU, GPU]},  # one uuid twice: numbered keys
    {"gpus": [replace(GPU, uuid="")]},
    {"gpus": [replace(GPU, uuid="a b")]},
    # uuids that are no device id (issue 29): written as `device_key` makes them, by the pure path
    {"gpus": [replace(GPU, uuid="../../x")]},
    {"gpus": [replace(GPU, uuid="a/b;c")]},
    {"gpus": [replace(GPU, uuid="G" * 57)]},
    {"gpus": [replace(GPU, uuid="G" * 56), replace(GPU, uuid="G" * 56)]},
    {"gpus": [replace(GPU, gpu_util=math.nan)]},
    {"gpus": [replace(GPU, gpu_util=5e-324)]},
    {"gpus": [replace(GPU, gpu_memory=2**53 + 1)]},
    {"gpus": [replace(GPU, gpu_memory=2**53)]},
    {"gpus": [replace(GPU, gpu_memory=0, gpu_util=0.0, gpu_memory_util=0.0)]},
    {"gpus": [replace(GPU, uuid=f"GPU-{i}") for i in range(17)]},
    # a struct built in-process may hold anything its annotations do not enforce
    {"pid": True},
    {"pid": -3},
    {"cpu_util": 7},
    {"resident_memory": 1.5},
    {"cmd": 42},
    {"gpus": (GPU,)},
    {"rolledup": 2.5},
    # fields that become no line: the skeleton's JSON, which the C writes itself, holds them as msgspec would
    {"in_container": True},
    {"in_container": 1},
    {"in_container": 0},
    {"in_container": None},
    {"data_cancelled": 7, "rolledup": 3},
    {"data_cancelled": 2**64},
    {"data_cancelled": -1},
    {"data_cancelled": 0.0},
    {"data_cancelled": 1.5},
    {"data_cancelled": True},
    {"cmd": 'a"b'},
    {"gpus": []},
    {"cpu_avg": 0.0, "cpu_util": -0.0, "data_read": 0, "data_written": 0, "cpu_time": 0, "num_threads": 0},
    {"resident_memory": 0, "virtual_memory": 0, "cpu_avg": 0.0, "cpu_util": 0.0, "cpu_time": 0},
]

HOSTILE_JOB: list[dict[str, Any]] = [
    {"user": ""},
    {"user": "a b"},
    {"user": "ü"},
    {"user": "x\\"},
    {"epoch": 1_700_000_000},
    {"job": 0},
    {"job": 2_940_001},  # the next job's id: two jobs, one key
    {"job": 2**64 - 1},
    {"processes": []},
    {"job": -1},
    {"user": 5},
]

HOSTILE_NODE: list[dict[str, Any]] = [
    {"cluster": "a b"},
    {"node": "n,1"},
    {"node": "ü.example"},
    {"cluster": "x" * 1025},
]


@pytest.mark.parametrize("changes", HOSTILE_PROCESS, ids=repr)
def test_hostile_process(changes: dict[str, Any]) -> None:
    env = with_process(node_envelope(1), 0, 2, **changes)
    same(env)
    same(env, 400)


@pytest.mark.parametrize("changes", HOSTILE_JOB, ids=repr)
def test_hostile_job(changes: dict[str, Any]) -> None:
    env = with_job(node_envelope(1), 0, **changes)
    same(env)
    same(env, 400)


@pytest.mark.parametrize("changes", HOSTILE_NODE, ids=repr)
def test_hostile_node(changes: dict[str, Any]) -> None:
    same(with_node(node_envelope(1), **changes))


class _OtherProcess(SampleProcess, kw_only=True):
    """A process struct of another class: the C writer reads only `SampleProcess` itself."""


def test_a_process_of_another_class_hands_its_job_back() -> None:
    env = node_envelope(1)
    assert env.data is not None
    procs = list(env.data.attributes.jobs[5].processes)
    procs[3] = _OtherProcess(**msgspec.structs.asdict(procs[3]))
    env = with_job(env, 5, processes=procs)
    assert jobs_taken(env) == (19, 1)
    same(env)


def test_the_skeleton_jobs_encode_as_the_pure_ones() -> None:
    """What `jobs` returns (a job's processes as the JSON of the skeleton's, `msgspec.Raw`) encodes as the jobs
    of `each_job` do, and the line count is theirs."""
    envs = [node_envelope(0), with_process(node_envelope(1), 2, 1, in_container=True, data_cancelled=9)]
    envs.append(with_process(node_envelope(1), 1, 1, gpus=[GPU, replace(GPU, uuid="GPU-2", gpu_util=0.0)]))
    for env in envs:
        assert env.data is not None
        a = env.data.attributes

        def walk() -> _JobWalk:
            return _JobWalk(_TextWriter(0), a.cluster, a.node, set(), set(), {}, 0)  # noqa: B023 (called here)

        fast = _write.jobs(a.jobs, a.cluster, a.node, set(), set(), PROCESS_FIELDS, PROCESS_GPU_FIELDS,
                           payloads._PROCESS_LAYOUT, [], " 0\n", replace, walk().step)  # fmt: skip
        pure = each_job(a.jobs, walk().step)
        assert fast[1] == pure[1]
        assert msgspec.json.encode(fast[0]) == msgspec.json.encode(pure[0])
        assert any(isinstance(j.processes, msgspec.Raw) for j in fast[0])


@pytest.mark.parametrize(
    ("changes", "taken"),
    [
        ({"in_container": True, "data_cancelled": 7, "rolledup": 2}, (20, 0)),
        ({"in_container": 1, "cpu_util": -0.0}, (20, 0)),
        ({"in_container": 0.0, "cpu_avg": 0.0}, (20, 0)),
        ({"in_container": -0.0}, (20, 0)),
        ({"in_container": 0.5}, (19, 1)),
        ({"cmd": 'a"b'}, (19, 1)),  # JSON would escape it: msgspec writes it
        ({"data_cancelled": 1.5}, (19, 1)),  # a line field of the wrong type
        ({"in_container": 2**64}, (19, 1)),
        ({"in_container": None}, (19, 1)),
    ],
    ids=repr,
)
def test_the_skeleton_fields_the_c_writes_and_those_it_hands_back(
    changes: dict[str, Any], taken: tuple[int, int]
) -> None:
    env = with_process(node_envelope(1), 4, 2, **changes)
    assert jobs_taken(env) == taken
    same(env)


def test_a_hostile_process_hands_its_job_back_and_nothing_else() -> None:
    """The C writer forgets what it wrote of a job it is not sure of and writes every other one itself."""
    env = with_process(node_envelope(2), 3, 4, cmd="a b")
    assert jobs_taken(env) == (19, 1)
    assert jobs_taken(with_node(env, cluster="a b")) == (0, 20)


# --- generated envelopes -----------------------------------------------------------------------------------

GEN = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip


@GEN
@given(envelopes(SampleEnvelope))
def test_generated_envelopes(env: SampleEnvelope) -> None:
    same(env)


PLAIN = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
NAMES = st.one_of(PLAIN, st.text(max_size=8))
FLOATS = st.one_of(
    st.floats(),
    st.floats(-1e6, 1e6).map(lambda x: round(x, 2)),
    st.sampled_from([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-3, 9.99e-4, 1e15, 1e16, 0.1, 2.675]),
)
INTS = st.one_of(
    st.integers(0, 10**6), st.integers(0, 2**64 - 1), st.sampled_from([0, 2**53, 2**53 + 1, 2**63])
)


@st.composite
def busy_node(draw: st.DrawFn) -> SampleEnvelope:
    """The bench node with generated processes: mostly values the C writer takes, some it hands back."""
    env = node_envelope(draw(st.integers(0, 5)))
    assert env.data is not None
    jobs = []
    for job in env.data.attributes.jobs[: draw(st.integers(1, 4))]:
        procs = []
        for _ in range(draw(st.integers(0, 5))):
            gpus = draw(
                st.lists(
                    st.builds(
                        SampleProcessGpu, uuid=NAMES, gpu_util=FLOATS, gpu_memory=INTS, gpu_memory_util=FLOATS
                    ),
                    max_size=3,
                )
            )
            procs.append(
                SampleProcess(
                    pid=draw(st.integers(0, 40)),
                    ppid=draw(st.integers(0, 3)),
                    cmd=draw(NAMES),
                    resident_memory=draw(INTS),
                    cpu_avg=draw(FLOATS),
                    cpu_util=draw(FLOATS),
                    num_threads=draw(st.integers(0, 3)),
                    rolledup=draw(st.integers(-(2**63), 2**63 - 1)),
                    in_container=draw(st.booleans()),
                    data_cancelled=draw(st.one_of(st.just(0), INTS)),
                    gpus=gpus,
                )
            )
        jobs.append(
            replace(
                job,
                job=draw(st.integers(0, 3)),
                epoch=draw(st.integers(0, 2)),
                user=draw(NAMES),
                processes=procs,
            )
        )
    return with_node(env, jobs=jobs)


@GEN
@given(busy_node())
def test_generated_busy_nodes(env: SampleEnvelope) -> None:
    same(env)
    same(env, 333)


# --- the C parts one by one ----------------------------------------------------------------------------------


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), FLOATS.filter(math.isfinite)))
@example(98.5)
@example(0.001)
@example(999999999999999.9)
@example(4503599627370495.5)
@example(1e-4)
def test_float_text_is_repr(x: float) -> None:
    assert _write.float_repr(x) == repr(x)


@settings(max_examples=500, deadline=None)
@given(st.text())
@example('a"b\\c\r\nd')
def test_string_field_is_the_pure_one(text: str) -> None:
    assert _write.string_field(text) == _string_field(text).encode()


def test_string_field_hands_back_text_without_utf8() -> None:
    assert _write.string_field("\ud800") is None


NUMBERS = st.one_of(
    st.integers(-(2**64), 2**65),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, True, False]),
    st.floats(),
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, math.nan, math.inf, 1e300]),
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(NUMBERS, max_size=5), st.sampled_from(["", ",a=b", ",host=ü,x=1"]))
def test_lines_are_format_shareds(values: list[Any], tags: str) -> None:
    """`lines` writes an object's lines as `format_shared` does, or hands back values it does not write."""
    names = tuple(f"m{i}" for i in range(len(values)))
    text = _write.lines(names, tags, tuple(values), " 17\n")
    tag_dict = dict(t.split("=") for t in tags.split(",")[1:])
    try:
        lines = [Line(n, tag_dict, {"value": v}, 17) for n, v in zip(names, values, strict=True)]
        expected: bytes | None = "".join(format_shared(lines)).encode()
    except FormatError:  # NaN, infinities, beyond 64 bits: the pure path names the problem
        expected = None
    if text is None:  # handed back: what cannot be written, and bools (`format_line` writes them)
        assert expected is None or any(type(v) is bool for v in values)
    else:
        assert text == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**64), 2**64), st.booleans()), max_size=40))
def test_numbered_lines_are_the_templates(values: list[int]) -> None:
    text = _write.numbered("cpu_time", ",cluster=c,type=hwthread,type-id=", ",x=y", values, " 5\n")
    if any(type(v) is not int or not -(2**63) <= v < 2**63 for v in values):
        assert text is None
    else:
        template = "cpu_time,cluster=c,type=hwthread,type-id=%s,x=y value=%si 5\n"
        assert text == "".join(map(template.__mod__, enumerate(values))).encode()


LINES = st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=30)


@settings(max_examples=500, deadline=None)
@given(st.lists(LINES, max_size=6), st.integers(1, 200))
def test_split_chunks_cuts_where_split_payloads_does(chunks: list[list[bytes]], max_bytes: int) -> None:
    joined = [b"".join(c) for c in chunks]
    assert split_chunks(joined, max_bytes) == split_payloads(b"".join(joined), max_bytes)


ANY_NUMBER = st.one_of(
    INTS,
    FLOATS,
    st.integers(-(2**70), 2**70),
    st.sampled_from([-(2**63), -(2**63) - 1, 2**63 - 1, -(2**53) - 1, 1, -1, True, None, "7", 1 + 0j]),
)


def _typed(values: tuple[Any, ...]) -> list[tuple[type, str]]:
    """Values by type and repr (NaN equal to NaN)."""
    return [(type(v), repr(v)) for v in values]


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(["gpu", "node", "node_boot"]), st.lists(ANY_NUMBER, min_size=11, max_size=11))
def test_values_are_the_pure_ones(level_name: str, numbers: list[Any]) -> None:
    """The compiled `field_values` of the node and a GPU (converters: none, `_to_float`, KiB -> MiB, P-state) gives
    the pure one's names, values (types included) and zeros, or None (then the pure one is used)."""
    level = {"gpu": sample_fields.GPU, "node": sample_fields.NODE, "node_boot": sample_fields.NODE_BOOT}[
        level_name
    ]
    cls = SampleGpu if level_name == "gpu" else SampleSystem
    obj = cls(**{row[0]: v for row, v in zip(level.table, numbers, strict=False)})
    fast = _write.values(obj, level.coded)
    try:
        pure = sample_fields.field_values(obj, level.table)
    except TypeError:  # a type the pure converters refuse: the C must have handed it back
        assert fast is None
        return
    if fast is not None:
        assert fast[0] == pure[0] and fast[2] == pure[2]
        assert _typed(fast[1]) == _typed(pure[1])
    else:  # only for what the C is not sure of: other types, ints it would compute beyond int64
        assert any(
            type(v) not in (int, float) or (type(v) is int and not -(2**63) < v < 2**63) for v in numbers
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.integers(0, 200_000).map(bytes)), max_size=8))
def test_join_is_bytes_join(pieces: list[bytes]) -> None:
    """`join` (the messages' join, its pages faulted in at once) gives `b"".join`'s bytes; one piece: itself."""
    assert _write.join(pieces) == b"".join(pieces)
    if len(pieces) == 1:
        assert _write.join(pieces) is pieces[0]
    with pytest.raises(TypeError):
        _write.join([*pieces, "text"])
    with pytest.raises(TypeError):
        _write.join(tuple(pieces))


# --- no leaks ------------------------------------------------------------------------------------------------


def test_no_leaks() -> None:
    """Many runs over good and hostile envelopes hold no new reference to their input and grow no memory."""
    envs = [node_envelope(0)] + [with_process(node_envelope(1), 0, 2, **c) for c in HOSTILE_PROCESS]
    envs += [with_job(node_envelope(1), 0, **c) for c in HOSTILE_JOB]
    probes: list[object] = []
    for env in envs:
        assert env.data is not None
        for job in env.data.attributes.jobs[:2]:
            probes += [job, job.processes]
            for p in job.processes[:4]:
                probes += [p, p.gpus, *p.gpus]  # (not their str: shared with much else)

    def run(n: int) -> None:
        for _ in range(n):
            for env in envs:
                outcome(envelope_payloads, env)

    run(5)
    refs = [sys.getrefcount(p) for p in probes]
    rss = rss_kib()
    run(60)
    assert [sys.getrefcount(p) for p in probes] == refs
    assert rss_kib() - rss < 8 * 1024


# --- the switch ----------------------------------------------------------------------------------------------


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = "from hpcbus.schemas.translate import payloads; print(payloads._write is None)"
    for pure, expected in (("1", "True"), ("0", "False")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "HPCBUS_PURE": pure},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected
