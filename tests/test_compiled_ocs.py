"""The compiled OCS ingest (`schemas/ocs/_read.c`) gives what the pure path gives, record for record.

The C functions and their pure twins, compared in-process: splitting a chunk into lines
(`lines.split_lines` vs `split_lines_pure`), reading a line (`accounting.parse_usual` vs `parse_usual_pure`)
and a whole chunk (`parse_usual_lines` vs `parse_usual_lines_pure`), grouping records into job updates
(`JobMerger.add` vs `add_pure`), and mapping updates to Sonar records and cc-backend event lines
(`mapping.map_jobs` vs `map_jobs_pure`), and escaping the jobs envelope's JSON as a line protocol field
(`_read.escape_field` vs `mapping.escape_field_pure`, both against `format_line`). Inputs: the corpus, Hypothesis-generated records (usual, odd and
hostile: escapes, non-ASCII and non-UTF-8 bytes, huge, negative and fractional numbers, wrong types, nulls,
nesting, truncation), the benchmark's records. The whole ingest of both paths is held to stored digests by
tests/test_ocs_fast.py (run it with `HPCBUS_PURE=1` too). These tests need the extension built (`pip install
-e .` with a compiler: setup.py); `HPCBUS_PURE=1` must switch it off.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.ocs_ingest import sample_lines
from hpcbus.schemas.hostnames import HostnameForm
from hpcbus.schemas.lineprotocol import Line, format_line, format_lines
from hpcbus.schemas.native import implementation
from hpcbus.schemas.ocs import AccountingRecord, accounting, lines, mapping
from hpcbus.schemas.ocs.mapping import map_jobs, map_jobs_pure
from hpcbus.schemas.ocs.updates import JobMerger, JobUpdate
from hpcbus.schemas.problems import InvalidInput
from hpcbus.schemas.translate import MAX_PAYLOAD, batch
from hpcbus.schemas.translate.bus import split_payloads
from tests.compiled_inputs import assert_memory_flat, printed_on_the_pure_path
from tests.corpus import CORPUS
from tests.test_ocs_fast import BAD
from tests.test_ocs_typed import ODD

GE = CORPUS / "gridengine"
NOW = 1_730_600_000


class Numbered(msgspec.Struct, frozen=True):
    """What the follower hands on (`RawLine`'s two fields the reader reads)."""

    number: int
    text: bytes


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert accounting._read is not None, "hpcbus.schemas.ocs._read is not built (pip install -e . with gcc)"
    assert mapping._read is accounting._read
    assert accounting.parse_usual is not accounting.parse_usual_pure
    assert accounting.parse_usual_lines is not None
    assert "OCS accounting read" in implementation()


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = (
        "from hpcbus.schemas.ocs import accounting as a, mapping as m; "
        "from hpcbus.schemas.ocs import lines as f; "
        "print(a._read, m._read, a.parse_usual is a.parse_usual_pure, a.parse_usual_lines, "
        "f.split_lines is f.split_lines_pure)"
    )
    assert printed_on_the_pure_path(code) == ["None", "None", "True", "None", "True"]


# --- reading ----------------------------------------------------------------------------------------------


def outcome(fn: Any, line: bytes) -> object:
    """What `fn(line)` gives: the record (or None), or the exception's type and problems."""
    try:
        return fn(line)
    except InvalidInput as exc:
        return ("InvalidInput", [str(p) for p in exc.problems])
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def same_read(line: bytes) -> object:
    fast = outcome(accounting.parse_usual, line)
    assert fast == outcome(accounting.parse_usual_pure, line), line[:300]
    lines = [Numbered(7, line), Numbered(8, line)]
    assert accounting.parse_usual_lines is not None
    chunk = accounting.parse_usual_lines(lines)  # type: ignore[arg-type]
    # None is always allowed: the pipeline then reads the lines one by one (`parse_usual` above)
    assert chunk is None or chunk == accounting.parse_usual_lines_pure(lines)  # type: ignore[arg-type]
    return fast


def corpus_lines() -> list[bytes]:
    files = [GE / "ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl"]
    files.append(GE / "sge-colon_accounting_samples_from-apel-tests.txt")
    return [line for f in files for line in f.read_bytes().split(b"\n")]


def test_the_corpus_is_read_alike() -> None:
    lines = corpus_lines()
    assert len(lines) >= 6
    records = [line for line in lines if isinstance(same_read(line), AccountingRecord)]
    assert len(records) == 1  # the OCS 9.0 record; the colon lines are not JSONL
    assert isinstance(taken_by_c(records[0]), AccountingRecord)  # read by C itself, not handed on


def _never(line: bytes) -> None:
    raise AssertionError(f"the C reader handed on {line[:100]!r}")


def taken_by_c(line: bytes) -> object:
    """The record the C reader makes of `line` itself (AssertionError when it hands the line on)."""
    assert accounting._read is not None
    return accounting._read.read_usual(AccountingRecord, _never, line)


@pytest.mark.parametrize("line", [*ODD, *BAD], ids=range(len(ODD) + len(BAD)))
def test_odd_and_bad_lines_are_read_alike(line: str) -> None:
    same_read(line.encode())


def test_the_benchmark_records_are_taken_by_the_c_reader() -> None:
    """The usual records are read by C: every line of the benchmark in one call."""
    lines = [Numbered(i, x.encode()) for i, x in enumerate(sample_lines(400), 1)]
    assert accounting.parse_usual_lines is not None
    fast = accounting.parse_usual_lines(lines)  # type: ignore[arg-type]
    assert fast is not None and fast == accounting.parse_usual_lines_pure(lines)  # type: ignore[arg-type]
    assert fast[1] == list(range(1, 401))
    assert all(isinstance(taken_by_c(x.text), AccountingRecord) for x in lines)


HOSTILE = [
    b"",
    b"{",
    b"{}",
    b'{"job_number":1',
    b'{"job_number":1}',
    b'{"job_number":1} x',
    b'{"job_number":1}\r',
    b' {"job_number":1}',
    b'{"job_number":0}',
    b'{"job_number":-5}',
    b'{"job_number":1.0}',
    b'{"job_number":1e3}',
    b'{"job_number":01}',
    b'{"job_number":99999999999999999999}',
    b'{"job_number":9223372036854775807}',
    b'{"job_number":18446744073709551615}',
    b'{"job_number":1,"job_number":2}',
    b'{"job_number":1,"owner":"a\\"b"}',
    b'{"job_number":1,"owner":"a\\u00e9"}',
    b'{"job_number":1,"owner":"\xc3\xa9t\xc3\xa9"}',
    b'{"job_number":1,"owner":"\xff\xfe"}',
    b'{"job_number":1,"owner":"\xed\xa0\x80"}',
    b'{"job_number":1,"owner":"a\tb"}',
    b'{"job_number":1,"owner":null}',
    b'{"job_number":1,"owner":7}',
    b'{"job_number":1,"pe_taskid":"NONE","pe_task_id":"1.c1"}',
    b'{"job_number":1,"pe_taskid":"none"}',
    b'{"job_number":1,"project":""}',
    b'{"job_number":1,"start_time":-1}',
    b'{"job_number":1,"start_time":999999}',
    b'{"job_number":1,"end_time":100000000000000000000}',
    b'{"job_number":1,"time":1,"type":"acct"}',
    b'{"job_number":1,"type":"new_job"}',
    b'{"job_number":1,"usage":{}}',
    b'{"job_number":1,"usage":[]}',
    b'{"job_number":1,"usage":{"rusage":{}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_maxrss":1.5}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_maxrss":2.0}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":-0}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":-0.0}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":1e400}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":1e-400}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":12345678901234567890}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":0.1e1}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":1.}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":.5}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_wallclock":NaN}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_utime":3.0000000000000004}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_utime":123456789012345.6}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_utime":1234567890123456e-30}}}',
    b'{"job_number":1,"usage":{"rusage":{"unknown":1}}}',
    b'{"job_number":1,"usage":{"eusage":{"maxvmem":2.5}}}',
    b'{"job_number":1,"usage":{"eusage":{"maxvmem":1e300}}}',
    b'{"job_number":1,"usage":{"eusage":{"maxrss":-3.0,"ioops":5,"wallclock":7}}}',
    b'{"job_number":1,"usage":{"usage":{"cpu":1}}}',
    b'{"job_number":1,"usage":{"usage":{"cpu":1},"eusage":{"cpu":2}}}',
    b'{"job_number":1,"usage":{"rusage":{},"rusage":{}}}',
    b'{"job_number":1,"usage":{"site":{"x":1}}}',
    b'{"job_number":1,"usage":{"rusage":{"ru_maxrss":1}},"usage":{}}',
    b'{ "job_number" : 1 , "usage" : { "rusage" : { "ru_utime" : 1.5 } } }',
    b'{"job_number":1,"nested":{"a":[{"b":[[[[[]]]]]}]}}',
    b"[" * 1000 + b"]" * 1000,
    b'{"job_number":1,"owner":"' + b"x" * 100_000 + b'"}',
    b"1:2:3",
    b"# comment",
]


@pytest.mark.parametrize("line", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_lines_are_read_alike(line: bytes) -> None:
    same_read(line)


def test_truncated_records_are_read_alike() -> None:
    line = sample_lines(1)[0].encode()
    for end in range(len(line) + 1):
        same_read(line[:end])


def test_a_chunk_with_one_odd_line_is_handed_back() -> None:
    """The chunk reader takes all lines or none: one odd line among usual ones gives None (then the pipeline
    reads the chunk line by line, naming that line's problem)."""
    good = [Numbered(i, x.encode()) for i, x in enumerate(sample_lines(5), 1)]
    assert accounting.parse_usual_lines is not None
    for bad in (b"", b"# c", b'{"job_number":"x"}', b"\xff"):
        lines = [*good[:2], Numbered(3, bad), *good[2:]]
        assert accounting.parse_usual_lines(lines) is None  # type: ignore[arg-type]
        assert accounting.parse_usual_lines_pure(lines) is None  # type: ignore[arg-type]


_text = st.one_of(
    st.sampled_from(
        ["", "NONE", "none", "users", "all.q", "c0001", "a b", 'q"uote', "back\\slash", "é", "\u2028"]
    ),
    st.text(max_size=12),
)
_int = st.one_of(
    st.integers(-3, 3),
    st.integers(0, 2**31),
    st.integers(2**31, 2**32),
    st.integers(-(2**70), 2**70),
    st.sampled_from([4294967295, 1_730_532_912_874_519, 253402300799_000_000, 2**63 - 1, 2**64 - 1]),
)
_float = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.floats(0, 1e6))
_scalar = st.one_of(_int, _float, _text, st.none(), st.booleans())
_value = st.one_of(_scalar, st.lists(_scalar, max_size=2), st.dictionaries(_text, _scalar, max_size=2))
_JOB_KEYS = [
    *("job_number", "task_number", "slots", "priority", "arid", "failed", "exit_status"),
    *("submission_time", "start_time", "end_time", "ar_submission_time"),
    *("owner", "group", "account", "qname", "hostname", "job_name", "project", "department", "granted_pe"),
    *("category", "submit_cmd_line", "deleted_by", "pe_taskid", "pe_task_id"),
]
_RUSAGE = ["ru_wallclock", "ru_utime", "ru_stime", "ru_maxrss", "ru_minflt", "ru_nvcsw", "ru_nivcsw"]
_EUSAGE = ["wallclock", "cpu", "mem", "io", "ioops", "iow", "maxvmem", "maxrss", "maxpss"]


def _typed(key: str) -> st.SearchStrategy[Any]:
    """Mostly the right type for `key`, sometimes anything."""
    if key.endswith(("_time", "number", "slots", "priority", "arid", "failed", "status")) or key.startswith(
        "ru_max"
    ):
        right: st.SearchStrategy[Any] = _int
    elif key in _RUSAGE or key in _EUSAGE:
        right = st.one_of(_float, _int)
    else:
        right = _text
    return st.one_of(right, right, right, _value)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(_JOB_KEYS), max_size=12, unique=True))
    obj: dict[str, Any] = {"job_number": draw(st.one_of(st.integers(1, 10**6), _int))}
    for key in keys:
        obj[key] = draw(_typed(key))
    if draw(st.booleans()):
        usage: dict[str, Any] = {}
        if draw(st.booleans()):
            usage["rusage"] = {
                k: draw(_typed(k)) for k in draw(st.lists(st.sampled_from(_RUSAGE), unique=True))
            }
        name = draw(st.sampled_from(["eusage", "usage", "site", None]))
        if name is not None:
            usage[name] = {k: draw(_typed(k)) for k in draw(st.lists(st.sampled_from(_EUSAGE), unique=True))}
        obj["usage"] = draw(st.one_of(st.just(usage), st.just(usage), _value))
    if draw(st.integers(0, 9)) == 0:
        obj[draw(st.sampled_from(["time", "type", "extra_key"]))] = draw(_value)
    return obj


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(records(), st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :")]), st.booleans())
@example({"job_number": 5, "owner": "u", "usage": {"rusage": {"ru_utime": 0.1 + 0.2}}}, (",", ":"), False)
def test_generated_records_are_read_alike(
    obj: dict[str, Any], separators: tuple[str, str], ascii: bool
) -> None:
    try:
        line = json.dumps(obj, separators=separators, ensure_ascii=ascii, allow_nan=False).encode()
    except ValueError:
        return
    same_read(line)


_decimal = st.builds(
    lambda whole, frac, exp: f"{whole}.{frac}{exp}",
    st.integers(0, 10**12),
    st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    st.sampled_from(["", "e5", "E-7", "e+19", "e-25", "e300"]),
)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr), _decimal), st.booleans())
@example("2526.3000000000002", False)
@example("0.30000000000000004", True)
@example("9007199254740993.0", False)
@example("1.00000000000000011102230246251565404", False)
def test_floats_are_read_alike(text: str, negative: bool) -> None:
    """Every float text as the pure path (msgspec) reads it: the C reader's exact fast paths included."""
    text = ("-" if negative and not text.startswith("-") else "") + text
    line = f'{{"job_number":1,"usage":{{"rusage":{{"ru_utime":{text}}},"eusage":{{"cpu":{text}}}}}}}'.encode()
    same_read(line)


