"""The compiled sacct reader (`schemas/slurm/sacct/_sacct.c`) gives what the pure path gives, row for row.

`parse_sacct` (C for the lines it is sure of, the pure parser for every other line) must equal
`parse_sacct_pure`: the same rows (equal, and of equal types, so an int is never a float and every timestamp
keeps its offset and zone) and the same problems, on the corpus, on generated lines (plausible and hostile) and on
hand-picked hostile ones; `to_slurm_job` (C for the default form) must equal `to_slurm_job_pure`, records or
the error raised. These tests need the extension built (`pip install -e .` with a compiler: setup.py) and
say so when it is not; `HPCBUS_PURE=1` must switch it off.
"""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.slurm_corpus import corpus_files
from hpcbus.schemas.native import implementation
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, SacctRow, compiled, parse_sacct, to_slurm_job
from hpcbus.schemas.slurm.sacct.columns import Plan
from hpcbus.schemas.slurm.sacct.parse import parse_sacct_pure
from hpcbus.schemas.slurm.sacct.render import to_slurm_job_pure
from hpcbus.schemas.slurm.values import JobId
from tests.compiled_inputs import printed_on_the_pure_path
from tests.corpus import HB_JOBINFO_FIELDS

CET_2 = timezone(timedelta(hours=2), "CET")
ZONES: list[tzinfo] = [
    CET_2,
    timezone(timedelta(hours=2)),
    UTC,
    timezone(timedelta(hours=-3, minutes=-30)),
    timezone(timedelta(hours=5, minutes=30, seconds=15)),
    ZoneInfo("Europe/Oslo"),
]
"""Fixed offsets (named, unnamed, UTC, negative, with seconds) and a zone with DST (the `replace` path)."""


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert compiled.native is not None, (
        "hpcbus.schemas.slurm.sacct._sacct is not built (pip install -e . with gcc)"
    )
    assert compiled.RENDERER is not None
    assert "sacct reader" in implementation()


def test_pure_switch() -> None:
    """`HPCBUS_PURE=1` runs the pure path: no extension, and `--version`'s words say so."""
    code = (
        "from hpcbus.schemas.slurm.sacct import compiled, render; from hpcbus.schemas.native import "
        "implementation; print(compiled.native is None, render._render is None, implementation())"
    )
    assert printed_on_the_pure_path(code) == ["True", "True", "pure", "Python:", "HPCBUS_PURE=1"]


# --- the comparison -----------------------------------------------------------------------------------------


def typed(value: Any) -> Any:
    """`value` with what `==` does not compare: every type (an int is no float, True no 1), a datetime's
    offset text, zone name and fold."""
    if isinstance(value, msgspec.Struct):
        return type(value).__name__, tuple(typed(v) for v in msgspec.structs.astuple(value))
    if isinstance(value, dict):
        return "dict", sorted((typed(k), typed(v)) for k, v in value.items())
    if isinstance(value, list):
        return "list", [typed(v) for v in value]
    if isinstance(value, datetime):
        return "datetime", value.isoformat(), value.tzname(), value.fold
    return type(value).__name__, repr(value)


def same_row(fast: SacctRow | Problem, pure: SacctRow | Problem) -> None:
    assert fast == pure
    assert typed(fast) == typed(pure)


def same_record(row: SacctRow) -> None:
    """`to_slurm_job` (compiled when it can) equals `to_slurm_job_pure`: the record, or the error."""
    try:
        pure = to_slurm_job_pure(row)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            to_slurm_job(row)
        assert str(raised.value) == str(error)
        return
    fast = to_slurm_job(row)
    assert fast == pure
    assert typed(fast) == typed(pure)


