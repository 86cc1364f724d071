"""The InfluxDB sink writes the same body on its compiled path (`_scan.c` keeps canonical lines as text,
`schemas/_influxdb.c` splices the cluster in) as on its pure path (`parse_payload`, `schemas.influxbody`'s
Python rules): byte for byte, line for line, in order, with the same log lines and counters.

Compared in one process (`InfluxSink(..., compiled=False)` is the pure path) on the node agent's messages
of every fixture tree, the corpus, generated lines (near-canonical and hostile), the fault suite's hostile
messages and measurements whose field type the sink learned from InfluxDB (the conflict path). The splice is
also given text items straight (what `scan` would never hand it), must hand an item it is not sure of to the
Python way, must take the usual line itself, and must not leak. `HPCBUS_PURE=1` switches it off.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from line_protocol_parser import LineFormatError, parse_line

from hpcbus.consumers.influx.sink import Batch, InfluxSink
from hpcbus.contract import BadInput
from hpcbus.influx.settings import InfluxSettings
from hpcbus.schemas import influxdb
from hpcbus.schemas.influxbody import Part, as_process
from hpcbus.schemas.influxdb import AGGS, KINDS, aggregate_processes, stable_types
from hpcbus.schemas.lineprotocol import Line, format_line, metric
from hpcbus.schemas.lineprotocol.scan import line_of
from tests.compiled_inputs import (
    LP_FILES,
    NOW,
    assert_memory_flat,
    fault_messages,
    lines,
    near_canonical,
    printed_on_the_pure_path,
)
from tests.node_fixtures import FIX, agent_messages
from tests.services import NatsServer

PROCESSES = ("aggregate", "full")
INTEGER = next(name for name, kind in KINDS.items() if kind is int)
"""A measurement the registry declares int (the field type conflict path learns float for it)."""


class Bus:
    def jetstream(self) -> None:
        return None


class Written(msgspec.Struct):
    """What a sink makes of some messages: the write body, the log lines, the counters."""

    body: list[str]
    logs: list[str]
    received: int
    rejected: int


def sink(compiled: bool, processes: str = "aggregate", learned: dict[str, type] | None = None) -> InfluxSink:
    settings = msgspec.convert({"processes": processes}, InfluxSettings)
    s = InfluxSink(Bus(), None, settings, "lab", "test", compiled=compiled)  # type: ignore[arg-type]
    s.types.update(learned or {})
    return s


def written(s: InfluxSink, batch: Batch) -> Written:
    body = s._body(batch)
    return Written(body, batch.logs, s.counters.received_lines, s.counters.rejected)


def through(
    messages: list[tuple[str, bytes]], processes: str = "aggregate", learned: dict[str, type] | None = None
) -> Written:
    """The messages taken by a compiled and a pure sink, their bodies asserted equal; the compiled one's."""
    out = []
    for compiled in (True, False):
        s = sink(compiled, processes, learned)
        for subject, data in messages:
            msg = type("Msg", (), {"subject": subject, "data": data, "reply": ""})()
            with contextlib.suppress(BadInput):  # the runner dead-letters what has bad lines; the good stay
                s.take(msg)  # type: ignore[arg-type]
        out.append(written(s, s.cut()))
    assert out[0] == out[1], [m[1][:300] for m in messages[:3]]
    return out[0]


def same(payload: bytes, subject: str = "lab.metrics") -> Written:
    """`payload` on both paths, in both process modes and with a learned type either way."""
    for processes in PROCESSES:
        result = through([(subject, payload)], processes)
    through([(subject, payload)], "aggregate", {INTEGER: float, "m": int, "cpu_load": int})
    return result