@settings(max_examples=300, deadline=None)
@given(records(), st.integers(0, 10_000), st.binary(min_size=1, max_size=3))
def test_damaged_records_are_read_alike(obj: dict[str, Any], at: int, junk: bytes) -> None:
    """Bytes put into or cut from a record: non-UTF-8, broken tokens, truncation."""
    try:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except ValueError:
        return
    at %= len(line) + 1
    same_read(line[:at] + junk + line[at:])
    same_read(line[:at])


# --- following --------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([b"", b"\r", b"{}", b"\xff\n"])), max_size=8),
    st.booleans(),
    st.integers(0, 2**40),
    st.integers(0, 2**50),
)
@example([], True, 0, 0)
@example([b"", b""], True, 5, 7)
def test_lines_are_split_alike(pieces: list[bytes], newline_last: bool, number: int, offset: int) -> None:
    body = b"\n".join(pieces) + (b"\n" if newline_last else b"")
    fast = lines.split_lines(body, number, offset)
    assert fast == lines.split_lines_pure(body, number, offset)
    assert lines.split_lines is not lines.split_lines_pure


# --- merging ----------------------------------------------------------------------------------------------


def _record(job: int, task: int, **fields: Any) -> AccountingRecord:
    return AccountingRecord(job_number=job, task_number=task, **fields)