def same(
    text: str,
    fields: Sequence[str] = SACCT_FIELDS,
    tz: tzinfo = CET_2,
    delimiter: str = "|",
    trailing: bool = False,
) -> list[SacctRow | Problem]:
    """Both parsers on `text` (as one string and as lines), asserted equal, and every row rendered by both."""
    kw: dict[str, Any] = {"delimiter": delimiter, "trailing_delimiter": trailing, "place": "sacct"}
    for form in (text.splitlines(keepends=True), text):  # the text last: its result is returned
        pure = list(parse_sacct_pure(form, fields, tz, **kw))
        fast = list(parse_sacct(form, fields, tz, **kw))
        assert len(fast) == len(pure), text[:300]
        for a, b in zip(fast, pure, strict=True):
            same_row(a, b)
    for item in pure:
        if isinstance(item, SacctRow):
            same_record(item)
    return pure


def left_to_pure(text: str, fields: Sequence[str], delimiter: str = "|", trailing: bool = False) -> int:
    """How many non-empty lines of `text` the C reader does not read itself."""
    assert compiled.native is not None
    plan = compiled.row_plan(Plan(fields, CET_2), delimiter, trailing)
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line and compiled.native.row(plan, line, number) is None:
            count += 1
    return count


# --- the corpus ---------------------------------------------------------------------------------------------

FILES = corpus_files()


@pytest.mark.parametrize("tz", ZONES, ids=str)
@pytest.mark.parametrize("index", range(len(FILES)), ids=lambda i: FILES[i].path.name)
def test_corpus_file(index: int, tz: tzinfo) -> None:
    f = FILES[index]
    items = same(f.text, f.fields, tz, f.delimiter, f.trailing)
    assert items and all(isinstance(i, SacctRow) for i in items)
    same(f.text.replace("\n", "\r\n"), f.fields, tz, f.delimiter, f.trailing)


@pytest.mark.parametrize("index", range(len(FILES)), ids=lambda i: FILES[i].path.name)
def test_corpus_lines_are_read_by_c(index: int) -> None:
    """Every corpus line is read by the C code itself, and every row rendered by it: the comparisons above
    test the compiled path, not the pure one twice."""
    f = FILES[index]
    assert left_to_pure(f.text, f.fields, f.delimiter, f.trailing) == 0
    assert compiled.native is not None
    for row in parse_sacct(f.text, f.fields, CET_2, delimiter=f.delimiter, trailing_delimiter=f.trailing):
        assert isinstance(row, SacctRow)
        assert compiled.native.render(compiled.RENDERER, row) is not None


def test_header_and_blank_lines() -> None:
    f = FILES[0]
    header = "|".join(f.fields)
    text = f"{header}\n\n{f.text}\n\r\n{header.lower()}\n"
    assert len(same(text, f.fields)) == len(same(f.text, f.fields))
    hb = FILES[2]
    same("☃".join(hb.fields) + "☃\n" + hb.text, hb.fields, CET_2, "☃", True)


# --- hostile lines ------------------------------------------------------------------------------------------

GOOD = FILES[0].text.splitlines()[0].split("|")
"""A real row of Sonar's field list (SACCT_FIELDS), to change one column of."""


def with_column(name: str, value: str) -> str:
    parts = list(GOOD)
    parts[SACCT_FIELDS.index(name)] = value
    return "|".join(parts)


