"""The compiled reading of the LP -> Sonar translator (`schemas/translate/_place.c`) gives what the pure path
gives, line for line, and the envelopes built from it are the pure path's.

`read_compiled` (C builds the `Line`s of canonical metric lines, the pure path alone decides each other line)
must equal `read_pure` (`parse_payload` of the whole payload): the same lines (tag order, value types and the
sign of a zero included) and the same problems, on the Sonar corpus translated to line protocol, on the
ClusterCockpit corpus, on generated lines (translator-shaped, printable and hostile) and on the fault suite's
hostile messages; `LpToSonar` fed either gives equal `Assembled`s. These tests need the extension built
(`pip install -e .` with a compiler: setup.py) and say so when it is not; `HPCBUS_PURE=1` must switch it off.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import Line, Parsed, format_lines, metric
from hpcbus.schemas.lineprotocol.parse import latest_of, seconds_window
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.native import implementation
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import iter_envelopes
from hpcbus.schemas.translate import LpToSonar, batch, envelope_to_lines, lp_read, route
from hpcbus.schemas.translate.lp_read import read_compiled, read_pure
from tests.compiled_inputs import (
    HOSTILE,
    LEFT_TO_THE_PURE_PATH,
    LIVE,
    LP_FILES,
    NOW,
    NUMBER,
    TIME,
    WINDOW_EDGES,
    WINDOWS,
    assert_memory_flat,
    changed,
    corpus_payloads,
    fault_messages,
    printed_on_the_pure_path,
)
from tests.corpus import CORPUS


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert lp_read._place is not None, (
        "hpcbus.schemas.translate._place is not built (pip install -e . with gcc)"
    )
    assert lp_read.read_payload is read_compiled
    assert "LP->Sonar read" in implementation().split(";")[0]


def exact(lines: list[Line]) -> list[tuple[object, ...]]:
    """What `==` on `Line`s does not see: tag order, int against float (1 == 1.0), the sign of a zero."""
    return [
        (
            line.measurement,
            list(line.tags.items()),
            [(k, type(v).__name__, repr(v)) for k, v in line.fields.items()],
            line.time,
        )
        for line in lines
    ]


def same(payload: bytes, now: int = NOW) -> Parsed:
    """Both paths on `payload`, asserted equal for each window; the compiled result in the workers' window."""
    for max_future in WINDOWS:
        fast = read_compiled(payload, now=now, place="x.metrics", max_future=max_future)
        pure = read_pure(payload, now=now, place="x.metrics", max_future=max_future)
        assert fast == pure, payload[:300]
        assert exact(fast.lines) == exact(pure.lines), payload[:300]
    return fast


def taken(payload: bytes, max_future: int | None = DEFAULT_MAX_FUTURE) -> int:
    """How many lines of `payload` C itself built (not left to the pure path), in the workers' window (or
    none: `max_future=None`)."""
    earliest, end = seconds_window(latest_of(NOW, max_future))
    items, _rest, _plain = lp_read._place.read(payload, earliest, end, Line)  # type: ignore[union-attr]
    return sum(type(item) is Line for item in items)


# --- the corpus: Sonar envelopes on the bus and back ------------------------------------------------------------


def _envelopes(path: Path) -> list[object]:
    return [env for _, env in iter_envelopes(path.read_text()) if not isinstance(env, InvalidInput)]


SONAR_FILES = [
    p for p in sorted((CORPUS / "sonar").iterdir()) if p.suffix in (".json", ".jsonl") and _envelopes(p)
]
"""The files with envelopes `schemas.sonar` accepts (not the old format's)."""


def test_the_corpus_is_there() -> None:
    assert len(SONAR_FILES) >= 10 and len(LP_FILES) >= 8


def _translate(messages: list[tuple[str, bytes]], reader: object) -> list[object]:
    translator = LpToSonar()
    out: list[object] = []
    for i, (subject, payload) in enumerate(messages):
        parsed = reader(payload, now=NOW, place=subject)  # type: ignore[operator]
        unmade: list[Problem] = []
        out += translator.add_lines(parsed.lines, cluster="corpus.example", now=i, problems=unmade)
        out += unmade  # compared between the two readings like the envelopes
    out += translator.flush_all()
    return out