def given_items(
    items: list[str | Line], processes: str = "aggregate", learned: dict[str, type] | None = None
):
    """`items` as `scan` would keep them, straight into a compiled sink's batch, against the pure sink given
    the same lines (each text's `Line` read back as the pure path reads it)."""
    fast, pure = sink(True, processes, learned), sink(False, processes, learned)
    fast_batch = Batch(parts=[Part("lab", [], [], seq=7, items=items)])
    lines_ = [line_of(i) if type(i) is str else msgspec.structs.replace(i, tags=dict(i.tags)) for i in items]
    texts = [i if type(i) is str else "" for i in items]
    pure_batch = Batch(parts=[Part("lab", lines_, texts, seq=7)])
    result = written(fast, fast_batch)
    assert result == written(pure, pure_batch), items
    return result


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert influxdb.SPLICE is not None, "hpcbus.schemas._influxdb is not built (pip install -e . with gcc)"
    assert influxdb.FOLD is not None
    assert sink(True).bodies.splice is influxdb.SPLICE and sink(False).bodies.splice is None


# --- the node agent's messages ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(p.name for p in FIX.iterdir() if p.is_dir()))
def test_node_agent_messages(tmp_path: Path, case: str) -> None:
    messages = agent_messages(tmp_path, case)
    assert any(s.endswith(".metrics") for s, _ in messages)
    for processes in PROCESSES:
        result = through(messages, processes)
        assert len(result.body) > 20 and all(",cluster=lab" in text for text in result.body)
    through(messages, "aggregate", {name: float for name, kind in KINDS.items() if kind is int})


def test_the_usual_line_never_leaves_c() -> None:
    """The node agent's usual lines are spliced in C (the comparisons above test it), or go as they came when
    they carry the subject's cluster already; process lines to aggregate, a value of the other type and a
    line with another cluster go the Python way."""
    usual = [
        metric("cpu_user", 0.25, hostname="n001", time=NOW, type="hwthread", type_id="7"),
        metric("nv_util", 87.0, hostname="n001", time=NOW, type="accelerator", type_id="00000000:01:00.0"),
        metric(INTEGER, 12, hostname="n001", time=NOW, type="socket", type_id="0"),
        metric("cpu_user", -0.0, hostname="n001", time=NOW, type="core", type_id="1", job="4711"),
        metric("x", 1.5, hostname="n001", time=NOW, type="core", type_id="1", stype="disk", stype_id="sda"),
    ]
    python = [
        metric("cpu_user", 1.0, hostname="n1", time=NOW, type="core", type_id="1", stype="process"),
        metric(INTEGER, 1.5, hostname="n001", time=NOW, type="socket", type_id="0"),  # float for an int
        metric("cpu_user", 1.0, hostname="n1", time=NOW, type="core", type_id="1", cluster="other"),
    ]
    own = [metric("cpu_user", 1.0, hostname="n1", time=NOW, type="core", type_id="1", cluster="lab")]
    texts = [format_line(line) for line in usual + python]
    handed: list[object] = []
    out: list[str] = []
    assert influxdb.SPLICE is not None
    kept = format_line(own[0])
    influxdb.SPLICE([*texts, python[0], kept], ",cluster=lab", dict(KINDS), True, out, handed.append)
    assert handed == [*texts[len(usual) :], python[0]]
    assert out == [*(t.replace(",", ",cluster=lab,", 1) for t in texts[: len(usual)]), kept]
    given_items([*texts, python[0], kept])


def test_node_level_lines_never_leave_c() -> None:
    """Node-level lines of the bus shape (the node agent's: with the subject's cluster; cc-metric-collector's:
    without; a device's `type-id=<stype>`; tags in any order; any cluster tag) are written in C, as
    `format_line` writes them with `type-id=0` and the part's cluster."""
    lines = [
        metric("mem_used", 123456789.0, hostname="n001", time=NOW),
        metric("mem_used", 0.0, hostname="n001", time=NOW, cluster="lab"),
        metric("cpu_load", 1e-320, hostname="n001", time=NOW, cluster="other"),
        metric("cpu_load", 1e15, hostname="n001", time=NOW, arch="x86"),
        metric(INTEGER, -12, hostname="n001", time=NOW, stype="disk", stype_id="sda", type_id="disk"),
    ]
    texts = [format_line(line) for line in lines] + [
        f"cpu_load,type=node,hostname=n1 value=007.50 0{NOW}",
        f"cpu_load,hostname=n1,type=node value=-12345678901234567890123.5 {NOW}",
    ]
    expected = []
    for text in texts:
        line = line_of(text)
        tags = {**line.tags, "type-id": "0", "cluster": "lab"}
        expected.append(format_line(msgspec.structs.replace(line, tags=tags)))
    handed: list[object] = []
    out: list[str] = []
    assert influxdb.SPLICE is not None
    influxdb.SPLICE(texts, ",cluster=lab", dict(KINDS), True, out, handed.append)
    assert handed == []
    assert out == expected
    assert "cpu_load,cluster=lab,hostname=n1,type=node,type-id=0 value=7.5 " + str(NOW) in out
    given_items(texts)


