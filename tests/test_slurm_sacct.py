"""sacct text -> SacctRow -> Sonar SlurmJob, held against the real corpus and Sonar's own expected output."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.sacct import (
    SACCT_FIELDS,
    SacctRow,
    parse_sacct,
    parse_sacct_line,
    sacct_argv,
    to_slurm_job,
)
from hpcbus.schemas.slurm.values import UNLIMITED, JobId
from hpcbus.schemas.sonar.types import SlurmJob
from tests.corpus import CORPUS

SLURM = CORPUS / "slurm"
CET_2 = timezone(timedelta(hours=2), "CET")  # POSIX TZ=CET-2, what Sonar's golden test runs under
HB_FORMAT = (
    "JobID,JobName,User,Partition,NodeList,NNodes,NCPUs,NTasks,State,Submit,Start,End,Timelimit,Elapsed,"
    "TotalCPU,CPUTime,UserCPU,SystemCPU,ReqMem,MaxRSS,MaxVMSize,ReqTRES,AllocTRES,TRESUsageInMax,"
    "TRESUsageInTot,TRESUsageOutTot,MaxDiskRead,MaxDiskWrite,MaxRSSNode,MaxRSSTask,MaxVMSizeNode,"
    "MaxVMSizeTask,MaxDiskReadNode,MaxDiskReadTask,MaxDiskWriteNode,MaxDiskWriteTask,Comment"
)
"""The --format of hb-jobinfo's file (corpus/slurm/PROVENANCE.md)."""
HB_FIELDS = HB_FORMAT.split(",")


def rows_of(name: str, fields: Any = SACCT_FIELDS, **kw: Any) -> list[SacctRow]:
    out = list(parse_sacct((SLURM / name).read_text(encoding="utf-8"), fields, CET_2, place=name, **kw))
    problems = [str(p) for p in out if isinstance(p, Problem)]
    assert problems == []
    return [r for r in out if isinstance(r, SacctRow)]


def as_json(job: SlurmJob) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(msgspec.json.encode(job))
    return data


def state_counts(rows: list[SacctRow]) -> Counter[str]:
    return Counter(r.state if r.cancelled_by is None else "CANCELLED by N" for r in rows)


# --- the corpus parses, with the counts PROVENANCE.md gives ----------------------------------------------


def test_running_pending_file_counts() -> None:
    rows = rows_of("sonar_sacct_output_running-pending.txt")
    assert len(rows) == 301
    assert state_counts(rows) == {
        "COMPLETED": 153,
        "RUNNING": 100,
        "PENDING": 31,
        "CANCELLED": 4,
        "FAILED": 4,
        "CANCELLED by N": 5,
        "TIMEOUT": 3,
        "OUT_OF_MEMORY": 1,
    }
    steps = Counter(r.step for r in rows)
    assert steps["interactive"] > 0 and steps["batch"] > 0 and steps["extern"] > 0
    pending = [r for r in rows if r.state == "PENDING"]
    assert all(r.node_list == "" and r.start is None and r.end is None for r in pending)
    assert all(r.elapsed_raw == 0 for r in pending)


def test_completed_file_counts() -> None:
    rows = rows_of("sonar_sacct-output_completed.txt")
    assert len(rows) == 96
    assert state_counts(rows) == {
        "COMPLETED": 74,
        "CANCELLED": 8,
        "CANCELLED by N": 3,
        "FAILED": 7,
        "OUT_OF_MEMORY": 2,
        "TIMEOUT": 2,
    }
    assert {r.layout for r in rows} == {"", "Cyclic", "Block", "Unknown"}
    first_step = rows[3]  # 973821.0
    assert first_step.job == JobId(973821, "0")
    assert first_step.ave_cpu == 11 * 3600 + 29 * 60 + 20
    assert first_step.ave_disk_read == 11067444  # 10808.05M -> ceil(10808.05 * 1024)
    assert first_step.max_rss == 10121984
    assert first_step.user_cpu == 11 * 3600 + 6 * 60 + 30
    assert first_step.system_cpu == pytest.approx(22 * 60 + 52.760)