HOSTILE_VALUES: dict[str, list[str]] = {
    "Start": [
        "2024-13-01T00:00:00",
        "2024-02-30T10:00:00",
        "2023-02-29T10:00:00",
        "2024-02-29T10:00:00",
        "2024-01-01T24:00:00",
        "2024-01-01T23:60:00",
        "2024-01-01T23:59:60",
        "0000-01-01T00:00:00",
        "0001-01-01T00:00:00",
        "9999-12-31T23:59:59",
        "2024-W01-1T00:00:00",
        "2024-01-01 00:00:00",
        "2024-01-01T00:00:0x",
        "2024-01-01T0:00:000",
        "\uff12024-01-01T00:00:00",
        "2024-01-01T00:00",
        "Unknown",
        "None",
        "unknown",
    ],
    "AveCPU": [
        "1-2:3",
        "99:99",
        "1:60",
        "1:59:00",
        "1:60:00",
        "1-24:00:00",
        "1-23:59:59",
        "00:00.1234567890123456789",
        "00:00.123456789012345",
        "00:00.000",
        "59:59.999",
        "123456789012:00",
        "9" * 5000 + ":00",
        "9" * 400 + "-00:00:00.5",
        "9" * 400 + ":00.5",
        "1-",
        ":00",
        "00:",
        "1:2:3:4",
        "1.5:00",
        "-1:00",
        "Unknown",
        "\uff11:00",
    ],
    "MaxRSS": [
        "1e3M",
        "0.5",
        "1.M",
        ".5M",
        "99999999999999999999K",
        "9223372036854775807P",
        "8796093022207P",
        "8796093022208P",
        "1" * 400 + ".5M",
        "123456789012345.6P",
        "1234567890123456.7P",
        "0.00000000000001K",
        "4.9999999999999999999M",
        "-1K",
        "12X",
        "12k",
        "0",
        "1",
        "1024",
        "1025",
        "Unknown",
    ],
    "ReqMem": ["4000Mc", "4000Mn", "4000Mx", "4.5Gc", "c", "Unknown", "0n", "99999999999999999999Mc"],
    "State": [
        "CANCELLED by ",
        "CANCELLED by 0",
        "cancelled",
        "RUNNING by 99999999999999999999",
        "CANCELLED  by 5",
        "_X",
        "A",
        "OUT_OF_MEMORY",
        "CANCELLED by 12 ",
    ],
    "JobID": [
        "123_[1-5%2]",
        "123_[]",
        "123_[1[2]",
        "123_[1-3].batch",
        "123_[1-3]x",
        "123+",
        "123+0",
        "12.3+4",
        "1_2.ba-tch",
        "1_2.",
        "٣",
        "99999999999999999999",
        "0",
        "123_4_5",
        "123_é",
        "123_[é]",
    ],
    "JobIDRaw": ["123.batch", "123.", "123.a.b", "x", "0", "99999999999999999999.1", "123.+_A9"],
    "ExitCode": ["0:0", "1:0", "0:15", "1", ":0", "0:", "99999999999999999999:0", "1:2:3"],
    "TimelimitRaw": ["UNLIMITED", "Partition_Limit", "unlimited", "99999999999999999999", "-1", "1.5"],
    "NodeList": [
        "c1-[1-3,5]",
        "c1-[1-3,5],gpu-1",
        "c1-[",
        "a,,b",
        ",a",
        "a,",
        "]",
        "c[1-2]x[3]",
        "c[1-2][3-4]",
        "c[a]",
        "c[1-]",
        "c[-1]",
        "c[1,]",
        "None assigned",
        "none assigned",
        "nød1",
        "c[1-2],nød[3]",
    ],
    "ElapsedRaw": ["Unknown", "99999999999999999999", "-1", "1.0", "٣"],
    "Priority": ["0", "4294967295", "99999999999999999999"],
    "ReqCPUS": ["", "0", "Unknown"],
    "Submit": ["Unknown", "None", ""],
    "JobName": ["a|b|c", "", "Unknown", "naïve ☃", "\ufffd\ufffd"],
    "User": ["Unknown", "", "é"],
    "Account": ["Unknown", "", "unknown"],
    "Reservation": ["Unknown", "", "maint"],
    "AllocTRES": ["billing=6,cpu=6", "x", "é=1"],
}


@pytest.mark.parametrize(
    ("column", "value"), [(c, v) for c, values in HOSTILE_VALUES.items() for v in values]
)
def test_hostile_value(column: str, value: str) -> None:
    """One odd value in an otherwise good row (and then a good row): the same row or Problem either way."""
    good = "|".join(GOOD)
    same(f"{with_column(column, value)}\n{good}\n")
    for tz in ZONES[2:]:
        same(with_column(column, value), tz=tz)