# --- the corpus ---------------------------------------------------------------------------------------------


def test_the_corpus_has_line_protocol() -> None:
    assert len(LP_FILES) >= 8


@pytest.mark.parametrize("path", LP_FILES, ids=lambda p: p.name)
def test_corpus_file(path: Path) -> None:
    data = path.read_bytes()
    for subject in ("lab.metrics", "lab.events.job", "lab.log.x"):
        same(data, subject)
    same(data.replace(b"\n", b"\r\n"))


# --- generated and hostile input ----------------------------------------------------------------------------


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(near_canonical(), min_size=1, max_size=6), st.sampled_from(["\n", "\r\n"]))
def test_generated_near_canonical_lines(batch: list[str], end: str) -> None:
    same(end.join(batch).encode("utf-8", "surrogatepass"))


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=6))
def test_generated_lines(batch: list[str]) -> None:
    same("\n".join(batch).encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_generated_bytes(data: bytes) -> None:
    same(b"m,hostname=n1,type=core,type-id=1 value=1 1700000000\n" + data)


def readable(texts: list[str]) -> list[str]:
    """The texts `parse_line` reads with one `value` field (what `scan` could keep as text)."""
    out = []
    for text in texts:
        try:
            d = parse_line(text)
        except (LineFormatError, ValueError, UnicodeError):
            continue
        if d is None:  # a comment
            continue
        if list(d["fields"]) == ["value"] and type(d["fields"]["value"]) in (int, float) and d["time"]:
            out.append(text)
    return out


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(near_canonical(), lines()), min_size=1, max_size=8), st.sampled_from(PROCESSES))
def test_generated_texts_given_straight(batch: list[str], processes: str) -> None:
    """Any text `parse_line` reads, even one `scan` would never keep as text: the splice takes it only when
    the Python rules would forward it the same way."""
    texts = readable(batch)
    assume(texts)
    given_items(list(texts), processes)
    given_items(list(texts), processes, {INTEGER: float, "cpu_load": int, "m": int})


