"""ClusterCockpit line protocol: corpus files, CC rules, lenient input, strict output, escaping round trips."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import (
    FormatError,
    Line,
    event,
    format_line,
    format_lines,
    metric,
    node_level_tags,
    parse_payload,
    to_seconds,
)
from hpcbus.schemas.names import DEVICE_TAGS, HOST_TAGS, measurement_problem
from tests.corpus import CORPUS

LP_DIR = CORPUS / "clustercockpit" / "lineprotocol"
NOW = 1_700_000_000

# file -> (number of accepted lines, {line number: (severity, path, reason fragment)}) — from PROVENANCE.md.
CORPUS_EXPECTED: dict[str, tuple[int, dict[int, tuple[str, str, str]]]] = {
    "cc-specifications-examples.lp": (
        4,
        {
            2: ("warning", "line", "unquoted event string"),
            3: ("warning", "line", "unquoted control string"),
        },
    ),
    "cc-backend-nats-job-events.lp": (1, {}),
    "cc-backend-nats-multiline-message.lp": (2, {}),
    "cc-backend-nats-nodestate-events.lp": (6, {}),
    "cc-backend-nats-edge-cases.lp": (
        4,
        {
            1: ("error", "tags hostname, type", "a metric needs a hostname tag and a type tag"),
            2: ("error", "fields", "no value/event/log/control field"),
            5: ("error", "line", "syntax"),
            8: ("error", "line", "syntax"),
        },
    ),
    "cc-lib-examples.lp": (5, {}),
    "cc-metric-store-classic-format.lp": (5, {}),
    "cc-metric-store-write-api-example.lp": (1, {}),
}


def test_every_corpus_file_is_listed() -> None:
    assert sorted(p.name for p in LP_DIR.glob("*.lp")) == sorted(CORPUS_EXPECTED)


@pytest.mark.parametrize("name", sorted(CORPUS_EXPECTED))
def test_corpus_file(name: str) -> None:
    accepted, expected = CORPUS_EXPECTED[name]
    parsed = parse_payload((LP_DIR / name).read_bytes(), now=NOW, place=name)
    assert len(parsed.lines) == accepted
    got = {p.line: (p.severity, p.path, p.reason) for p in parsed.problems}
    assert sorted(got) == sorted(expected)
    for number, (severity, path, fragment) in expected.items():
        assert got[number][0] == severity
        assert got[number][1] == path
        assert fragment in got[number][2]
        assert all(p.place == name for p in parsed.problems)
    # Whatever was accepted is written back as valid, canonical line protocol that parses cleanly.
    again = parse_payload(format_lines(parsed.lines), now=NOW)
    assert again.problems == []
    assert again.lines == parsed.lines


def test_spec_event_example_becomes_cc_backend_form() -> None:
    text = (LP_DIR / "cc-specifications-examples.lp").read_text().splitlines()[1]
    (line,) = parse_payload(text, now=NOW).lines
    assert line.kind == "event"
    assert line.tags["function"] == "stop_job"
    assert line.fields["event"].startswith('{"jobId": 69,')
    out = format_line(line)
    assert out.startswith(
        'job,function=stop_job,hostname=mngmt02,type=node,type-id=0 event="{\\"jobId\\": 69,'
    )
    assert out.endswith(" 1740027951")


def test_control_spec_example_keeps_method_and_string() -> None:
    text = (LP_DIR / "cc-specifications-examples.lp").read_text().splitlines()[2]
    (line,) = parse_payload(text, now=NOW).lines
    assert line.kind == "control"
    assert line.fields == {"control": "intel.pkg.energy_status"}
    assert format_line(line) == (
        'rapl,hostname=e1208,method=GET,type=socket,type-id=2 control="intel.pkg.energy_status" 1740027951'
    )


def test_cclib_start_job_measurement_is_rewritten() -> None:
    parsed = parse_payload('start_job,hostname=m1 event="{}" 1700000000000000000', now=NOW)
    (line,) = parsed.lines
    assert (line.measurement, line.tags["function"], line.time) == ("job", "start_job", 1_700_000_000)
    assert [p.severity for p in parsed.problems] == ["warning"]


def test_bad_line_never_drops_its_neighbours() -> None:
    payload = (
        b"cpu_load,hostname=n1,type=node value=1.5 1700000000\r\n"
        b"\n# a comment\n"
        b"this is not line protocol\n"
        b"mem_used,hostname=n1,type=node value=\xff\xfe 1700000000\n"
        b"mem_used,hostname=n1,type=node value=42i 1700000001\n"
    )
    parsed = parse_payload(payload, now=NOW, place="fox.metrics")
    assert [(ln.measurement, ln.fields["value"], ln.time) for ln in parsed.lines] == [
        ("cpu_load", 1.5, 1_700_000_000),
        ("mem_used", 42, 1_700_000_001),
    ]
    assert [(p.line, p.kind) for p in parsed.errors] == [(4, "lp"), (5, "lp")]
    assert "not UTF-8" in parsed.errors[1].reason
    assert str(parsed.errors[0]).startswith("fox.metrics:4: lp: line: syntax:")


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("m,type=node value=1", "tag hostname", "needs a hostname"),
        ("m,hostname=a value=1", "tag type", "needs a type tag"),
        ("m,hostname=a,type=rack value=1", "tag type", "unknown type 'rack'"),
        ("m,hostname=a,type=core value=1", "tag type-id", "type=core needs a type-id"),
        ('m,hostname=a,type=node value="x"', "field value", "must be a number"),
        ("m,hostname=a,type=node value=true", "field value", "must be a number"),
        ("job,function=start_job event=1", "field event", "must be a string"),
        ('rapl,hostname=a,type=node control="x"', "tag method", "GET or PUT"),
        ('m,hostname=a,type=node value=1,event="x"', "field event", "one kind field"),
        ("m,hostname=a,type=node value=1 -5", "timestamp", "negative"),
    ],
)
def test_cc_rules(text: str, path: str, fragment: str) -> None:
    parsed = parse_payload(text, now=NOW)
    assert parsed.lines == []
    (problem,) = parsed.errors
    assert problem.path == path
    assert fragment in problem.reason


def test_node_level_bus_form_and_host_alias() -> None:
    parsed = parse_payload("m,host=a,type=node value=1", now=NOW)
    (line,) = parsed.lines
    assert line.tags == {"hostname": "a", "type": "node"}  # the node level has no type-id on the bus
    assert line.time == NOW  # no timestamp: arrival time
    assert [p.path for p in parsed.problems] == ["tag host"]


def test_node_level_lines_are_read_in_their_bus_form() -> None:
    """`type=node,type-id=0` (cc-metric-collector with a type-id, older hpcbus) loses the type-id, a device
    below the node gets its `stype` as type-id; the text is kept only for a line already in that form."""
    text = (
        f"a,hostname=n,type=node value=1 {NOW}\n"
        f"b,hostname=n,type=node,type-id=0 value=2 {NOW}\n"
        f"c,hostname=n,stype=network,stype-id=eth0,type=node value=3 {NOW}\n"
        f"d,hostname=n,stype=disk,stype-id=sda,type=node,type-id=disk value=4 {NOW}\n"
        f"e,hostname=n,type=hwthread,type-id=0 value=5 {NOW}\n"
        f'ev,hostname=n,type=node event="x" {NOW}\n'
    )
    parsed = parse_payload(text, now=NOW)
    assert [ln.tags.get("type-id") for ln in parsed.lines] == [None, None, "network", "disk", "0", "0"]
    assert [bool(t) for t in parsed.texts] == [True, False, False, True, True, False]
    assert [format_line(ln) for ln in parsed.lines[:4]] == [
        f"a,hostname=n,type=node value=1.0 {NOW}",
        f"b,hostname=n,type=node value=2.0 {NOW}",
        f"c,hostname=n,stype=network,stype-id=eth0,type=node,type-id=network value=3.0 {NOW}",
        f"d,hostname=n,stype=disk,stype-id=sda,type=node,type-id=disk value=4.0 {NOW}",
    ]


@pytest.mark.parametrize(
    ("ts", "seconds"),
    [
        (1_740_027_951, 1_740_027_951),
        (1_740_027_951_123, 1_740_027_951),
        (1_740_027_951_123_456, 1_740_027_951),
        (1_740_027_951_123_456_789, 1_740_027_951),
        (123_456_789, 123_456_789),
    ],
)
def test_timestamp_precision_by_magnitude(ts: int, seconds: int) -> None:
    assert to_seconds(ts) == seconds
    (line,) = parse_payload(f"m,hostname=a,type=node value=1 {ts}", now=NOW).lines
    assert line.time == seconds


def test_formatter_types_stay_stable() -> None:
    line = Line("m", {"hostname": "a"}, {"f": 1.0, "i": 3, "u": 2**64 - 1, "b": True, "s": 'q"\\'}, 5)
    assert format_line(line) == 'm,hostname=a f=1.0,i=3i,u=18446744073709551615u,b=true,s="q\\"\\\\" 5'


@pytest.mark.parametrize(
    "bad",
    [
        Line("", {}, {"value": 1.0}, 1),
        Line("m", {"a\nb": "c"}, {"value": 1.0}, 1),
        Line("m", {}, {"value": math.nan}, 1),
        Line("m", {}, {"value": 2**64}, 1),
        Line("m", {}, {}, 1),
        Line("m", {"a": "b\\"}, {"value": 1.0}, 1),
    ],
)
def test_formatter_refuses_what_line_protocol_cannot_hold(bad: Line) -> None:
    with pytest.raises(FormatError):
        format_line(bad)


def test_formatter_omits_empty_tags_and_sorts() -> None:
    line = metric(
        "cpu_used", 12.5, hostname="n 1", time=7, type="hwthread", type_id="3", stype="", cluster="fox"
    )
    assert format_line(line) == r"cpu_used,cluster=fox,hostname=n\ 1,type=hwthread,type-id=3 value=12.5 7"
    ev = event("job", '{"jobId":1}', time=7, function="start_job")
    assert format_line(ev) == r'job,function=start_job event="{\"jobId\":1}" 7'


def test_newline_in_string_field_is_escaped_not_raw() -> None:
    line = Line("ccb", {"loglevel": "info"}, {"log": "a\nb"}, 1)
    text = format_line(line)
    assert "\n" not in text
    (back,) = parse_payload(text, now=NOW).lines
    assert back.fields["log"] == "a\\nb"  # documented: newlines in strings travel as the two characters \n


# Hypothesis: names with every character that needs escaping. Excluded by construction: newlines and a
# trailing backslash (not representable), and a backslash right before `,`, `=`, space or another backslash
# (InfluxDB and line_protocol_parser read those differently; the formatter follows InfluxDB).
_AMBIGUOUS = re.compile(r"\\([,= \\]|$)")


def _unambiguous(name: str) -> bool:
    return _AMBIGUOUS.search(name) is None and not name.startswith("#") and name.strip() == name


_SPECIAL = st.sampled_from([",", "=", " ", "\\", '"', "é", "x", "_", "-", ".", "/", "#"])
_name = st.text(
    alphabet=st.one_of(_SPECIAL, st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp"))),
    min_size=1,
    max_size=12,
).filter(_unambiguous)
_value = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.booleans(),
    st.text(alphabet=st.one_of(_SPECIAL, st.characters(exclude_categories=("Cc", "Cs"))), max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(
    # names `schemas.names` refuses as measurements (`/`, `.`, white space, ...) have their own tests
    measurement=_name.filter(lambda name: measurement_problem(name) is None),
    tags=st.dictionaries(_name, _name, max_size=4),
    fields=st.dictionaries(_name, _value, min_size=1, max_size=4),
    time=st.integers(min_value=0, max_value=4_999_999_999),
)
def test_format_parse_round_trip(measurement: str, tags: dict, fields: dict, time: int) -> None:
    fields = {"value": 1.0, **fields} if "value" not in fields else fields
    fields["value"] = 1.0 if not isinstance(fields["value"], float) else fields["value"]
    for k in ("event", "log", "control"):
        fields.pop(k, None)
    # tags `schemas.names` reads as names (host, cluster, job, device ids) have their own tests; here any
    # other text
    tags = {k: v for k, v in tags.items() if k not in (*HOST_TAGS, *DEVICE_TAGS, "cluster", "job")}
    tags = {**tags, "hostname": "h", "type": "node"}
    node_level_tags(tags)  # a generated `stype` makes it a device below the node
    line = Line(measurement, tags, fields, time)
    parsed = parse_payload(format_line(line) + "\n", now=NOW)
    assert parsed.errors == []
    (back,) = parsed.lines
    assert back.measurement == line.measurement
    assert back.tags == line.tags
    assert back.time == line.time
    assert set(back.fields) == set(line.fields)
    for key, val in line.fields.items():
        got = back.fields[key]
        if isinstance(val, float):
            expected = 0.0 if abs(val) < 2.2250738585072014e-308 else val  # documented flush of subnormals
            assert got == expected and type(got) is float
        elif isinstance(val, str):
            assert got == val.replace("\n", "\\n")
        else:
            assert got == val and type(got) is type(val)