HOSTILE_LINES = [
    "",
    "|",
    "||||",
    "|".join(GOOD[:-2]),
    "|".join(GOOD) + "|",
    "|".join(GOOD) + "|extra|parts",
    "|".join(GOOD[:-1]),
    "|".join(["", *GOOD[1:]]),
    "|".join(["", "", *GOOD[2:]]),
    "|".join(GOOD).replace("|", "||", 1),
    "\ufffd".join(GOOD),
    "|".join(GOOD) + "\udcff",
    "\udcff" + "|".join(GOOD),
    "|".join(GOOD) + "\x85tail",
    "|".join(GOOD) + "\u2028" + "|".join(GOOD),
    "|".join(GOOD) + "\x0b" + "|".join(GOOD),
    "|".join(GOOD) + "\r" + "|".join(GOOD),
    "\x00" + "|".join(GOOD),
    " " + "|".join(GOOD),
    "JobID|JobIDRaw",
    "jobid|" + "|".join(GOOD[1:]),
    "x" * 10000,
    "|" * 10000,
]


@pytest.mark.parametrize("line", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_hostile_line(line: str) -> None:
    good = "|".join(GOOD)
    same(f"{good}\n{line}\n{good}")
    same(line)


def test_wrong_field_counts_with_trailing_delimiter() -> None:
    hb = FILES[2]
    lines = hb.text.splitlines()
    cases = [
        lines[0][:-1],  # no trailing delimiter
        lines[0] + "☃",  # one field too many (Comment, free text, is last: joined)
        lines[0][: lines[0].index("☃")],  # one field
        "☃",
        "☃☃",
        lines[0].replace("☃", "☃☃", 3),
        lines[0].replace("☃", "|"),
    ]
    for case in cases:
        same(f"{lines[1]}\n{case}\n{lines[2]}", hb.fields, CET_2, "☃", True)


def test_empty_and_truncated_input() -> None:
    assert same("") == []
    assert same("\n\n\r\n") == []
    text = FILES[1].text
    for cut in (1, 17, len(text) // 2, len(text) - 3):
        same(text[:cut])


def test_extra_columns_and_other_field_lists() -> None:
    """Columns the parser has no field for land in `extra`; aliases and a free-text column not last."""
    fields = ["JobIDRaw", "Comment", "NCPUS", "Unknowncol", "Timelimit", "JobName"]
    same("12|hello|4|x|1-00:00:00|name|with|bars\n13||Unknown||UNLIMITED|\n14|a|1|b|00:30.5|c", fields)
    same("12|hello|4|x", ["JobIDRaw", "JobName", "AllocCPUS", "Zzz"])
    same("1|2", ["JobName", "User"])  # no job id column: every line a Problem
    same("5|6", ["Comment", "JobIDRaw"])  # Comment is free text but not last
    wide = ["JobIDRaw", *(f"x{i}" for i in range(400))]  # more columns than the C reader takes
    assert compiled.native is not None and len(wide) > compiled.native.MAX_COLUMNS
    same("|".join(["5", *map(str, range(400))]), wide)
    assert isinstance(
        same("5|bob|more", ["JobIDRaw", "User"])[0], Problem
    )  # too many parts, User not free text


# --- rows built by hand (the renderer's own checks) -----------------------------------------------------------

WHEN = datetime(2024, 11, 13, 11, 8, tzinfo=CET_2)

HAND_ROWS = [
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN),
    SacctRow(job_id_raw=0, state="RUNNING", submit=WHEN),
    SacctRow(job_id_raw=5, state="", submit=WHEN),
    SacctRow(job_id_raw=5, state="RUNNING"),
    SacctRow(state="RUNNING", submit=WHEN),
    SacctRow(job=JobId(7, "batch", 3), state="RUNNING", submit=WHEN),
    SacctRow(job=JobId(7, "", None, "1-5%2"), state="PENDING", submit=WHEN),
    SacctRow(job=JobId(7, "0", None, "", 0), state="RUNNING", submit=WHEN),
    SacctRow(job=JobId(7, "0", None, "", 2), job_id_raw=9, step_raw="x", state="RUNNING", submit=WHEN),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN.replace(microsecond=5)),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN.replace(tzinfo=None)),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN.replace(tzinfo=ZoneInfo("Europe/Oslo"))),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN.replace(tzinfo=UTC), end=WHEN, start=WHEN),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN.replace(year=999)),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, time_limit=-1),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, time_limit=True),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, time_limit="UNLIMITED"),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, time_limit=2**80),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, priority=-3),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, priority=2**80),
    SacctRow(job_id_raw=2**80, state="RUNNING", submit=WHEN),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, suspended=float("nan")),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, user_cpu=float("inf")),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, user_cpu=-0.7, ave_cpu=1e300, min_cpu=0.49),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, node_list="c1-[1-3],c2", req_mem_kib=5),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, node_list="c1-[1-3", req_mem_per_cpu=True),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, node_list="nød[1-2],x"),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, job_name="Unknown", user="Unknown", account="a"),
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, alloc_tres="cpu=1", max_rss=0, ave_rss=7),
    SacctRow(job_id_raw=5, state=7, submit=WHEN),  # type: ignore[arg-type]
    SacctRow(job_id_raw=5, state="RUNNING", submit="2024"),  # type: ignore[arg-type]
    SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN, exit_status=True),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("row", HAND_ROWS, ids=range(len(HAND_ROWS)))