_merge_records = st.builds(
    _record,
    st.integers(1, 6),
    st.integers(0, 2),
    pe_taskid=st.sampled_from([None, None, "1.c1", "2.c2"]),
    exit_status=st.sampled_from([0, 1, -1, 4294967295, 137, 2**70]),
    failed=st.sampled_from([0, 24, 25, 37, 100]),
    granted_pe=st.sampled_from([None, None, "mpi"]),
    hostname=st.sampled_from(["c1", "c2", ""]),
    hosts=st.sampled_from([(), ("c1",), ("c1", "c2")]),
    start_time=st.integers(0, 100),
    end_time=st.integers(0, 200),
    ru_utime=st.floats(0, 100),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(_merge_records, max_size=12), max_size=5),
    st.integers(1, 4),
    st.lists(st.integers(0, 99), max_size=14),
)
def test_merging_is_alike(polls: list[list[AccountingRecord]], max_jobs: int, lines: list[int]) -> None:
    fast, pure = JobMerger(max_jobs=max_jobs, max_parts=3), JobMerger(max_jobs=max_jobs, max_parts=3)
    for records in polls:
        assert fast.add(records, lines) == pure.add_pure(records, lines)
        assert list(fast._open.items()) == list(pure._open.items())


# --- mapping ----------------------------------------------------------------------------------------------