def test_hb_jobinfo_snowman_file_counts_and_shapes() -> None:
    rows = rows_of(
        "hb-jobinfo_sacct_snowman-delimited.txt", HB_FIELDS, delimiter="☃", trailing_delimiter=True
    )
    assert len(rows) == 242
    assert state_counts(rows) == {
        "COMPLETED": 182,
        "FAILED": 17,
        "CANCELLED": 11,
        "CANCELLED by N": 8,
        "RUNNING": 9,
        "PENDING": 7,
        "TIMEOUT": 7,
        "NODE_FAIL": 1,
    }
    by_id = {(r.job.base if r.job else 0, r.job.array_task_id if r.job else None, r.step): r for r in rows}
    array_task = by_id[(5908801, 3, "")]
    assert array_task.job_id == 5908801  # no JobIDRaw in this field list: the displayed id is all we have
    assert array_task.time_limit == 2 * 24 * 60
    assert array_task.req_mem_kib == 125000 * 1024
    never_started = by_id[(4047445, None, "")]
    assert (
        never_started.start is None
        and never_started.node_list == ""
        and never_started.cancelled_by == 10290820
    )
    multi = [r for r in rows if "[" in r.node_list]
    assert {r.node_list for r in multi} >= {"omni[2-3]"}
    with_usage = [r for r in rows if "TRESUsageInMax" in r.extra]
    assert with_usage and all("=" in r.extra["TRESUsageInMax"] for r in with_usage)
    assert any(r.max_disk_read == 912651 for r in rows)  # 891.26M
    assert any(isinstance(r.user_cpu, float) for r in rows)  # MM:SS.mmm kept exact
    assert all(r.submit is not None and r.submit.utcoffset() == timedelta(hours=2) for r in rows)


# --- golden: Sonar's own expected output for the running/pending file ---------------------------------------


def expected_slurm_jobs() -> list[dict[str, Any]]:
    envelope = json.loads((SLURM / "sonar_sacct_output_expected-sonar-json.json").read_text())
    jobs: list[dict[str, Any]] = envelope["data"]["attributes"]["slurm_jobs"]
    return jobs


def test_golden_sonar_compat_reproduces_sonar_record_for_record() -> None:
    rows = rows_of("sonar_sacct_output_running-pending.txt")
    expected = expected_slurm_jobs()
    assert len(rows) == len(expected) == 301
    for row, want in zip(rows, expected, strict=True):
        job = to_slurm_job(row, sonar_compat=True)
        assert as_json(job) == want, f"line {row.line}"
        # and what we emit passes the Sonar schema's own type checks
        assert msgspec.json.decode(msgspec.json.encode(job), type=SlurmJob) == job


def test_default_mode_differs_from_sonar_only_where_documented() -> None:
    """Every difference between the default mode and Sonar's output, enumerated: CANCELLED by N loses the
    uid (spec: the bare state word) and durations printed with a fraction keep their whole seconds."""
    rows = rows_of("sonar_sacct_output_running-pending.txt")
    differing: dict[str, set[str]] = {}
    for row, want in zip(rows, expected_slurm_jobs(), strict=True):
        got = as_json(to_slurm_job(row))
        keys = {k for k in got.keys() | want.keys() if k != "sacct" and got.get(k) != want.get(k)}
        keys |= {
            f"sacct.{k}"
            for k in got.get("sacct", {}).keys() | want.get("sacct", {}).keys()
            if got.get("sacct", {}).get(k) != want.get("sacct", {}).get(k)
        }
        if keys:
            differing[f"{row.job_id}.{row.step}" if row.step else str(row.job_id)] = keys
        if "job_state" in keys:
            assert row.cancelled_by is not None
            assert got["job_state"] == "CANCELLED" and want["job_state"] == f"CANCELLED by {row.cancelled_by}"
        for key in keys - {"job_state"}:
            field = {"sacct.UserCPU": row.user_cpu, "sacct.SystemCPU": row.system_cpu}[key]
            assert isinstance(field, float)  # only values printed as MM:SS.mmm
    assert set().union(*differing.values()) == {"job_state", "sacct.UserCPU", "sacct.SystemCPU"}
    # PROVENANCE's example row: SystemCPU=14:50.006 and UserCPU=45:21.005 on 1955319.batch
    assert differing["1955319.batch"] == {"sacct.UserCPU", "sacct.SystemCPU"}
    batch = next(r for r in rows if r.job_id == 1955319 and r.step == "batch")
    sonar = to_slurm_job(batch, sonar_compat=True).sacct
    exact = to_slurm_job(batch).sacct
    assert sonar is not None and exact is not None
    assert (sonar.system_cpu, sonar.user_cpu) == (840, 2700)
    assert (exact.system_cpu, exact.user_cpu) == (890, 2721)
    cancelled = [k for k, v in differing.items() if "job_state" in v]
    assert len(cancelled) == 5