def test_hand_built_row(row: SacctRow) -> None:
    try:
        to_slurm_job_pure(row)
    except (ValueError, TypeError, AttributeError, OverflowError) as error:
        with pytest.raises(type(error)) as raised:
            to_slurm_job(row)
        assert str(raised.value) == str(error)
        return
    same_record(row)


def test_the_other_forms_are_the_pure_ones() -> None:
    """`sonar_compat`, a zone or requested resources: the pure renderer (the compiled one does the default)."""
    for row in parse_sacct(FILES[0].text, SACCT_FIELDS, CET_2):
        assert isinstance(row, SacctRow)
        assert to_slurm_job(row, sonar_compat=True) == to_slurm_job_pure(row, sonar_compat=True)
        assert to_slurm_job(row, UTC) == to_slurm_job_pure(row, UTC)
        resources = {str(row.job_id): "cpu=1"}
        assert to_slurm_job(row, requested_resources=resources) == to_slurm_job_pure(
            row, requested_resources=resources
        )


def test_stamps_of_many_zones_interleaved() -> None:
    """The renderer remembers recent timestamps' texts: rows of different zones, mixed, keep their own."""
    texts = [FILES[0].text, FILES[1].text]
    rows = [
        item
        for tz in ZONES
        for text in texts
        for item in parse_sacct(text, SACCT_FIELDS, tz)
        if isinstance(item, SacctRow)
    ]
    for row in rows[::3] + rows[1::3] + rows[2::3]:
        same_record(row)


# --- generated lines ----------------------------------------------------------------------------------------

DIGITS = st.text("0123456789", min_size=1, max_size=20)
ODD = st.sampled_from(
    ["", "Unknown", "None", "é", "☃", "|", "\ufffd", "-", ".", ":", "[", "]", ",", " ", "\t"]
)
SMALL = st.integers(0, 99).map(lambda i: f"{i:02}")


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    y = draw(st.integers(0, 10000))
    parts = [draw(st.integers(0, 70)) for _ in range(5)]
    return f"{y:04}-{parts[0]:02}-{parts[1]:02}T{parts[2]:02}:{parts[3]:02}:{parts[4]:02}"