def same_mapping(
    updates: list[JobUpdate],
    cluster: str = "bench",
    *,
    start_jobs: bool = True,
    form: HostnameForm = "as-is",
    domain: str = "",
) -> Any:
    """Both mappings of `updates`, asserted equal (an exception too, should the pure path raise one: the C code
    hands what it is unsure of to it); the compiled one."""
    options: dict[str, Any] = {"now": NOW, "start_jobs": start_jobs, "form": form, "domain": domain}
    try:
        pure = map_jobs_pure(updates, cluster, **options)
    except Exception as exc:
        with pytest.raises(type(exc), match="^" + re.escape(str(exc)) + "$"):
            map_jobs(updates, cluster, **options)
        return None
    fast = map_jobs(updates, cluster, **options)
    assert fast.jobs == pure.jobs
    assert fast.event_text == pure.event_text
    assert fast.events == pure.events
    assert [(i, type(e), str(e)) for i, e in fast.failures] == [
        (i, type(e), str(e)) for i, e in pure.failures
    ]
    if fast.jobs:
        same_envelope_text(fast.jobs, cluster)
    return fast


def same_envelope_text(jobs: list[Any], cluster: str) -> bytes:
    """The chunk's jobs envelope written by `envelope_text` (C escape, and `escape_field_pure`) is what
    `format_line` writes for its `envelope_lines`, and `split_payloads` cuts it where `batch` cuts those."""
    envelope = mapping.jobs_envelope(jobs, cluster, NOW)
    text = mapping.envelope_text(envelope, cluster)
    assert text == mapping.envelope_text(envelope, cluster, pure=True)
    lines = mapping.envelope_lines(envelope, cluster)
    assert text == format_lines(lines).encode()
    for limit in (1000, MAX_PAYLOAD):
        assert split_payloads(text, limit) == list(batch(lines, limit))
    return text