HOSTILE_TEXTS = [
    f"m,hostname=n1,type=core,type-id=1 value={number} {NOW}"
    for number in (
        "1u",
        "1e3",
        "1E3",
        "-1.5e-3",
        "+1",
        "00.5",
        "-0",
        "-0i",
        "9" * 18 + "i",
        "9" * 19 + "i",
        "1" * 64,
        "1" * 65,
        "1.",
        ".5",
        "t",
        "true",
        "NaN",
        "inf",
    )
] + [
    f"m,hostname=n1,type=node value=1 {NOW}",
    f"m,hostname=n1,type=core,type=node,type-id=1 value=1 {NOW}",
    f"m,hostname=n1,type=node,type=core,type-id=1 value=1 {NOW}",
    f"m,hostname=n1,stype=process,type=core,type-id=1 value=1 {NOW}",
    f"m,hostname=n1,stype=disk,stype=process,type=core,type-id=1 value=1 {NOW}",
    f"m,cluster=x,hostname=n1,type=core,type-id=1 value=1 {NOW}",
    f"m,hostname=n1,cluster=x,type=core,type-id=1 value=1 {NOW}",
    f"m,clusterx=x,hostname=n1,type=core,type-id=1 value=1 {NOW}",
    f"m,arch=x,hostname=n1,type=core,type-id=1 value=1 {NOW}",  # a key sorting before `cluster`
    f"m,value=x,hostname=n1,type=core,type-id=1 value=1 {NOW}",
    f"m\\ x,hostname=n1,type=core,type-id=1 value=1 {NOW}",
    f"m,hostname=n\\ 1,type=core,type-id=1 value=1 {NOW}",
    f'm,hostname="n1",type=core,type-id=1 value=1 {NOW}',
    f"m,hostname=n1,type=core,type-id=1 value=1 {NOW}\r",
    f"m,hostname=n1,type=core,type-id=1 value=1 {NOW} ",
    f"m,hostname=n1,type=core,type-id=1  value=1 {NOW}",
    f"m,hostname=n1,type=core,type-id=1 value=1 {NOW}000000000",
    f"m,hostname=n1,type=core,type-id=1 value=1 {'1' * 20}",
    f"m,hostname=n1,type=core,type-id=1 value=1,x=2 {NOW}",
    f"m,hostname=n1,type=core,type-id=1 x=1,value=2 {NOW}",
    "m,hostname=n1,type=core,type-id=1 value=1",
    f"m,hostname=n1,type=core,type-id=1,x={'y' * 1100} value=1 {NOW}",
    f"{'m' * 300},hostname=n1,type=core,type-id=1 value=1 {NOW}",
    f"m,hostname=n1,type=core,type-id=é value=1 {NOW}",
    f"m,hostname=n1,type=core,type-id=\ud800 value=1 {NOW}",
    f"m,hostname=n1,type=core,type-id=\x00 value=1 {NOW}",
    f"m,type=core,type-id=1 value=1 {NOW}",
    "",
    "m",
    "m,",
    "m,a=b value=1 1",
]


@pytest.mark.parametrize("processes", PROCESSES)
def test_hostile_texts_given_straight(processes: str) -> None:
    texts = readable(HOSTILE_TEXTS)
    assert len(texts) > 20
    given_items(list(texts), processes)
    given_items(list(texts), processes, {"m": int})
    handed: list[object] = []
    assert influxdb.SPLICE is not None
    influxdb.SPLICE(list(HOSTILE_TEXTS), ",cluster=lab", {}, True, [], handed.append)
    # the C took only the plain ones: 00.5, -0, 64 digits, the keys `clusterx`, `arch` and `value`, a ns
    # timestamp, a long measurement, no hostname, `m,a=b` (what the Python rules forward spliced as well),
    # the node-level line (written again with `type-id=0`)
    assert len(handed) == len(HOSTILE_TEXTS) - 11


def test_fault_suite_hostile_messages() -> None:
    """Every bad or hostile message of fault scenario 6 (garbage bytes, NaN, inf, past, future, 10,000 tags,
    a 1 MB line, 10,000-deep JSON) with its valid neighbour: the neighbour is written, equal on both paths."""
    for payload, _kind, good in fault_messages(int(time.time()), heavy=2):
        result = through([("lab.metrics", payload)])
        assert len(result.body) == good


def test_learned_types_either_way() -> None:
    """A measurement InfluxDB holds in the other type (`FieldTypes.learn`): its lines are written in the type
    learned on both paths (the C hands them to the Python way, which rewrites the value)."""
    payload = "".join(
        f"{name},hostname=n1,type=socket,type-id=0 value={value} {NOW}\n"
        for name, value in ((INTEGER, "5i"), (INTEGER, "5.0"), ("cpu_load", "2.5"), ("cpu_load", "3i"))
    ).encode()
    result = through([("lab.metrics", payload)], "aggregate", {INTEGER: float})
    assert f"{INTEGER},cluster=lab,hostname=n1,type=socket,type-id=0 value=5.0 {NOW}" in result.body
    result = through([("lab.metrics", payload)], "aggregate", {"cpu_load": int})
    assert f"cpu_load,cluster=lab,hostname=n1,type=socket,type-id=0 value=3i {NOW}" in result.body