@st.composite
def durations(draw: st.DrawFn) -> str:
    text = ":".join(draw(st.lists(SMALL | DIGITS, min_size=1, max_size=4)))
    if draw(st.booleans()):
        text = f"{draw(DIGITS)}-{text}"
    if draw(st.booleans()):
        text += "." + draw(DIGITS)
    return text


SIZES = st.builds(
    lambda n, frac, suffix, per: n + frac + suffix + per,
    DIGITS,
    st.one_of(st.just(""), DIGITS.map(lambda d: "." + d)),
    st.sampled_from(["", "K", "M", "G", "T", "P", "X"]),
    st.sampled_from(["", "", "n", "c"]),
)
JOB_IDS = st.builds(
    lambda base, mid, step: base + mid + step,
    DIGITS,
    st.one_of(
        st.just(""),
        DIGITS.map(lambda d: "_" + d),
        DIGITS.map(lambda d: "+" + d),
        st.text("0123456789-%,", min_size=0, max_size=6).map(lambda t: f"_[{t}]"),
    ),
    st.one_of(st.just(""), st.sampled_from([".batch", ".extern", ".0", ".", ".a-b", ".+_9"])),
)
NODE_LISTS = st.lists(
    st.one_of(
        st.sampled_from(["c1", "gpu-1", "n", "None assigned", "", "é"]),
        st.builds(lambda p, a, b: f"{p}[{a}-{b}]", st.sampled_from(["c", "c1-", ""]), DIGITS, DIGITS),
        st.builds(
            lambda p, a, b: f"{p}[{a},{b}]", st.sampled_from(["c", "x"]), DIGITS, st.sampled_from(["", "1-"])
        ),
    ),
    min_size=1,
    max_size=4,
).map(",".join)
STATES = st.one_of(
    st.sampled_from(["COMPLETED", "RUNNING", "PENDING", "OUT_OF_MEMORY", "cancelled", "_X"]),
    DIGITS.map(lambda d: f"CANCELLED by {d}"),
)

KIND_VALUES: dict[str, st.SearchStrategy[str]] = {
    "jobid": JOB_IDS,
    "jobidraw": JOB_IDS,
    "time": timestamps() | st.sampled_from(["Unknown", "None"]),
    "duration": durations() | st.just("Unknown"),
    "size": SIZES | st.just("Unknown"),
    "reqmem": SIZES,
    "uint": DIGITS | st.just("Unknown"),
    "state": STATES,
    "exitcode": st.builds(lambda a, b: f"{a}:{b}", DIGITS, DIGITS),
    "timelimitraw": DIGITS | st.sampled_from(["UNLIMITED", "Partition_Limit"]),
    "timelimit": durations() | st.sampled_from(["UNLIMITED", "Partition_Limit"]),
    "nodelist": NODE_LISTS,
    "str": st.text(max_size=8),
    "extra": st.text(max_size=8),
}


def _kinds(fields: Sequence[str]) -> list[str]:
    return [kind for kind, _attr, _attr2 in Plan(fields, UTC).kinds]


@st.composite
def lines(draw: st.DrawFn, fields: Sequence[str], delimiter: str) -> str:
    """A line of `fields`, each value plausible for its column or odd, sometimes with a field too many
    or too few."""
    values = [
        draw(KIND_VALUES[kind] | ODD) if draw(st.integers(0, 9)) else draw(ODD) for kind in _kinds(fields)
    ]
    change = draw(st.integers(0, 20))
    if change == 0:
        values.append(draw(st.text(max_size=4)))
    elif change == 1:
        values.pop()
    return delimiter.join(values)


HYPOTHESIS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYPOTHESIS
@given(st.lists(lines(SACCT_FIELDS, "|"), min_size=1, max_size=4), st.sampled_from(ZONES))
@example(["|".join(GOOD)], CET_2)
def test_generated_sonar_lines(rows: list[str], tz: tzinfo) -> None:
    same("\n".join(rows), SACCT_FIELDS, tz)