_ESCAPES = [
    b"",
    b"plain",
    b'"',
    b"\\",
    b"\r",
    b"\n",
    b'{"a":"b\\"c"}\r\n',
    'é"😀\\'.encode(),
    b"\x00\xff\x80",
]


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
@example(b"\\" * 1000 + b'"')
def test_a_field_is_escaped_alike(payload: bytes) -> None:
    same_escape(payload)


@pytest.mark.parametrize("payload", _ESCAPES, ids=range(len(_ESCAPES)))
def test_hostile_fields_are_escaped_alike(payload: bytes) -> None:
    same_escape(payload)


def same_escape(payload: bytes) -> None:
    """`escape_field` is `escape_field_pure` on any bytes; on UTF-8 it is what `format_line` writes for the
    text as a string field."""
    assert mapping._read is not None
    fast = mapping._read.escape_field(payload)
    assert fast == mapping.escape_field_pure(payload)
    with contextlib.suppress(UnicodeDecodeError):
        text = payload.decode()
        assert b'x f="' + fast + b'" 1' == format_line(Line("x", {}, {"f": text}, 1)).encode()


def test_the_benchmark_envelope_is_written_alike() -> None:
    """A chunk's envelope in parts (larger than one part), with odd cluster names and job names to escape."""
    records = [accounting.parse_usual_pure(x.encode()) for x in sample_lines(3000)]
    updates = JobMerger().add_pure([r for r in records if r is not None], range(1, 3001))
    jobs = map_jobs(updates, "bench", now=NOW).jobs
    assert len(same_envelope_text(jobs, "bench").splitlines()) > 1  # in parts
    odd = [
        msgspec.structs.replace(j, job_name=n)
        for j, n in zip(jobs, ['a"b', "c\\d", "é\n", "x\r"], strict=False)
    ]
    for cluster in ("bench", "a b,c=d", "", "é"):
        same_envelope_text(odd, cluster)


