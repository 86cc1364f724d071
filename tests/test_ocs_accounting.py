"""OCS / Grid Engine accounting: every corpus line with its values, the JSONL versions (9.0 `usage.usage`,
9.1 `eusage`, reporting file), colon layouts and their errors, the PE-task merge and the state table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcbus.schemas.ocs import (
    FAILED_CODES,
    KIND,
    STATES,
    AccountingRecord,
    is_skippable,
    job_state,
    merge_job,
    merge_jobs,
    parse_colon_line,
    parse_jsonl_line,
    parse_line,
    requested_runtime,
)
from hpcbus.schemas.ocs.colon import COLON_COLUMNS
from hpcbus.schemas.problems import InvalidInput
from tests.corpus import CORPUS

GE_DIR = CORPUS / "gridengine"
JSONL_FILE = GE_DIR / "ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl"
COLON_FILE = GE_DIR / "sge-colon_accounting_samples_from-apel-tests.txt"


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not is_skippable(line)]


def _problems(err: pytest.ExceptionInfo[InvalidInput]) -> dict[str, str]:
    assert all(p.kind == KIND for p in err.value.problems)
    return {p.path: p.reason for p in err.value.problems}


# --- the corpus, line by line -------------------------------------------------------------------------------

# (format, job_number, owner, submission, start, end (epoch s), cpu, maxvmem (bytes), failed, exit, state)
CORPUS_EXPECTED: dict[tuple[str, int], tuple[Any, ...]] = {
    (COLON_FILE.name, 1): (
        "colon43", 43, "dteam041", 1200093286, 1200093294, 1200093295, 0.09, 30171136, 0, 0, "COMPLETED"
    ),
    (COLON_FILE.name, 2): (
        "colon45", 6972834, "csfiylfl", 1318560244, 1318560254, 1318740255, 1026706.54, 821923840, 100, 138,
        "TIMEOUT",
    ),
    (COLON_FILE.name, 3): (
        "colon45", 1630912, "pilatl10", 1358189999, 1358190002, 1358210574, 1272.61884123, 1546682368, 0, 1,
        "FAILED",
    ),
    (COLON_FILE.name, 4): (
        "colon46", 3294013, "prdatl26", 1404167579, 1404169049, 1404169408, 50.796277, 5944487936, 0, 0,
        "COMPLETED",
    ),
    (COLON_FILE.name, 5): (
        "colon52", 3872561, "atlas235", 1412932860, 1412932865, 1412933085, 12.770, 1291231232, 0, 0,
        "COMPLETED",
    ),
    (JSONL_FILE.name, 1): (
        "jsonl", 10, "root", 1730532912, 1730532913, 1730532913, 0.51713, 21049344, 0, 0, "COMPLETED"
    ),
}  # fmt: skip


def _corpus_cases() -> list[tuple[str, int, str]]:
    cases = []
    for path in (COLON_FILE, JSONL_FILE):
        for number, line in enumerate(_lines(path), start=1):
            cases.append((path.name, number, line))
    return cases


CORPUS_CASES = _corpus_cases()


def test_every_corpus_line_is_listed() -> None:
    assert sorted((name, number) for name, number, _ in CORPUS_CASES) == sorted(CORPUS_EXPECTED)


@pytest.mark.parametrize(
    ("name", "number", "line"), CORPUS_CASES, ids=[f"{n}:{i}" for n, i, _ in CORPUS_CASES]
)
def test_corpus_line(name: str, number: int, line: str) -> None:
    fmt, job, owner, submitted, started, ended, cpu, maxvmem, failed, exit_status, state = CORPUS_EXPECTED[
        (name, number)
    ]
    record = parse_line(line)
    assert record.source_format == fmt
    assert record.job_number == job
    assert record.owner == owner
    assert (record.submission_time, record.start_time, record.end_time) == (submitted, started, ended)
    assert record.cpu == pytest.approx(cpu)
    assert record.maxvmem == maxvmem
    assert (record.failed, record.exit_status) == (failed, exit_status)
    assert job_state(record) == state
    assert record.hosts == (record.hostname,)
    assert record.merged_records == 1
    # the format-specific parser gives the same record as the auto-detecting one
    specific = parse_jsonl_line(line) if fmt == "jsonl" else parse_colon_line(line)
    assert specific == record


def test_colon_line_details() -> None:
    one, two, three, four, five = (parse_colon_line(line) for line in _lines(COLON_FILE))
    # SGE 6.0: 43 columns, no advance reservation columns
    assert (one.qname, one.hostname, one.group, one.job_name, one.account) == (
        "dteam",
        "testce.test",
        "dteam",
        "STDIN",
        "sge",
    )
    assert one.priority == 19
    assert one.ru_wallclock == 1.0
    assert one.ru_minflt == 46206
    assert (one.ru_nvcsw, one.ru_nivcsw) == (337, 257)
    assert one.project is None  # NONE
    assert one.department == "defaultdepartment"
    assert one.granted_pe is None
    assert one.slots == 1
    assert one.task_number == 0
    assert one.mem == pytest.approx(0.000213)
    assert one.category == "-U dteam -q dteam"
    assert one.pe_taskid is None
    assert one.arid == 0
    assert one.wallclock is None and one.maxrss is None and one.ioops is None
    # SGE 6.2, parallel job
    assert two.granted_pe == "mpi"
    assert two.slots == 9
    assert two.ru_wallclock == 180001
    assert two.ru_maxrss == 1448  # written as %f
    assert two.mem == pytest.approx(60207.223310)
    assert two.category is not None and "-pe mpi 9" in two.category
    assert requested_runtime(two.category) == 180000  # s_rt, smaller than h_rt=180300
    # fractional ru_wallclock, a project
    assert three.ru_wallclock == pytest.approx(20365.78)
    assert three.ru_utime == pytest.approx(1211.1274098)
    assert three.project == "pilatl.p"
    assert three.priority == 5
    # 46 columns: the extra field is kept
    assert four.extra == {"column_46": "NONE"}
    assert four.ru_inblock == 483672
    # Univa 8.x: millisecond timestamps and seven vendor columns
    assert five.ru_wallclock == pytest.approx(220.488)
    assert five.maxrss == 124411904
    assert five.maxpss == 115065856
    assert five.deleted_by is None  # qdel_info NONE
    assert five.submit_cmd_line == "qsub /tmp/cream_814542935"
    assert five.extra == {"job_class": "NONE", "submit_host": "grid-cream-02.hpc.susx.ac.uk", "cwd": "NONE"}


def test_jsonl_9_0_sample_details() -> None:
    """OCS 9.0.0-9.0.5: the eusage container is called `usage` (`usage.usage`)."""
    record = parse_jsonl_line(_lines(JSONL_FILE)[0])
    assert (record.job_number, record.task_number) == (10, 1)
    assert (record.owner, record.group, record.account) == ("root", "root", "sge")
    assert (record.qname, record.hostname) == ("all.q", "master")
    assert record.department == "defaultdepartment"
    assert record.project is None and record.granted_pe is None  # null strings are omitted by the writer
    assert record.slots == 1
    assert record.job_name == "echo"
    assert record.submit_cmd_line == "qsub -b y -terse echo 'job 1'"
    assert record.category is None  # ""
    assert record.pe_taskid is None
    assert record.ru_wallclock == 0
    assert record.ru_utime == pytest.approx(0.355821)
    assert record.ru_stime == pytest.approx(0.161309)
    assert record.ru_maxrss == 10284
    assert record.ru_minflt == 504
    assert record.ru_oublock == 11
    assert (record.ru_nvcsw, record.ru_nivcsw) == (248, 14)
    assert record.wallclock == pytest.approx(2.022342)
    assert record.mem == pytest.approx(0.0043125152587890625)
    assert record.io == pytest.approx(0.000008341856300830841)
    assert record.iow == 0.0
    assert record.maxrss == 10530816
    assert record.maxpss is None and record.ioops is None  # 9.1 only
    assert record.custom_usage == {}
    assert record.extra == {}


# --- JSONL variants -------------------------------------------------------------------------------------------

SAMPLE_9_1: dict[str, Any] = {
    "job_number": 4711,
    "task_number": 3,
    "start_time": 1760000000123456,
    "end_time": 1760000600999999,
    "owner": "alice",
    "group": "users",
    "account": "sge",
    "qname": "all.q",
    "hostname": "node07",
    "project": "climate",
    "department": "defaultdepartment",
    "granted_pe": "mpi",
    "slots": 8,
    "arid": 12,
    "job_name": "run.sh",
    "priority": 0,
    "submission_time": 1759999990000000,
    "submit_cmd_line": "qsub -pe mpi 8 run.sh",
    "ar_submission_time": 1759990000000000,
    "pe_taskid": "NONE",
    "category": "-q all.q -l h_rt=3600 -pe mpi 8",
    "failed": 0,
    "exit_status": 137,
    "deleted_by": "alice@login1",
    "usage": {
        "rusage": {"ru_wallclock": 600, "ru_utime": 4000.5, "ru_stime": 12.25, "ru_maxrss": 2048000},
        "eusage": {
            "wallclock": 600.9,
            "cpu": 4012.75,
            "mem": 123.5,
            "io": 0.5,
            "ioops": 12345,
            "iow": 1.5,
            "maxvmem": 8589934592.0,
            "maxrss": 2097152000.0,
            "maxpss": 1048576000.0,
        },
        "gpu": {"gpu_seconds": 4800.0, "maxgpumem": 1.5e10},
    },
}


def test_jsonl_9_1_eusage_variant() -> None:
    record = parse_jsonl_line(json.dumps(SAMPLE_9_1))
    assert record.pe_taskid is None  # "NONE"
    assert record.deleted_by == "alice@login1"
    assert job_state(record) == "CANCELLED"
    assert (record.start_time, record.end_time) == (1760000000, 1760000600)  # µs floored to s
    assert record.submission_time == 1759999990
    assert record.ar_submission_time == 1759990000
    assert record.arid == 12
    assert (record.project, record.granted_pe, record.slots) == ("climate", "mpi", 8)
    assert record.cpu == pytest.approx(4012.75)
    assert record.maxvmem == 8589934592
    assert (record.maxrss, record.maxpss, record.ioops) == (2097152000, 1048576000, 12345)
    assert record.wallclock == pytest.approx(600.9)
    assert record.ru_maxrss == 2048000
    assert record.custom_usage == {"gpu": {"gpu_seconds": 4800.0, "maxgpumem": 1.5e10}}


def test_jsonl_pe_task_record() -> None:
    task = dict(SAMPLE_9_1, pe_taskid="1.node08", hostname="node08")
    del task["deleted_by"]
    record = parse_jsonl_line(json.dumps(task))
    assert record.pe_taskid == "1.node08"
    assert record.hosts == ("node08",)


def test_jsonl_man_page_spelling_pe_task_id() -> None:
    line = json.dumps({"job_number": 5, "pe_task_id": "2.nodeX", "usage": {}})
    assert parse_jsonl_line(line).pe_taskid == "2.nodeX"


def test_jsonl_reporting_variant() -> None:
    """reporting.jsonl puts `time` and `type` first; other record types are not accounting."""
    reporting = {"time": 1730532914000000, "type": "acct", **json.loads(_lines(JSONL_FILE)[0])}
    record = parse_jsonl_line(json.dumps(reporting))
    assert record.job_number == 10
    assert record.extra == {"time": 1730532914000000}
    assert record.maxvmem == 21049344
    with pytest.raises(InvalidInput) as err:
        parse_jsonl_line(json.dumps({"time": 1, "type": "new_job", "job_number": 1}))
    assert "type" in _problems(err)
    assert "'new_job'" in _problems(err)["type"]


def test_jsonl_unknown_keys_are_kept() -> None:
    line = json.dumps(
        {
            "job_number": 7,
            "future_key": {"a": [1, 2]},
            "usage": {"rusage": {"ru_new": 3}, "eusage": {"cpu": 1.0, "gpu_util": 0.5, "note": "x"}},
        }
    )
    record = parse_jsonl_line(line)
    assert record.extra == {"future_key": {"a": [1, 2]}, "usage.eusage.note": "x"}
    assert record.custom_usage == {"rusage": {"ru_new": 3.0}, "eusage": {"gpu_util": 0.5}}


def test_jsonl_flat_development_layout() -> None:
    line = json.dumps(
        {"job_number": 3, "hostname": "h", "ru_wallclock": 5, "ru_utime": 1.5, "cpu": 2.0, "maxvmem": 1e6}
    )
    record = parse_jsonl_line(line)
    assert (record.ru_wallclock, record.ru_utime, record.cpu, record.maxvmem) == (5.0, 1.5, 2.0, 1000000)
    assert record.extra == {}


def test_jsonl_broken_json() -> None:
    line = _lines(JSONL_FILE)[0][:-5]
    with pytest.raises(InvalidInput) as err:
        parse_jsonl_line(line)
    problems = _problems(err)
    assert list(problems) == ["line"]
    assert "not valid JSON" in problems["line"]
    assert "ocs accounting: line: not valid JSON" in str(err.value)


@pytest.mark.parametrize(
    ("line", "path", "fragment"),
    [
        ("[1, 2]", "line", "a JSON object, not an array"),
        ('{"owner": "x"}', "job_number", "missing"),
        ('{"job_number": "10"}', "job_number", "must be a number, not a string"),
        ('{"job_number": 0}', "job_number", "must be positive"),
        ('{"job_number": 1.5}', "job_number", "whole number"),
        ('{"job_number": true}', "job_number", "not a boolean"),
        ('{"job_number": 1, "start_time": -5}', "start_time", "must not be negative"),
        ('{"job_number": 1, "owner": 5}', "owner", "must be a string"),
        ('{"job_number": 1, "usage": []}', "usage", "must be an object"),
        ('{"job_number": 1, "usage": {"rusage": 1}}', "usage.rusage", "must be an object"),
        ('{"job_number": 1, "usage": {"rusage": {"ru_utime": "1"}}}', "usage.rusage.ru_utime", "a number"),
        ('{"job_number": 1, "usage": {"eusage": {"cpu": null}}}', "usage.eusage.cpu", "not null"),
        ('{"job_number": 1, "usage": {"usage": {"maxvmem": "big"}}}', "usage.usage.maxvmem", "a number"),
        ("# a comment", "line", "skip it with is_skippable"),
    ],
)
def test_jsonl_errors(line: str, path: str, fragment: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_jsonl_line(line)
    problems = _problems(err)
    assert path in problems
    assert fragment in problems[path]


def test_jsonl_reports_every_problem() -> None:
    line = '{"job_number": "x", "owner": 1, "usage": {"rusage": {"ru_utime": "a"}, "eusage": {"cpu": []}}}'
    with pytest.raises(InvalidInput) as err:
        parse_jsonl_line(line)
    assert set(_problems(err)) == {"job_number", "owner", "usage.rusage.ru_utime", "usage.eusage.cpu"}


# --- colon format ---------------------------------------------------------------------------------------------


def _colon(values: dict[str, Any], columns: tuple[str, ...] = COLON_COLUMNS) -> str:
    defaults: dict[str, Any] = {name: 0 for name in columns}
    defaults.update(
        qname="all.q", hostname="n1", group="g", owner="u", job_name="j", job_number=1, account="sge",
        project="NONE", department="defaultdepartment", granted_pe="NONE", category="NONE", pe_taskid="NONE",
    )  # fmt: skip
    defaults.update(values)
    return ":".join(str(defaults[name]) for name in columns)


@pytest.mark.parametrize("count", [1, 30, 42, 44, 47, 51, 56])
def test_colon_wrong_column_count(count: int) -> None:
    line = ":".join(["x"] * count) if count > 1 else "x" * 10
    with pytest.raises(InvalidInput) as err:
        parse_colon_line(line)
    problems = _problems(err)
    assert list(problems) == ["columns"]
    assert f"has {count} colon-separated columns" in problems["columns"]
    assert "43, 45, 46 or 52-55" in problems["columns"]


def test_colon_category_with_colon_is_refused() -> None:
    line = _colon({"category": "-l h_rt=1:00:00"})
    with pytest.raises(InvalidInput) as err:
        parse_colon_line(line)
    assert "has 47 colon-separated columns" in str(err.value)


def test_colon_bad_values_name_the_column() -> None:
    line = _colon({"job_number": "abc", "cpu": "fast", "start_time": "soon"})
    with pytest.raises(InvalidInput) as err:
        parse_colon_line(line)
    problems = _problems(err)
    assert problems["job_number"] == "column 6: 'abc' is not a number"
    assert problems["cpu"] == "column 37: 'fast' is not a number"
    assert problems["start_time"] == "column 10: 'soon' is not a number"
    assert "cpu" in str(err.value)


def test_colon_old_lowercase_none_and_pe_task() -> None:
    record = parse_colon_line(
        _colon({"project": "none", "granted_pe": "orte", "pe_taskid": "1.n2", "slots": 4})
    )
    assert record.project is None
    assert (record.granted_pe, record.pe_taskid, record.slots) == ("orte", "1.n2", 4)


def test_colon_time_units_by_magnitude() -> None:
    seconds = parse_colon_line(
        _colon({"submission_time": 1700000000, "start_time": 1700000010, "end_time": 0})
    )
    assert (seconds.submission_time, seconds.start_time, seconds.end_time) == (1700000000, 1700000010, 0)
    millis = parse_colon_line(_colon({"submission_time": 1700000000123, "end_time": 1700000100999}))
    assert (millis.submission_time, millis.end_time) == (1700000000, 1700000100)
    micros = parse_colon_line(_colon({"start_time": 1700000000123456}))
    assert micros.start_time == 1700000000


def test_colon_reporting_line() -> None:
    record = parse_colon_line("1404169410:acct:" + _lines(COLON_FILE)[3])
    assert record.job_number == 3294013
    assert record.extra == {"time": 1404169410, "column_46": "NONE"}


def test_colon_univa_longer_layouts() -> None:
    univa = _lines(COLON_FILE)[4]
    record = parse_colon_line(univa + ":221.5:77:0,1")
    assert record.source_format == "colon55"
    assert record.wallclock == pytest.approx(221.5)
    assert record.ioops == 77
    assert record.extra["bound_cores"] == "0,1"
    qdel = univa.replace(":NONE:NONE:124411904:", ":NONE:bob@login:124411904:")
    assert parse_colon_line(qdel).deleted_by == "bob@login"
    assert job_state(parse_colon_line(qdel)) == "CANCELLED"


@pytest.mark.parametrize(
    ("line", "skip"),
    [
        ("", True),
        ("   ", True),
        ("\n", True),
        ("x", True),
        ("# comment", True),
        ("  #c", True),
        ("{}", False),
    ],
)
def test_is_skippable(line: str, skip: bool) -> None:
    assert is_skippable(line) is skip


def test_parse_line_detects_the_format() -> None:
    assert parse_line("  " + json.dumps({"job_number": 2})).source_format == "jsonl"
    assert parse_line(_colon({})).source_format == "colon45"
    with pytest.raises(InvalidInput):
        parse_line("#")


# --- cross-format property ------------------------------------------------------------------------------------

_names = st.text(alphabet="abcxyz0123456789._-", min_size=1, max_size=8)
_counts = st.integers(0, 2**31)


@st.composite
def job_values(draw: st.DrawFn) -> dict[str, Any]:
    submitted = draw(st.integers(946684800, 2_000_000_000))
    started = draw(st.integers(submitted, submitted + 10**6))
    return {
        "job_number": draw(st.integers(1, 2**31)),
        "task_number": draw(st.integers(0, 10**5)),
        "owner": draw(_names),
        "group": draw(_names),
        "account": draw(_names),
        "qname": draw(_names),
        "hostname": draw(_names),
        "job_name": draw(_names),
        "project": draw(st.none() | _names),
        "granted_pe": draw(st.none() | _names),
        "slots": draw(st.integers(1, 4096)),
        "priority": draw(st.integers(0, 1024)),
        "failed": draw(st.sampled_from(sorted(FAILED_CODES))),
        "exit_status": draw(st.integers(0, 255)),
        "submission_time": submitted,
        "start_time": started,
        "end_time": draw(st.integers(started, started + 10**7)),
        "ru_wallclock": draw(st.integers(0, 10**7)),
        "ru_utime": draw(st.integers(0, 10**9)) / 1000,
        "ru_maxrss": draw(_counts),
        "ru_minflt": draw(_counts),
        "cpu": draw(st.integers(0, 10**9)) / 1000,
        "mem": draw(st.integers(0, 10**9)) / 1000,
        "maxvmem": draw(st.integers(0, 2**50)),
    }


def _to_jsonl(v: dict[str, Any]) -> str:
    top = {
        k: v[k] for k in v if k not in ("ru_wallclock", "ru_utime", "ru_maxrss", "ru_minflt", "cpu", "mem")
    }
    top = {k: val for k, val in top.items() if val is not None and k != "maxvmem"}
    for key in ("submission_time", "start_time", "end_time"):
        top[key] = v[key] * 1_000_000 + 999_999
    rusage = {k: v[k] for k in ("ru_wallclock", "ru_utime", "ru_maxrss", "ru_minflt")}
    eusage = {"cpu": v["cpu"], "mem": v["mem"], "maxvmem": float(v["maxvmem"])}
    return json.dumps({**top, "usage": {"rusage": rusage, "eusage": eusage}})


def _to_colon(v: dict[str, Any]) -> str:
    values = {k: ("NONE" if val is None else val) for k, val in v.items()}
    for key in ("ru_utime", "cpu", "mem"):
        values[key] = f"{v[key]:f}"
    values["maxvmem"] = f"{v['maxvmem']:f}"
    return _colon(values)


@settings(max_examples=200)
@given(job_values())
def test_jsonl_and_colon_agree(values: dict[str, Any]) -> None:
    """The same job written in both formats reads back as the same values (only the layout tag differs)."""
    from_json = parse_jsonl_line(_to_jsonl(values))
    from_colon = parse_colon_line(_to_colon(values))
    for key, value in values.items():
        assert getattr(from_json, key) == pytest.approx(value), key
        assert getattr(from_colon, key) == pytest.approx(value), key
    assert msgspec.structs.replace(from_colon, source_format="jsonl", category=None, pe_taskid=None) == (
        msgspec.structs.replace(from_json, department="defaultdepartment")
    )


_json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats() | st.text(max_size=5)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(
    ["job_number", "task_number", "start_time", "owner", "pe_taskid", "failed", "usage", "type", "time", "x"]
)
_usage = st.dictionaries(
    st.sampled_from(["rusage", "eusage", "usage", "custom"]),
    st.dictionaries(
        st.sampled_from(["ru_utime", "ru_maxrss", "cpu", "maxvmem", "ioops", "other"]), _json_values
    )
    | _json_values,
    max_size=3,
)


@settings(max_examples=500)
@given(st.dictionaries(_keys, _json_values, max_size=6), _usage)
def test_jsonl_never_crashes(obj: dict[str, Any], usage: dict[str, Any]) -> None:
    if "usage" in obj:
        obj["usage"] = usage
    try:
        line = json.dumps(obj)
    except ValueError:  # NaN in strict JSON: not a line the writer could produce
        return
    try:
        record = parse_jsonl_line(line)
    except InvalidInput as err:
        assert err.problems
        assert all(p.kind == KIND and p.reason for p in err.problems)
    else:
        assert isinstance(record, AccountingRecord)
        assert record.job_number > 0
        assert job_state(record) in STATES


@settings(max_examples=300)
@given(st.lists(st.text(alphabet="0123456789.aN:-", max_size=6), min_size=40, max_size=56))
def test_colon_never_crashes(columns: list[str]) -> None:
    try:
        record = parse_colon_line(":".join(columns))
    except InvalidInput as err:
        assert all(p.kind == KIND and p.reason for p in err.problems)
    else:
        assert job_state(record) in STATES


# --- merging PE tasks -----------------------------------------------------------------------------------------


def _record(**values: Any) -> AccountingRecord:
    values.setdefault("job_number", 100)
    if "hostname" in values:
        values.setdefault("hosts", (values["hostname"],))
    return AccountingRecord(**values)


MASTER = _record(
    hostname="n1", owner="alice", granted_pe="mpi", slots=8, submission_time=900, start_time=1000, end_time=2000,
    cpu=10.0, io=1.0, mem=2.0, iow=0.5, ru_utime=9.0, ru_stime=1.0, ru_minflt=10, ru_maxrss=1000,
    maxvmem=5000, maxrss=4000, wallclock=1000.5, ru_wallclock=1000, exit_status=0,
    custom_usage={"gpu": {"seconds": 1.0, "maxmem": 10.0}}, extra={"k": "master"},
)  # fmt: skip
TASK_A = _record(
    hostname="n2", pe_taskid="1.n2", slots=1, submission_time=900, start_time=1010, end_time=1990, cpu=100.0,
    io=2.0, mem=3.0, ru_utime=95.0, ru_stime=5.0, ru_minflt=20, ru_maxrss=3000, maxvmem=9000, maxrss=8000,
    wallclock=980.0, ru_wallclock=980, exit_status=1, custom_usage={"gpu": {"seconds": 2.0, "maxmem": 30.0}},
    extra={"k": "task", "only_task": 1},
)  # fmt: skip
TASK_B = _record(
    hostname="n10", pe_taskid="2.n10", slots=1, start_time=1005, end_time=2100, cpu=50.0, ru_utime=40.0,
    ru_stime=10.0, maxvmem=7000, ioops=5, deleted_by=None,
)  # fmt: skip


def test_merge_pe_tasks() -> None:
    job = merge_job([TASK_A, MASTER, TASK_B])
    assert job.pe_taskid is None
    assert job.merged_records == 3
    assert job.hostname == "n1"
    assert job.hosts == ("n1", "n10", "n2")
    assert (job.submission_time, job.start_time, job.end_time) == (900, 1000, 2100)
    assert job.cpu == pytest.approx(160.0)
    assert job.io == pytest.approx(3.0)
    assert job.mem == pytest.approx(5.0)
    assert (job.ru_utime, job.ru_stime) == (pytest.approx(144.0), pytest.approx(16.0))
    assert job.ru_minflt == 30
    assert (job.ru_maxrss, job.maxvmem, job.maxrss) == (3000, 9000, 8000)
    assert job.maxpss is None
    assert job.ioops == 5
    assert job.ru_wallclock == 1100.0 and job.wallclock == 1100.0  # the span, not a sum
    assert job.slots == 8
    assert (job.owner, job.granted_pe, job.exit_status) == ("alice", "mpi", 0)  # from the master
    assert job.custom_usage == {"gpu": {"seconds": 3.0, "maxmem": 30.0}}
    assert job.extra == {"k": "master", "only_task": 1}
    assert job_state(job) == "COMPLETED"


def test_merge_is_order_independent() -> None:
    a = merge_job([MASTER, TASK_A, TASK_B])
    b = merge_job([TASK_B, TASK_A, MASTER])
    assert a == b


def test_merge_single_and_duplicates() -> None:
    assert merge_job([MASTER]) is MASTER
    assert merge_job([MASTER, MASTER]) is MASTER  # a line read twice counts once
    assert merge_job([MASTER, TASK_A, TASK_A]).merged_records == 2


def test_merge_without_master_and_deleted_by() -> None:
    job = merge_job([TASK_A, msgspec.structs.replace(TASK_B, deleted_by="bob@login")])
    assert job.pe_taskid is None
    assert job.hostname == "n10"  # ended last
    assert job.deleted_by == "bob@login"
    assert job_state(job) == "CANCELLED"


def test_merge_intermediate_records() -> None:
    """Intermediate accounting: the same task split at midnight, usage per interval."""
    first = _record(hostname="n1", start_time=1000, end_time=5000, cpu=4000.0, maxvmem=10, ru_wallclock=4000)
    second = _record(hostname="n1", start_time=5000, end_time=6000, cpu=1000.0, maxvmem=20, ru_wallclock=1000)
    job = merge_job([second, first])
    assert (job.start_time, job.end_time, job.cpu, job.maxvmem) == (1000, 6000, 5000.0, 20)
    assert job.ru_wallclock == 5000.0
    assert job.hosts == ("n1",)
    assert job.wallclock is None


def test_merge_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        merge_job([])
    with pytest.raises(ValueError, match="several jobs"):
        merge_job([MASTER, _record(job_number=101)])
    with pytest.raises(ValueError, match="several jobs"):
        merge_job([MASTER, msgspec.structs.replace(MASTER, task_number=2)])


def test_merge_jobs_groups_by_job_and_task() -> None:
    other = _record(job_number=7, hostname="x", cpu=1.0)
    array_2 = msgspec.structs.replace(MASTER, task_number=2, cpu=3.0)
    merged = merge_jobs([TASK_A, other, array_2, MASTER, TASK_B])
    assert [(r.job_number, r.task_number) for r in merged] == [(7, 0), (100, 0), (100, 2)]
    assert merged[0] is other
    assert merged[1].merged_records == 3
    assert merged[2].cpu == 3.0


@settings(max_examples=100)
@given(st.permutations([MASTER, TASK_A, TASK_B]), st.integers(1, 3))
def test_merge_properties(records: list[AccountingRecord], keep: int) -> None:
    parts = records[:keep]
    job = merge_job(parts)
    assert job.cpu == pytest.approx(sum(r.cpu for r in parts))
    assert job.maxvmem == max(r.maxvmem for r in parts)
    assert job.end_time == max(r.end_time for r in parts)
    assert job.start_time == min(r.start_time for r in parts)
    assert set(job.hosts) == {r.hostname for r in parts}
    assert job.merged_records == len(parts)
    assert merge_job([job]) is job


# --- state table ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "state"),
    [
        ({}, "COMPLETED"),
        ({"exit_status": 1}, "FAILED"),
        ({"exit_status": 137}, "FAILED"),  # SIGKILL with no deleted_by: qdel before 9.1.2 or a limit
        ({"failed": 100, "exit_status": 137}, "FAILED"),
        ({"failed": 1}, "FAILED"),
        ({"failed": 8}, "FAILED"),  # in prolog
        ({"failed": 26, "exit_status": 1}, "FAILED"),
        ({"failed": 30, "exit_status": 100}, "FAILED"),
        ({"failed": 24}, "REQUEUED"),
        ({"failed": 25, "deleted_by": "qmaster@master"}, "REQUEUED"),
        ({"failed": 37, "exit_status": 137}, "TIMEOUT"),
        ({"failed": 37, "deleted_by": "qmaster@master"}, "TIMEOUT"),
        ({"deleted_by": "alice@login1", "exit_status": 137, "failed": 100}, "CANCELLED"),
        ({"deleted_by": "alice@login1"}, "CANCELLED"),
        ({"failed": 22}, "NODE_FAIL"),
        ({"failed": 100, "exit_status": 137, "category": "-l h_rt=3600", "ru_wallclock": 3601}, "TIMEOUT"),
        ({"failed": 17, "category": "-l h_rt=1:00:00", "ru_wallclock": 3600.0}, "TIMEOUT"),
        ({"exit_status": 138, "category": "-l s_rt=100,h_rt=200", "ru_wallclock": 150}, "TIMEOUT"),
        ({"exit_status": 137, "category": "-l h_rt=3600", "ru_wallclock": 10}, "FAILED"),  # killed early
        ({"exit_status": 0, "category": "-l h_rt=10", "ru_wallclock": 99}, "COMPLETED"),  # not killed
    ],
)
def test_job_state_table(values: dict[str, Any], state: str) -> None:
    assert job_state(_record(**values)) == state
    assert state in STATES


@pytest.mark.parametrize(
    ("category", "seconds"),
    [
        (None, None),
        ("", None),
        ("-q all.q", None),
        ("-l h_rt=3600", 3600),
        ("-l h_rt=1:00:00", 3600),
        ("-l h_rt=2:30", 150),
        ("-u x -l arch=x86_64,h_rt=180300,h_vmem=1G,s_rt=180000 -pe mpi 9", 180000),
        ("-l h_rtx=5", None),
        ("-l sh_rt=5", None),
    ],
)
def test_requested_runtime(category: str | None, seconds: int | None) -> None:
    assert requested_runtime(category) == seconds


def test_failed_codes_cover_the_table() -> None:
    assert FAILED_CODES[100] == "assumedly after job"
    assert FAILED_CODES[37] == "qmaster enforced h_rt limit"
    assert all(isinstance(code, int) for code in FAILED_CODES)