def test_golden_conversion_quirks_spelled_out() -> None:
    rows = rows_of("sonar_sacct_output_running-pending.txt")
    first = as_json(to_slurm_job(rows[0]))
    assert first["time_limit"] == 20160 * 60 + 2  # minutes * 60 + 2, although the spec says minutes
    assert first["priority"] == 11429 + 2
    assert first["requested_memory_per_node"] == 128 * 1024 * 1024
    assert first["submit_time"] == "2025-09-07T22:16:06+02:00"
    assert "end_time" not in first  # End=Unknown
    assert first["sacct"] == {
        "AllocTRES": "billing=32,cpu=32,gres/gpu:a100=1,gres/gpu=1,mem=128G,node=1",
        "ElapsedRaw": 1192379,
    }
    failed = next(as_json(to_slurm_job(r)) for r in rows if r.exit_status == 1)
    assert failed["exit_code"] == 1
    oom_step = next(r for r in rows if r.state == "OUT_OF_MEMORY")
    assert oom_step.exit_signal == 125 and "exit_code" not in as_json(to_slurm_job(oom_step))
    two_nodes = next(r for r in rows if r.node_list == "c1-[9-10]")
    assert as_json(to_slurm_job(two_nodes))["nodes"] == ["c1-[9-10]"]


# --- every corpus row converts to a schema-valid SlurmJob ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fields", "kw"),
    [
        ("sonar_sacct-output_completed.txt", SACCT_FIELDS, {}),
        ("sonar_sacct_output_running-pending.txt", SACCT_FIELDS, {}),
        ("hb-jobinfo_sacct_snowman-delimited.txt", HB_FIELDS, {"delimiter": "☃", "trailing_delimiter": True}),
    ],
)
def test_every_corpus_row_is_a_valid_slurm_job(name: str, fields: Any, kw: Any) -> None:
    for row in rows_of(name, fields, **kw):
        for compat in (False, True):
            job = to_slurm_job(row, sonar_compat=compat)
            assert msgspec.json.decode(msgspec.json.encode(job), type=SlurmJob) == job


# --- line-level behaviour -------------------------------------------------------------------------------------

GOOD = (
    "1879824|1879824|uc-10000|ac10000|RUNNING|2025-09-12T14:06:12|Unknown||||||1192379|0:0|||||32|128G|1||"
    "2025-09-07T22:16:06|00:00:00|00:00:00|20160|00:00:00|gpu-2|accel_long|billing=32,cpu=32,mem=128G,node=1|11429|"
)


def line(job_name: str = "name", **changes: str) -> str:
    parts = [*GOOD.split("|")[:-1], job_name]
    for field, value in changes.items():
        parts[SACCT_FIELDS.index(field)] = value
    return "|".join(parts)