def test_the_benchmark_jobs_are_mapped_alike() -> None:
    records = [accounting.parse_usual_pure(x.encode()) for x in sample_lines(2000)]
    merger = JobMerger()
    updates = merger.add_pure([r for r in records if r is not None], range(1, 2001))
    mapped = same_mapping(updates)
    assert len(mapped.jobs) == len(updates) and mapped.events > len(updates)
    for start_jobs in (True, False):
        for cluster in ("bench", "a b,c=d", "", "é"):
            same_mapping(updates[:300], cluster, start_jobs=start_jobs)
    for form in get_args(HostnameForm):
        same_mapping(updates[:300], form=form, domain="example.org")


_map_records = st.builds(
    _record,
    st.integers(1, 2**40),
    st.sampled_from([0, 1, 2, 7]),
    pe_taskid=st.sampled_from([None, None, "1.c1"]),
    owner=st.one_of(st.sampled_from(["u1", "", 'q"u', "b\\s", "é"]), st.text(max_size=5)),
    account=st.sampled_from(["sge", "", "p\x01"]),
    qname=st.sampled_from(["all.q", "", "gpu.q"]),
    hostname=st.sampled_from(["c0001", "", "c0002.example.org", "node[1]", "é1"]),
    hosts=st.sampled_from([(), ("c1",), ("c1", "c2"), ("c1", "n5", "c3"), ("a b",), ("x\\y",)]),
    job_name=st.one_of(st.sampled_from(["run.sh", "", 'a"b']), st.text(max_size=6)),
    granted_pe=st.sampled_from([None, "mpi"]),
    slots=st.sampled_from([0, 1, 16, -3]),
    category=st.sampled_from(
        [None, "", "-l h_rt=7200", "-l h_rt=1:00:00,s_rt=50", "-U users", "-l h_rt=99999999999999999999999"]
    ),
    submit_cmd_line=st.sampled_from([None, "qsub x.sh", "qsub -t 1-3 x.sh"]),
    arid=st.sampled_from([0, 5]),
    submission_time=st.sampled_from([0, 1, 1_730_532_912, 253402300799, 253402300800, 2**62]),
    start_time=st.sampled_from([0, 1_730_532_917, 253402300799, 253402300800]),
    end_time=st.sampled_from([0, 1_730_532_900, 1_730_536_917, 253402300800]),
    failed=st.sampled_from([0, 17, 22, 24, 37, 100]),
    exit_status=st.sampled_from([0, 1, 137, 255, 4294967295, -1, 2**70]),
    deleted_by=st.sampled_from([None, "", "root@master"]),
    ru_wallclock=st.floats(allow_nan=True, allow_infinity=True),
    ru_utime=st.sampled_from([0.0, 0.4999999, 0.5, 2.5, 1e300, float("nan"), -1.0]),
    ru_stime=st.floats(0, 1e20),
    cpu=st.floats(-1, 1e19),
    ru_maxrss=st.sampled_from([0, 100, -5, 2**70]),
    maxrss=st.sampled_from([None, 0, 1, 1023, 1025, 2**63 - 1, 2**70]),
    maxvmem=st.sampled_from([0, 1, 2048, 2**63 - 1, 2**70]),
    source_format=st.sampled_from(["jsonl", "colon52"]),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(_map_records, st.booleans(), st.booleans(), st.integers(0, 9)), max_size=6),
    st.sampled_from(["bench", "", "a b"]),
    st.booleans(),
    st.sampled_from([("as-is", ""), *((f, d) for f in get_args(HostnameForm) for d in ("", "example.org"))]),
)
def test_generated_jobs_are_mapped_alike(
    items: list[tuple[AccountingRecord, bool, bool, int]],
    cluster: str,
    start_jobs: bool,
    form: tuple[HostnameForm, str],
) -> None:
    updates = [JobUpdate(r, ended, ended and final, line) for r, ended, final, line in items]
    same_mapping(updates, cluster, start_jobs=start_jobs, form=form[0], domain=form[1])