def test_errors_raised_by_the_python_way_come_through() -> None:
    """`other` raising stops the call with its exception (no line lost silently, nothing leaked)."""

    def refuse(item: object) -> None:
        raise RuntimeError("refused")

    assert influxdb.SPLICE is not None
    with pytest.raises(RuntimeError, match="refused"):
        influxdb.SPLICE([f"m,hostname=n1,type=node value=1i {NOW}"], ",cluster=lab", {}, True, [], refuse)
    with pytest.raises(ValueError, match="ASCII"):
        influxdb.SPLICE([], ",cluster=é", {}, True, [], refuse)
    with pytest.raises(TypeError):
        influxdb.SPLICE((), ",cluster=lab", {}, True, [], refuse)


def test_no_leak() -> None:
    """Many calls on good, unusual and hostile items (and a failing `other`): the RSS stays where it was."""
    assert influxdb.SPLICE is not None
    splice = influxdb.SPLICE
    texts = [
        format_line(metric("cpu_user", i * 0.5, hostname="n1", time=NOW, type="hwthread", type_id=str(i)))
        for i in range(200)
    ] + HOSTILE_TEXTS
    items: list[object] = [*texts, metric("m", 1.0, hostname="n1", time=NOW)]
    kinds = dict(KINDS)

    def fail(item: object) -> None:
        raise KeyError(item)

    def once() -> None:
        out: list[str] = []
        splice(items, ",cluster=lab", kinds, True, out, lambda item: None)
        with contextlib.suppress(KeyError):
            splice(items, ",cluster=lab", kinds, False, [], fail)

    assert_memory_flat(once)


# --- process lines folded per job (`aggregate_processes`) in C -------------------------------------------------


def process(
    name: str,
    value: str,
    job: str = "4711",
    pid: int = 1,
    *,
    at: int = NOW,
    cmd: str = "a.out",
    more: str = "",
) -> str:
    """A process line as the node agent writes it (`stype-id=<job>/<pid>`, node-level, a cluster tag)."""
    return (
        f"{name},cluster=x,cmd={cmd},hostname=n1,job={job},pid={pid},ppid=1,stype=process,"
        f"stype-id={job}/{pid},type=node,type-id=process,user=u{more} value={value} {at}"
    )


def folded(items: list[str | Line], learned: dict[str, type] | None = None) -> list[str] | None:
    """`FOLD` of what `SPLICE` keeps of `items` (None: the pure path decides), asserted equal to the pure
    path's folded lines when it is not None."""
    types = {**KINDS, **(learned or {})}

    def read(item: str | Line) -> Line:
        return line_of(item) if type(item) is str else msgspec.structs.replace(item, tags=dict(item.tags))

    def other(item: str | Line) -> None:  # the sink's Python way with a process line: to fold
        line = read(item)
        if line.tags.get("stype") == "process":
            processes.append(as_process(line, "lab"))

    processes: list[object] = []
    assert influxdb.SPLICE is not None and influxdb.FOLD is not None
    influxdb.SPLICE(list(items), ",cluster=lab", types, True, [], other, processes)
    result = influxdb.FOLD(processes, types, AGGS)
    if result is not None:
        lines_ = [as_process(line, "lab") for line in map(read, items) if line.tags.get("stype") == "process"]
        assert result == [format_line(stable_types(line, types)) for line in aggregate_processes(lines_)]
    return result


def test_node_agent_process_lines_fold_in_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node agent's process lines (a `cmd` with a space among them, which `scan` keeps as a `Line`) are
    folded by the C on the compiled path, and the body is the pure path's."""
    from hpcbus.schemas import influxbody

    results: list[list[str] | None] = []
    fold = influxdb.FOLD
    assert fold is not None

    def recorded(*args: object) -> list[str] | None:
        results.append(fold(*args))  # type: ignore[arg-type]
        return results[-1]

    monkeypatch.setattr(influxbody, "FOLD", recorded)
    messages = [m for case in ("hpc", "slurm-cgroup-v2") for m in agent_messages(tmp_path, case)]
    assert sum(data.count(b"stype=process") for _, data in messages) > 50
    assert b"\\ <defunct>" in b"".join(data for _, data in messages)
    body = through(messages).body
    assert results and all(result is not None for result in results), results
    assert any(",stype=job," in text for text in body) and not any("stype=process" in t for t in body)