@pytest.mark.parametrize("path", SONAR_FILES, ids=lambda p: p.name)
def test_sonar_corpus(path: Path) -> None:
    """Every envelope of the file as hpcbus puts it on the bus (cut into several messages, shuffled): each
    message reads equal on both paths, and the translator builds equal envelopes from either."""
    envelopes = _envelopes(path)
    messages = []
    for env in envelopes:
        for subject, lines in route(envelope_to_lines(env, cluster="corpus.example")).items():
            cut = max(200, len(format_lines(lines)) // 3)
            messages += [(subject, p) for p in batch(lines, max_bytes=cut)]
    random.Random(7).shuffle(messages)
    for _, payload in messages:
        same(payload)
    assert sum(taken(p, None) for _, p in messages) > 0 or "sample" not in path.name
    assert _translate(messages, read_compiled) == _translate(messages, read_pure)


@pytest.mark.parametrize("path", LP_FILES, ids=lambda p: p.name)
def test_line_protocol_corpus(path: Path) -> None:
    for payload, now in corpus_payloads(path):
        same(payload, now)


def test_the_bench_node_is_read_by_c() -> None:
    """`make bench`'s node (2,683 lines per sample): every metric line is C's, the skeleton the pure path's,
    and the envelopes built are the pure path's and the envelopes sent."""
    from bench.translate import messages, node_envelope

    envelopes = [node_envelope(k) for k in range(2)]
    payloads = messages(envelopes)
    lines = sum(p.count(b"\n") for p in payloads)
    assert sum(taken(p, None) for p in payloads) == lines - 2  # all but the two skeletons
    for payload in payloads:
        same(payload)
    feed = [("bench.example.metrics", p) for p in payloads]
    done = _translate(feed, read_compiled)
    assert done == _translate(feed, read_pure)
    assert [a.envelope for a in done] == envelopes and all(a.complete for a in done)  # type: ignore[attr-defined]


# --- hand-picked lines ----------------------------------------------------------------------------------------

PROCESS = (
    "process_rss,cluster=c.x,cmd=python3,hostname=n1,job=29,pid=101,ppid=100,stype=process,"
    "stype-id=29/101,type=node,type-id=process,user=u_1 value={v} {t}"
)


def test_translator_lines_are_taken_by_c() -> None:
    """The lines a node's sample is made of never leave C, so the comparisons above test C."""
    lines = [
        metric("cpu_time", 738432, hostname="n001", time=NOW, type="hwthread", type_id="7"),
        metric("mem_used", 123456789, hostname="n001", time=NOW),
        metric("load_one", 102.44, hostname="n001", time=NOW, cluster="fox.educloud.no"),
        metric("gpu_util", 48, hostname="n001", time=NOW, type="accelerator", type_id="GPU-85e5"),
        metric("disk_read", 1.5, hostname="n001", time=NOW, stype="disk", stype_id="sda"),
        metric("cpu_load", -0.0, hostname="n-1_x", time=NOW, cluster="fox.educloud.no", job="123_4.batch"),
    ]
    payload = format_lines(lines).encode()
    result = same(payload)
    assert taken(payload) == len(lines)
    assert result.lines == lines and not result.problems


def test_runs_of_lines_with_the_same_tag_keys() -> None:
    """C starts a line's tags from a copy of the previous line's when the keys are the same: values that
    change (or not) from line to line, a key set that changes, a line the pure path takes between them."""
    rows = [
        PROCESS.format(v="1i", t=NOW),
        PROCESS.format(v="2.5", t=NOW),
        PROCESS.replace("pid=101", "pid=102").format(v="3i", t=NOW + 1),
        PROCESS.replace("user=u_1", "user=u_2").replace("cmd=python3", "cmd=bash").format(v="-0", t=NOW),
        PROCESS.replace(",user=u_1", "").format(v="4i", t=NOW),
        PROCESS.replace("value={v}", "value={v},x=1").format(v="5i", t=NOW),  # pure path: two fields
        PROCESS.replace("pid=101", "pid=103").format(v="6i", t=NOW),
        PROCESS.replace("cmd=python3", "cmd=py\\ thon").format(v="7i", t=NOW),  # pure path: an escape
        PROCESS.replace("job=29", "job=..").format(v="8i", t=NOW),  # refused
        PROCESS.replace("job=29", "job=30").format(v="9i", t=NOW),
    ]
    payload = "\n".join(rows).encode()
    result = same(payload)
    assert taken(payload) == 7 and len(result.lines) == 9 and len(result.problems) >= 2
    assert [line.tags["pid"] for line in result.lines[:4]] == ["101", "101", "102", "101"]
    assert result.lines[3].tags["cmd"] == "bash" and result.lines[4].tags.get("user") is None


@pytest.mark.parametrize("line", LEFT_TO_THE_PURE_PATH)
def test_lines_c_leaves_to_the_pure_path(line: bytes) -> None:
    """Each of these is unusual in one way: C does not build it, and the pure path's verdict (kept, repaired
    or refused with its reason) is what comes out, between two lines C builds."""
    assert taken(line) == 0
    good = b"m,hostname=n1,type=node value=2 200"
    same(good + b"\n" + line + b"\n" + good + b"\n")


def test_numbers_read_as_the_parser_reads_them() -> None:
    """Floats correctly rounded, ints to 18 digits, a negative zero kept, an integer text a float."""
    numbers = ["0", "-0", "-0.0", "5", "0.1", "1.7976931348623157" + "0" * 40, "123456789012345678i", "-0i"]
    numbers += ["0." + "0" * 60 + "1", "2.2250738585072011e-308".replace("e-308", ""), "-999999999999999999i"]
    numbers += ["007i", "-007", "00.50", "-000000000000000001i", "1" * 64]
    payload = "".join(f"m,hostname=n1,type=node value={n} {NOW}\n" for n in numbers).encode()
    assert taken(payload) == len(numbers)
    result = same(payload)
    assert [type(line.fields["value"]) for line in result.lines[:5]] == [float] * 5
    assert repr(result.lines[1].fields["value"]) == "-0.0"


def test_timestamp_window_bounds() -> None:
    for ts in WINDOW_EDGES:
        same(f"m,hostname=n1,type=node value=1 {ts}\n".encode())
    fast = read_compiled(
        f"m,hostname=n1,type=node value=1 {NOW + DEFAULT_MAX_FUTURE + 1}\n".encode(),
        now=NOW,
        max_future=DEFAULT_MAX_FUTURE,
    )
    assert not fast.lines and "later than now + max_future" in fast.problems[0].reason


def test_more_names_than_the_cache_keeps() -> None:
    """Every line with names of its own (5,000 distinct names in 70 KB): past the names C keeps per payload
    it makes each afresh, with the same result."""
    payload = "".join(
        f"m{i},hostname=h{i},type=hwthread,type-id={i},a{i}=v{i} value={i}i {NOW}\n" for i in range(1000)
    ).encode()
    assert taken(payload) == 1000
    result = same(payload)
    assert [line.tags[f"a{i}"] for i, line in enumerate(result.lines)] == [f"v{i}" for i in range(1000)]


def test_empty_and_blank_payloads() -> None:
    for payload in (b"", b"\n", b"\n\n\r\n", b"# a comment\n", b"   \n\t\n"):
        assert same(payload) == Parsed([], [], [])


def test_a_str_payload_goes_the_pure_way() -> None:
    text = PROCESS.format(v="1i", t=NOW)
    assert read_compiled(text, now=NOW) == read_pure(text, now=NOW)


def test_line_type_is_checked() -> None:
    with pytest.raises(TypeError, match="line_type"):
        lp_read._place.read(b"x", 0, 1, 5)  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        lp_read._place.read("text", 0, 1, Line)  # type: ignore[union-attr]


# --- generated lines ----------------------------------------------------------------------------------------

NAME_CHARS = st.sampled_from(["a", "Z", "0", "9", "_", "-", ".", ":", "/", "@", *HOSTILE])
SAFE = st.text(st.sampled_from("abcXYZ019_-./"), min_size=1, max_size=6)
NAME = st.one_of(
    st.sampled_from(["n1", "c001.fox", "fox.educloud.no", "29", "process", "disk", "..", "0", "u_1"]),
    SAFE,
    st.text(NAME_CHARS, min_size=0, max_size=6),
)
"""A translator's tag values: hosts, job and process ids, names of its metrics, sometimes hostile."""
KEY = st.one_of(
    st.sampled_from(["cmd", "job", "pid", "ppid", "user", "stype-id", "cluster", "epoch", "host", "value"]),
    st.text(NAME_CHARS, min_size=0, max_size=5),
)


@st.composite
def translator_lines(draw: st.DrawFn) -> list[str]:
    """A run of lines the way a node's sample has them (a process's lines share their tags; the next
    process changes a few), each sometimes changed in one place."""
    level = draw(st.sampled_from(["node", "node", "hwthread", "accelerator", "core", "x"]))
    tags = {"hostname": draw(st.one_of(st.just("n1"), NAME)), "type": level}
    if level != "node" or draw(st.integers(0, 4)) == 0:
        tags["type-id"] = draw(NAME)
    if level == "node" and draw(st.booleans()):
        tags["stype"] = tags["type-id"] = draw(st.sampled_from(["process", "disk", "job"]))
    for _ in range(draw(st.integers(0, 8))):
        tags[draw(KEY)] = draw(NAME)
    order = draw(st.permutations(list(tags)))
    out = []
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.integers(0, 2)) == 0:  # the next process: a value or two change
            key = draw(st.sampled_from(order))
            tags[key] = draw(NAME)
        head = ",".join(
            [draw(st.sampled_from(["process_rss", "cpu_time", "m"])), *(f"{k}={tags[k]}" for k in order)]
        )
        line = f"{head} value={draw(NUMBER)} {draw(st.one_of(LIVE, TIME))}".rstrip()
        out.append(changed(draw, line) if draw(st.integers(0, 5)) == 0 else line)
    return out


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(translator_lines(), min_size=1, max_size=4), st.sampled_from(["\n", "\r\n"]))
@example([[PROCESS.format(v="1i", t=NOW), PROCESS.format(v="0.1", t=NOW)]], "\n")
def test_generated_translator_lines(runs: list[list[str]], end: str) -> None:
    same(end.join(line for run in runs for line in run).encode("utf-8", "surrogatepass"))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_generated_bytes(data: bytes) -> None:
    same(data)
    same(b"m,hostname=n1,type=node value=1 " + data)
    same(PROCESS.format(v="1i", t=NOW).encode() + b"\n" + data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_generated_text(text: str) -> None:
    same(text.encode("utf-8", "surrogatepass"))


# --- the fault suite's hostile messages ---------------------------------------------------------------------


def test_fault_suite_hostile_messages() -> None:
    """Every bad or hostile message of fault scenario 6 (garbage bytes, NaN, inf, past, future, 10,000 tags,
    a 1 MB line, 10,000-deep JSON) with its valid neighbour, both paths; the 10,000 tags and the 1 MB line
    (a quarter second each on the pure path) three times each."""
    for payload, kind, good in fault_messages(NOW):
        result = same(payload)
        assert taken(payload) == good  # the valid neighbour is C's, the bad line the pure path's
        assert len(result.problems) >= 1 or kind == "deepjson"


# --- memory ---------------------------------------------------------------------------------------------------


def _fails_at(n: int) -> object:
    """A `line_type` that builds `n` lines (tuples) and then raises: C's error path mid-payload."""
    made = [0]

    def build(*parts: object) -> tuple[object, ...]:
        made[0] += 1
        if made[0] > n:
            raise RuntimeError("line type failed")
        return parts

    return build


def test_an_error_mid_payload_is_raised() -> None:
    """An exception while building a line (here from the `line_type`) comes out of `read` as it is."""
    payload = ((PROCESS.format(v="1i", t=NOW) + "\n") * 3).encode()
    place = lp_read._place
    assert place is not None
    with pytest.raises(RuntimeError, match="line type failed"):
        place.read(payload, 0, 2**40, _fails_at(2))
    items, rest, plain = place.read(payload, 0, 2**40, _fails_at(3))
    assert len(items) == 3 and rest == 0 and plain


def test_no_leak_on_good_and_bad_input() -> None:
    """Reading the same good and bad payloads 3,000 times more leaves the process's memory where 300 times
    left it: nothing C builds (names, tags, Lines, line numbers) or drops on an error is kept."""
    good = "\n".join(PROCESS.replace("pid=101", f"pid={p}").format(v=f"{p}i", t=NOW) for p in range(40))
    bad = [b"\xff\xfe garbage", b"m,hostname=n1,type=node value=NaN 1", b"m,hostname=n1 value=1i 1", b""]
    payloads = [good.encode(), *(good.encode() + b"\n" + b + b"\n" + good.encode() for b in bad)]

    def once() -> None:
        for payload in payloads:
            read_compiled(payload, now=NOW)
        with contextlib.suppress(TypeError):  # an error on the way out leaves nothing behind either
            lp_read._place.read(b"x", 0, 1, 5)  # type: ignore[union-attr]
        with contextlib.suppress(RuntimeError):  # nor one in the middle of a payload
            lp_read._place.read(payloads[1], 0, 2**40, _fails_at(20))  # type: ignore[union-attr]

    assert_memory_flat(once)


# --- the switch -----------------------------------------------------------------------------------------------


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = (
        "from hpcbus.schemas.translate import lp_read; print(lp_read._place, lp_read.read_payload.__name__)"
    )
    assert printed_on_the_pure_path(code) == ["None", "read_pure"]


def test_version_lists_the_extension() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HPCBUS_PURE"}
    done = subprocess.run(
        [sys.executable, "-m", "hpcbus", "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "LP->Sonar read" in done.stdout.split("(compiled: ")[1].split(";")[0], done.stdout


def test_consume_sonar_reads_with_the_compiled_path() -> None:
    """`consume sonar --to sonar` reads each message with `read_payload`: the compiled path here."""
    from hpcbus.consumers.sonar import to_sonar

    assert to_sonar.read_payload is read_compiled
