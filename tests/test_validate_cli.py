"""`hpcbus validate`: exit codes, one line per problem with PATH:LINE, Sonar vs line protocol detection."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from hpcbus import cli
from hpcbus.commands import inputs, validate
from tests.corpus import CORPUS


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = cli.main(["validate", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_valid_line_protocol_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, str(CORPUS / "clustercockpit/lineprotocol/cc-lib-examples.lp"))
    assert (code, out) == (0, [])


def test_bad_lines_are_listed_with_line_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    path = CORPUS / "clustercockpit/lineprotocol/cc-backend-nats-edge-cases.lp"
    code, out = run(capsys, str(path))
    assert code == 1
    assert [line.split(": ")[0] for line in out] == [f"{path}:{n}" for n in (1, 2, 5, 8)]
    # Both tags it lacks, in one run (issue 23: the type tag used to come up only after the hostname's fix).
    assert out[0] == (
        f"{path}:1: lp metric: tags hostname, type: a metric needs a hostname tag and a type tag "
        "(node, socket, ..., hwthread, accelerator)"
    )


def test_warnings_do_not_fail_and_quiet_hides_them(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CORPUS / "clustercockpit/lineprotocol/cc-specifications-examples.lp")
    code, out = run(capsys, path)
    assert code == 0 and len(out) == 2 and all(": warning: " in line for line in out)
    assert run(capsys, "--quiet", path) == (0, [])


def test_sonar_file_is_detected_and_problems_carry_the_envelope_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = CORPUS / "sonar/sonar__newfmt_sysinfo.json"
    code, out = run(capsys, str(path))
    assert code == 1
    assert out == [
        f"{path}:67: sonar sysinfo: data.attributes.os: unknown field (not part of this object in the Sonar format)",
        f"{path}:67: sonar sysinfo: data.attributes.os-version: unknown field (not part of this object in the Sonar format)",
        # os_name/os_release absent: no longer "missing required field" (optional since issue 10)
    ]


def test_jsonl_with_a_broken_line_reports_it_and_checks_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = (CORPUS / "sonar/jobanalyzer__cluster1_sample_v0.19.jsonl").read_text().strip()
    bad = json.loads(good)
    bad["data"]["attributes"]["jobs"][0]["processes"][0]["pid"] = -3
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([good, '{"meta": {', json.dumps(bad), good]) + "\n")
    code, out = run(capsys, str(f))
    assert code == 1
    assert len(out) == 2
    assert out[0].startswith(f"{f}:2: sonar envelope: ")
    assert out[1].startswith(f"{f}:3: sonar sample: data.attributes.jobs[0].processes[0].pid: ")


def test_stdin_and_json_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("m,hostname=a,type=node value=1\nm,hostname=a value=2\n"))
    code, out = run(capsys, "--json", "-")
    assert code == 1
    (record,) = [json.loads(line) for line in out]
    assert record == {
        "reason": "a metric needs a type tag (node, socket, ..., hwthread, accelerator)",
        "place": "-",
        "line": 2,
        "kind": "lp metric",
        "path": "tag type",
    }


def test_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["validate", str(tmp_path / "nope.lp")])
    assert code == 2
    assert "No such file" in capsys.readouterr().err


def test_line_numbers_stay_right_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "LP_CHUNK_LINES", 7)
    lines = ["m,hostname=a,type=node value=1 1700000000"] * 30
    lines[22] = "broken"
    f = tmp_path / "big.lp"
    f.write_text("\n".join(lines) + "\n")
    assert [p.line for p in validate.problems_of(str(f))] == [23]


def test_jobs_records_with_only_the_mandatory_fields_are_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 10: only job_id, job_step, job_name and job_state are mandatory in a SlurmJob record."""
    from tests.test_sonar_jsonschema import FOUR, MIXED, minimal_jobs

    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(minimal_jobs(r)) + "\n" for r in (FOUR, MIXED)))
    assert run(capsys, str(path)) == (0, [])
    path.write_text(json.dumps(minimal_jobs([{"job_id": 1, "job_name": "x"}])))
    code, out = run(capsys, str(path))
    assert (code, out) == (
        1,
        [f"{path}:1: sonar job: data.attributes.slurm_jobs[0].job_state: missing required field"],
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment\n\n# another\n"])
def test_an_empty_input_is_said_not_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """Issue 33: `validate` of an empty file exited 0 in silence, as if what should be in it were valid."""
    path = tmp_path / "empty.lp"
    path.write_text(text)
    code, out = run(capsys, str(path))
    assert code == 1 and out == [
        f"{path}: input: nothing to validate: no line protocol and no Sonar envelope "
        "(empty, or only comments)"
    ]