def test_bad_lines_become_problems_and_parsing_goes_on() -> None:
    text = "\n".join(
        [
            line("first"),
            "1|2|3",
            line(AveCPU="12:61:00"),
            line(JobID="oops"),
            "",
            line(Submit="2025-02-30T00:00:00"),
            line("last"),
        ]
    )
    out = list(parse_sacct(text, SACCT_FIELDS, CET_2, place="sacct.out"))
    assert [type(x).__name__ for x in out] == [
        "SacctRow",
        "Problem",
        "Problem",
        "Problem",
        "Problem",
        "SacctRow",
    ]
    problems = [p for p in out if isinstance(p, Problem)]
    assert [(p.line, p.path) for p in problems] == [(2, ""), (3, "AveCPU"), (4, "JobID"), (6, "Submit")]
    assert "3 fields, expected 32" in problems[0].reason
    assert str(problems[1]).startswith("sacct.out:3: sacct: AveCPU: duration '12:61:00'")
    rows = [r for r in out if isinstance(r, SacctRow)]
    assert [r.job_name for r in rows] == ["first", "last"]
    assert rows[1].line == 7


def test_job_name_with_delimiter_is_rejoined() -> None:
    row = parse_sacct_line(line("a|b||c"), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    # Sonar joins the excess with "" (its output would say "abc"); the name sacct printed is "a|b||c"
    assert row.job_name == "a|b||c"
    assert row.partition == "accel_long"


def test_delimiter_inside_a_non_final_column_is_a_problem() -> None:
    fields = ["JobID", "JobName", "State"]
    problem = parse_sacct_line("1|a|b|RUNNING", fields, CET_2, lineno=9)
    assert isinstance(problem, Problem)
    assert problem.line == 9 and "4 fields, expected 3" in problem.reason


def test_trailing_delimiter_form() -> None:
    fields = ["JobID", "State", "JobName"]
    out = list(
        parse_sacct("1☃RUNNING☃x☃y☃\n2☃PENDING☃z", fields, CET_2, delimiter="☃", trailing_delimiter=True)
    )
    assert isinstance(out[0], SacctRow) and out[0].job_name == "x☃y"
    assert isinstance(out[1], Problem) and "does not end with the delimiter" in out[1].reason


def test_header_blank_and_crlf_lines_are_skipped() -> None:
    text = "|".join(SACCT_FIELDS) + "\r\n\r\n" + line("x") + "\r\n"
    out = list(parse_sacct(text.splitlines(keepends=True), SACCT_FIELDS, CET_2))
    assert len(out) == 1 and isinstance(out[0], SacctRow) and out[0].job_name == "x" and out[0].line == 3


def test_field_names_match_case_insensitively_and_unknown_ones_are_kept() -> None:
    row = parse_sacct_line(
        "7|completed-ish|COMPLETED|hello", ["jobid", "Comment2", "STATE", "WorkDir"], CET_2
    )
    assert isinstance(row, SacctRow)
    assert row.job == JobId(7) and row.state == "COMPLETED"
    assert row.extra == {"Comment2": "completed-ish", "WorkDir": "hello"}


def test_field_list_errors() -> None:
    with pytest.raises(ValueError, match="repeats"):
        list(parse_sacct("", ["JobID", "jobid"], CET_2))
    with pytest.raises(ValueError, match="empty"):
        list(parse_sacct("", [], CET_2))
    problem = parse_sacct_line("RUNNING|x", ["State", "JobName"], CET_2)
    assert isinstance(problem, Problem) and "no JobID or JobIDRaw" in problem.reason


# --- conversion of the id forms, limits and memory ---------------------------------------------------------------


def convert(**changes: str) -> dict[str, Any]:
    row = parse_sacct_line(line(**changes), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow), row
    return as_json(to_slurm_job(row))


def test_array_task_uses_its_own_job_id() -> None:
    job = convert(JobID="1467073_3.extern", JobIDRaw="1467075.extern")
    assert (job["job_id"], job["job_step"], job["array_job_id"], job["array_task_id"]) == (
        1467075,
        "extern",
        1467073,
        3,
    )
    assert "het_job_id" not in job


def test_pending_array_has_no_task_id() -> None:
    job = convert(JobID="123_[1-5%2]", JobIDRaw="123", State="PENDING", NodeList="None assigned")
    assert job["job_id"] == 123 and job["array_job_id"] == 123 and "array_task_id" not in job
    assert "nodes" not in job


def test_het_job_component() -> None:
    job = convert(JobID="1467921+1.0", JobIDRaw="1467922.0")
    assert (job["job_id"], job["job_step"], job["het_job_id"], job["het_job_offset"]) == (
        1467922,
        "0",
        1467921,
        1,
    )
    first = convert(JobID="1467921+0", JobIDRaw="1467921")
    assert first["het_job_id"] == 1467921 and "het_job_offset" not in first  # zero is omitted, as in Sonar


def test_limits_and_memory() -> None:
    assert convert(TimelimitRaw="UNLIMITED")["time_limit"] == 1
    assert "time_limit" not in convert(TimelimitRaw="Partition_Limit")
    assert convert(TimelimitRaw="0")["time_limit"] == 2
    assert convert(Priority="0")["priority"] == 2
    assert convert(ReqMem="4000Mn")["requested_memory_per_node"] == 4000 * 1024
    assert "requested_memory_per_node" not in convert(ReqMem="4000Mc")  # per CPU is not per node
    row = parse_sacct_line(line(TimelimitRaw="UNLIMITED"), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow) and row.time_limit == UNLIMITED


def test_unknown_names_are_dropped_but_unknown_layout_is_kept() -> None:
    job = convert(
        User="Unknown", Account="Unknown", Layout="Unknown", Reservation="Unknown", JobName="Unknown"
    )
    assert (
        "user_name" not in job and "account" not in job and "reservation" not in job and "job_name" not in job
    )
    assert job["distribution"] == "Unknown"


def test_cancelled_by_and_requested_resources_and_zone() -> None:
    row = parse_sacct_line(line(State="CANCELLED by 2101037", End="2025-09-26T08:02:35"), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    assert row.state == "CANCELLED" and row.cancelled_by == 2101037
    assert as_json(to_slurm_job(row))["job_state"] == "CANCELLED"
    assert as_json(to_slurm_job(row, sonar_compat=True))["job_state"] == "CANCELLED by 2101037"
    job = as_json(to_slurm_job(row, UTC, requested_resources={"1879824": "cpu=32,mem=128G,node=1"}))
    assert job["requested_resources"] == "cpu=32,mem=128G,node=1"
    assert job["end_time"] == "2025-09-26T06:02:35+00:00"
    assert job["submit_time"] == "2025-09-07T20:16:06+00:00"


def test_rows_sonar_cannot_carry_are_refused() -> None:
    row = parse_sacct_line(line(Submit=""), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    with pytest.raises(ValueError, match="no Submit"):
        to_slurm_job(row)
    row = parse_sacct_line(line(State=""), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    with pytest.raises(ValueError, match="no State"):
        to_slurm_job(row)
    row = parse_sacct_line(line(JobID="0", JobIDRaw="0"), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    with pytest.raises(ValueError, match="positive"):
        to_slurm_job(row)


def test_sacct_argv() -> None:
    argv = sacct_argv("now-90minutes", "now")
    assert argv[:2] == ["sacct", "-aP"]
    assert argv[argv.index("-o") + 1] == ",".join(SACCT_FIELDS)
    assert argv[argv.index("-s") + 1].split(",") == [
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "OUT_OF_MEMORY",
        "TIMEOUT",
        "PENDING",
        "RUNNING",
    ]
    assert argv[-4:] == ["-S", "now-90minutes", "-E", "now"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=30))
def test_any_job_name_survives(name: str) -> None:
    row = parse_sacct_line(line(name), SACCT_FIELDS, CET_2)
    assert isinstance(row, SacctRow)
    assert row.job_name == name