@HYPOTHESIS
@given(st.lists(lines(HB_JOBINFO_FIELDS, "☃"), min_size=1, max_size=4), st.booleans())
def test_generated_parsable_lines(rows: list[str], trailing: bool) -> None:
    end = "☃" if trailing else ""
    same("\n".join(r + end for r in rows), HB_JOBINFO_FIELDS, CET_2, "☃", trailing)


@HYPOTHESIS
@given(st.text(max_size=300))
def test_generated_text(text: str) -> None:
    """Any text at all (control characters, line separators, surrogates) with a good row around it."""
    good = "|".join(GOOD)
    same(f"{good}\n{text}\n{good}")


# --- memory -------------------------------------------------------------------------------------------------


def test_no_leak() -> None:
    """Parsing and rendering the corpus and the hostile lines many times leaves no memory behind."""
    texts = [(f.text, f.fields, f.delimiter, f.trailing) for f in FILES]
    good = "|".join(GOOD)
    hostile = "\n".join(
        [with_column(c, v) for c, values in HOSTILE_VALUES.items() for v in values]
        + [line for line in HOSTILE_LINES if "\udcff" not in line]
        + [good]
    )
    texts.append((hostile, SACCT_FIELDS, "|", False))

    def once() -> None:
        for text, fields, delimiter, trailing in texts:
            for item in parse_sacct(text, fields, CET_2, delimiter=delimiter, trailing_delimiter=trailing):
                if isinstance(item, SacctRow):
                    with contextlib.suppress(ValueError):
                        to_slurm_job(item)
        for row in HAND_ROWS:
            with contextlib.suppress(ValueError, TypeError, AttributeError, OverflowError):
                to_slurm_job(row)

    for _ in range(20):  # warm: caches, interned strings, the renderer's remembered stamps
        once()
    gc.collect()
    tracemalloc.start()
    try:
        once()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            once()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 200 rounds"


# --- the producer -------------------------------------------------------------------------------------------


def test_the_producer_reads_sacct_through_the_compiled_reader() -> None:
    """`produce slurm`'s reader (bytes from sacct, decoded with replacement) gives the pure path's rows and
    problems, and its lines are read by the C code."""
    from hpcbus.producers.slurm.poller import read_sacct

    good = "|".join(GOOD).encode()
    stdout = b"\n".join(
        [good, good.replace(b"command", b"n\xff\xfeame"), b"x|y", good.replace(b"1|", b"z|", 1)]
    )
    rows, problems = read_sacct(stdout, CET_2)
    pure = list(parse_sacct_pure(stdout.decode(errors="replace"), SACCT_FIELDS, CET_2, place="sacct"))
    assert [*rows, *problems] == [i for i in pure if isinstance(i, SacctRow)] + [
        i for i in pure if isinstance(i, Problem)
    ]
    assert len(rows) == 2 and len(problems) == 2
    assert left_to_pure(stdout.decode(errors="replace"), SACCT_FIELDS) == 2  # the two bad lines alone
    for row in rows:
        same_record(row)


def test_records_share_no_list() -> None:
    """Each record has its own `nodes` and `gres_detail` (the renderer copies a template record)."""
    rows = [r for r in parse_sacct(FILES[0].text, SACCT_FIELDS, CET_2) if isinstance(r, SacctRow)]
    jobs = [to_slurm_job(row) for row in rows[:3]]
    jobs[0].gres_detail.append("gpu:1")
    jobs[0].nodes.append("extra")
    again = to_slurm_job(rows[1])
    assert jobs[1].gres_detail == [] and again.gres_detail == []
    assert "extra" not in jobs[1].nodes and again == to_slurm_job_pure(rows[1])
    empty = to_slurm_job(SacctRow(job_id_raw=5, state="RUNNING", submit=WHEN))
    assert empty.nodes == [] and empty.gres_detail == [] and empty.nodes is not jobs[0].nodes