def test_an_infinite_usage_sum_is_capped() -> None:
    """Merged usage can add up to infinity: its seconds are capped as a huge finite value's are (no
    OverflowError), on both paths."""
    record = _record(5, 0, owner="u", hostname="c1", start_time=10, end_time=20, ru_utime=float("inf"))
    mapped = same_mapping([JobUpdate(record, True, True, 1)])
    assert mapped.jobs[0].sacct.user_cpu == 2**63 - 1


def test_a_poll_time_no_timestamp_holds_fails_alike() -> None:
    """A job without times takes the poll time as its submit time: one out of range is that job's failure."""
    timeless = _record(5, 0, owner="u", hostname="c1")
    for now in (-1, 253402300800):
        fast = map_jobs([JobUpdate(timeless, True, True, 1)], "bench", now=now)
        pure = map_jobs_pure([JobUpdate(timeless, True, True, 1)], "bench", now=now)
        assert [(i, str(e)) for i, e in fast.failures] == [(i, str(e)) for i, e in pure.failures] != []


def test_a_time_no_timestamp_holds_is_a_failure_of_that_job_alone() -> None:
    good = _record(5, 0, owner="u", hostname="c1", start_time=10, end_time=20)
    bad = _record(6, 0, owner="u", hostname="c1", start_time=253402300800)
    mapped = same_mapping([JobUpdate(good, True, True, 1), JobUpdate(bad, True, True, 2)])
    assert len(mapped.jobs) == 1 and [i for i, _ in mapped.failures] == [1]
    assert mapped.events == 2


# --- memory -----------------------------------------------------------------------------------------------


def test_no_leak() -> None:
    """Many rounds of every compiled function on good and bad input: the process does not grow."""
    good = [x.encode() for x in sample_lines(200)]
    bad = [*HOSTILE[:-3], *(x.encode() for x in ODD)]
    numbered = [Numbered(i, x) for i, x in enumerate(good, 1)]
    odd = [*numbered[:50], Numbered(51, b'{"job_number":"x"}')]
    assert accounting.parse_usual_lines is not None
    read_all = accounting.parse_usual_lines
    hostile_updates = [
        JobUpdate(_record(1, 0, owner='q"', hostname="c1", start_time=5, end_time=9), True, True, 1),
        JobUpdate(_record(2, 0, owner="u", hostname="c1", start_time=253402300800), True, True, 2),
        JobUpdate(_record(3, 1, owner="u", hosts=("a", "b"), submit_cmd_line="qsub -t 1 x"), True, True, 3),
    ]

    assert mapping._read is not None
    escape = mapping._read.escape_field

    def round_() -> None:
        for line in [*good[:40], *bad]:
            with contextlib.suppress(InvalidInput):
                accounting.parse_usual(line)
        lines.split_lines(b"\n".join(good) + b"\nx", 0, 0)
        read_all(numbered)  # type: ignore[arg-type]
        read_all(odd)  # type: ignore[arg-type]
        records = [r for r in (accounting.parse_usual_pure(x) for x in good) if r is not None]
        merger = JobMerger(max_jobs=50)
        updates = merger.add(records, range(len(records)))
        mapped = map_jobs([*updates, *hostile_updates], "bench", now=NOW)
        map_jobs(updates[:20], "a b", now=NOW)
        mapping.envelope_text(mapping.jobs_envelope(mapped.jobs, "bench", NOW), "bench")
        for payload in _ESCAPES:
            escape(payload)
        with contextlib.suppress(TypeError):
            escape("not bytes")

    assert_memory_flat(round_, warm=30, rounds=300, limit_kib=4096)