def test_process_lines_fold_as_the_pure_path_does() -> None:
    """Sums of ints and floats, averages and maxima (the registry's `agg`), many jobs and processes, single
    lines, two timestamps, a line of the Python way among them: folded by the C, equal to the pure path."""
    items: list[str | Line] = []
    for job in ("1", "2", "3@5"):
        for pid in range(1, 6):
            for at in (NOW, NOW + 30):
                items.append(process("process_rss", f"{pid * 1000}i", job, pid, at=at))
                items.append(process("process_cpu_avg", f"{pid}.1", job, pid, at=at))
                items.append(process("cpu_load", f"0.{pid}", job, pid, at=at))  # avg
                items.append(process("acc_temp", f"{40 + pid}.5", job, pid, at=at))  # max
                items.append(process("process_threads", f"{pid}i", job, pid, at=at, more=",type-x=1"))
                items.append(process("unregistered", f"-{pid}.25", job, pid, at=at))
    items.append(process("process_rss", "7i", "9", 9))  # a job of one process: its value as it came
    items.append(line_of(process("process_rss", "5i", "1", 99, cmd="a\\ b")))  # escaped: a `Line`
    items.insert(3, f"m,hostname=n1,type=core,type-id=1 value=1 {NOW}")  # not a process line
    result = folded(items)
    assert result is not None and len(result) == 3 * 2 * 6 + 1
    assert (
        f"process_rss,cluster=lab,hostname=n1,job=1,stype=job,stype-id=1,type=node,type-id=0,user=u value=15005i {NOW}"
        in result
    )
    for learned in (None, {"process_rss": float}, {"cpu_load": int}):
        given_items(items, "aggregate", learned)
        given_items(items, "full", learned)


HOSTILE_PROCESSES: list[list[str | Line]] = [
    [process("process_rss", "900000000000000000i", "1", pid) for pid in range(11)],  # beyond int64
    [process("process_rss", "5i", "1", 1), process("process_rss", "5.0", "1", 2)],  # an int and a float
    [process("process_rss", "5i").replace("stype-id=4711/1,", "")],  # no stype-id
    [process("process_rss", "5i").replace("stype-id=4711/1,", "stype-id=/1,")],  # an empty job key
    [process("process_rss", "5i").replace("stype-id=4711/1,", "stype-id=4711,")],  # no pid in it
    [process("process_rss", "5i").replace("stype-id=4711/1,", "stype-id=a/b/1,")],
    [process("process_rss", "5i").replace(",user=u", ",user=u,user=v")],  # a tag twice
    [process("process_rss", "5i").replace(",stype=process", ",stype=process,stype=disk")],
    [process("process_rss", "5i").replace("cluster=x,", "")],  # no cluster: the subject's added
    [process("process_rss", "5i").replace("type=node,type-id=process", "type=core,type-id=3")],
    [process("process_rss", "5i").replace(",type-id=process", "")],
    [process("process_rss", "5i").replace("hostname=n1", "hostname=n\\ 1")],  # an escape kept
    [process("process_rss", "5i", cmd="\\ x"), process("process_rss", "6i", pid=2, cmd="y\\,z")],
    [process("process_rss", "007i"), process("process_rss", "-0i", pid=2)],
    [process("process_cpu_avg", v, pid=p) for p, v in enumerate(("-0.0", "0.0", "-0", "00.5"))],
    [process("process_cpu_avg", "-0.0")],
    [process("process_cpu_avg", "0." + "0" * 62)],
    [process("process_cpu_avg", "9" * 64, pid=p) for p in range(3)],
    [process("process_cpu_avg", v, pid=p) for p, v in enumerate(("0.1", "0.2", "0.3", "1e16", "1", "-1e16"))],
    [process("cpu_load", f"{v}i", pid=p) for p, v in enumerate((2**53 // 3, 2**53 // 3, 2**53 // 3, 7))],
    [process("cpu_load", "3i", pid=p) for p in range(3)],  # an avg of ints: a float
    [process("acc_temp", v, pid=p) for p, v in enumerate(("0.0", "-0.0", "1.5", "1.50"))],  # max: the first
    [process("process_rss", "1.5"), process("process_rss", "2.5", pid=2)],  # floats for an int metric
    [process("process_rss", "5i", at=0), process("process_rss", "5i", at=10**17)],
    [process("process_rss", "5i").replace(f" {NOW}", f" 0{NOW}")],
    [process("process_rss", "5i", more=",x=" + "y" * 1000)],
    [process("process_rss", "5i", more="".join(f",t{i}=1" for i in range(40)))],
    [process("process_rss", "5i", job="j\u00e9")],
    [process("process_rss", "5i"), metric("m" * 5000, 1, hostname="n1", time=NOW, stype="process")],
    [process("process_rss", "5i"), metric("process_rss", 1, hostname="n" * 3000, time=NOW, stype="process")],
]


@pytest.mark.parametrize("texts", HOSTILE_PROCESSES, ids=range(len(HOSTILE_PROCESSES)))
def test_hostile_process_lines(texts: list[str | Line]) -> None:
    """What the C is not sure of goes to the pure path (the whole batch's process lines): equal bodies."""
    items = [t for t in texts if type(t) is not str or readable([t])]
    for learned in (None, {"process_rss": float, "process_cpu_avg": int, "cpu_load": int}):
        folded(items, learned)
        given_items(items, "aggregate", learned)
    payload = "\n".join(t if type(t) is str else format_line(t) for t in texts)
    through([("lab.metrics", payload.encode())])


def test_a_sum_beyond_float_is_refused_not_raised() -> None:
    """Two float values of an int metric that sum to inf: the line is refused and counted (the pure path's
    `stable_types` once raised OverflowError out of the body), on both paths alike."""
    texts = [process("process_rss", "8.98846567431158e+307", pid=p) for p in (1, 2)]
    texts.append(process("process_rss", "5i", job="2"))
    result = through([("lab.metrics", "\n".join(texts).encode())])
    assert result.rejected == 1 and len(result.body) == 1 and "value=5i" in result.body[0]


def test_unsure_folds_go_to_the_pure_path() -> None:
    assert folded(HOSTILE_PROCESSES[0]) is None  # an int sum beyond int64
    assert folded(HOSTILE_PROCESSES[1]) is None  # an int and a float in one group
    assert folded(HOSTILE_PROCESSES[3]) is None  # an empty job key
    assert folded(HOSTILE_PROCESSES[22], {"process_rss": int}) is None  # a float for an int
    assert folded(HOSTILE_PROCESSES[0][:9]) is not None  # below int64: the C's
    assert folded(HOSTILE_PROCESSES[12]) is not None  # escapes only in `cmd`, which is dropped


VALUES = st.one_of(
    st.integers(-(10**18) + 1, 10**18 - 1).map(lambda i: f"{i}i"),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
    st.sampled_from(["0.0", "-0.0", "5i", "1e400", "nan", "1u"]),
)


@st.composite
def process_texts(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["process_rss", "process_cpu_avg", "cpu_load", "acc_temp", "other"]))
    job = draw(st.sampled_from(["1", "2", "3@7", ""]))
    cmd = draw(st.sampled_from(["a", "a\\ b", "x"]))
    text = process(
        name, draw(VALUES), job, draw(st.integers(1, 4)), at=NOW + draw(st.integers(0, 1)), cmd=cmd
    )
    if draw(st.booleans()):
        text = text.replace("type=node,type-id=process", "type=core,type-id=2")
    return text


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(process_texts(), min_size=1, max_size=12))
def test_generated_process_lines(texts: list[str]) -> None:
    items: list[str | Line] = list(readable(texts))
    assume(items)
    folded(items)
    given_items(items, "aggregate")
    given_items(items, "aggregate", {"process_rss": float, "cpu_load": int})
    through([("lab.metrics", "\n".join(texts).encode())])


def test_fold_does_not_leak() -> None:
    """Many folds of good and unsure process lines (and `Line`s): the RSS stays where it was."""
    assert influxdb.SPLICE is not None and influxdb.FOLD is not None
    splice, fold = influxdb.SPLICE, influxdb.FOLD
    texts = [process("process_cpu_avg", f"{p}.5", str(p % 3), p) for p in range(50)]
    texts += [process("process_rss", f"{p}i", str(p % 3), p) for p in range(50)]
    kinds = dict(KINDS)
    batches = [texts, *HOSTILE_PROCESSES, [*texts, line_of(process("process_rss", "5i", cmd="a\\ b"))]]

    def once() -> None:
        for batch in batches:
            processes: list[object] = []
            splice(list(batch), ",cluster=lab", kinds, True, [], lambda item: None, processes)
            fold(processes, kinds, AGGS)
            fold([*processes, "x", (1, 2), metric("m", 1.0, hostname="n1", time=NOW)], kinds, AGGS)

    assert_memory_flat(once, warm=30, rounds=300)


# --- the switch -----------------------------------------------------------------------------------------------


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = (
        "from hpcbus.schemas import influxbody, influxdb; "
        "print(influxdb.SPLICE, influxbody.SPLICE, influxdb.FOLD, influxbody.FOLD, influxbody.Bodies().splice)"
    )
    assert printed_on_the_pure_path(code) == ["None"] * 5


def test_bench_lines_are_equal_on_both_paths() -> None:
    """`make bench` times the worker on these lines: its body is the same on both paths."""
    from bench.consumer import payloads

    result = through([("bench.metrics", data) for data in payloads(3000, "tp")])
    assert len(result.body) == 3000


def test_lines_carrying_the_subjects_cluster_go_as_they_came() -> None:
    """What the node agent sends (`cluster=` of the subject in every line) is forwarded as it came on both
    paths, in its own tag order and number text; another cluster, a node-level line, a value of the other
    type or a process line to aggregate is formatted with the subject's cluster (a second `cluster` tag never
    reaches the sink as a text: the parser refuses it)."""
    as_sent = [
        "cpu_user,cluster=lab,hostname=n1,type=hwthread,type-id=3 value=0.50 1700000000",
        "cpu_user,hostname=n1,type=hwthread,cluster=lab,type-id=3 value=2 1700000001",
        f"{INTEGER},cluster=lab,hostname=n1,type=socket,type-id=0 value=7i 1700000000",
    ]
    formatted = [
        "cpu_user,cluster=fox,hostname=n1,type=hwthread,type-id=3 value=0.5 1700000000",
        "mem_used,cluster=lab,hostname=n1,type=node value=5 1700000000",
        f"{INTEGER},cluster=lab,hostname=n1,type=socket,type-id=0 value=7.5 1700000000",
        "cpu_user,cluster=lab,hostname=n1,type=hwthread,type-id=3,stype=process,stype-id=9 value=1 1700000000",
    ]
    body = given_items([*as_sent, *formatted]).body
    for line in as_sent:
        assert line in body
    assert not [line for line in body if "cluster=fox" in line]
    assert len(body) == len(as_sent) + len(formatted)


@pytest.mark.services
def test_bench_agent_mix_row(nats_server: NatsServer) -> None:
    """`make bench`'s row on the node agent's metric messages asserts both paths' bodies equal, then times."""
    from bench.consumer import agent_mix_row

    row = agent_mix_row(nats_server.url, target=1000.0)
    assert "target <= 1000.00x: OK" in row and " node-level, " in row and "event lines, pure path" in row
