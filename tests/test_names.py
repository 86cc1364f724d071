"""Names that are not names (issue 19 section 3, issue 20 items 7 and 8), without services: the rules of
`schemas.names`, host lists in Sonar job records, and every entry's shared reading of them (`parse_payload`,
the gateway's `normalise`, the Sonar decoder, the translation, `consume ingest`'s check, `hpcbus validate`,
`hpcbus pub --validate`). The entries' processes against real services: tests/test_names_entries.py."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus import cli
from hpcbus.schemas import names
from hpcbus.schemas.ccbackend import read_start_job
from hpcbus.schemas.foreign import normalise
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import PartlyInvalid, decode_envelope
from hpcbus.schemas.sonar.types import JobsEnvelope
from hpcbus.schemas.translate import jobs_to_lines
from hpcbus.schemas.translate.common import tag_value
from hpcbus.schemas.trust import Sender, check_lines
from tests.corpus import CORPUS

NOW = 1_700_000_000

UNSAFE = {
    "../x": "'/' at offset 2",
    "a/b": "'/' at offset 1",
    "a\\b": "'\\\\' at offset 1",
    "..": "contains '..'",
    "\x1b[31m": "'\\x1b' at offset 0",
    "x\x7f": "'\\x7f' at offset 1",
    "x\x9b1m": "'\\x9b' at offset 1",
    "h" * 300: "longer than",
}
"""Unsafe names -> a part of the reason given for them (the reason quotes the character and its offset)."""

BAD_HOST_LISTS = {
    "": "is empty",
    "c[3-1]": "first number greater than its second",
    "c[1,1]": "number 1 is repeated",
    "c[1-3": "never closed",
    "c1-[5-6],,x": "item 2 is empty (stray comma)",
}
"""The issue's host lists that are not host lists -> what the reason says."""


ESC = "\x1b[31m"
"""An escape sequence (red text on a terminal)."""


def ingest_lines(payload: bytes) -> tuple[list[str], list[Problem], bool]:
    """`consume ingest`'s check of a metrics payload n001 sent on cluster fox."""
    sender = Sender.node("n001", "fox")
    place = "fox.ingest.n001.metrics"
    return check_lines(payload, place, sender, "metrics", "", now=NOW, max_future=DEFAULT_MAX_FUTURE)


def metric(tags: str, value: int = 1) -> str:
    return f"m,{tags},type=node,type-id=0 value={value} {NOW}"


# --- the rules ---------------------------------------------------------------------------------------------


def test_host_and_cluster_names() -> None:
    for good in ("n1", "c1-5", "gpu-2.fox", "n1.cluster1.uio.no", "node_7", "h" * names.HOST_MAX):
        assert names.host_problem(good) is None and names.is_host(good), good
    assert names.cluster_problem("fox.educloud.no") is None  # dots are valid in cluster names
    assert "longer than 253" in (names.host_problem("h" * 254) or "")
    assert "longer than 253" in (names.cluster_problem("c" * 254) or "")
    for bad, why in {
        **UNSAFE,
        "": "is empty",
        ".x": "starts or ends with '.'",
        "x.": "starts or ends with '.'",
        "a..b": "contains '..'",
        "-x": "a label starts with '-'",
        "a b": "' ' at offset 1",
        "a\x00b": "'\\x00' at offset 1",
    }.items():
        for check in (names.host_problem, names.cluster_problem):
            reason = check(bad)
            assert reason is not None and why in reason, (bad, reason)
        assert not names.is_host(bad)
    # a reason quotes the value escaped and cut: it is itself safe to print
    reason = names.host_problem("\x1b[31m" + "h" * 100) or ""
    assert "\x1b" not in reason and "(105 characters)" in reason


def test_job_ids_and_job_names() -> None:
    for good in ("123", "123_4", "123+0", "123.batch", "4242[7].pbs01", "1879824@1700000000"):
        assert names.job_id_problem(good) is None, good
    for bad in ("", "../x", "a/b", "..", "1 2", "\x1b", "9" * 65):
        assert names.job_id_problem(bad) is not None, bad
    assert names.job_name_problem("siamE3F1 run #2 (ü)") is None
    assert "control character '\\x1b'" in (names.job_name_problem("\x1b[2Jjob") or "")
    assert "longer than 1024" in (names.job_name_problem("j" * 1025) or "")


def test_path_components() -> None:
    assert names.path_component_problem("0+sample-n1.fox.json") is None
    for bad in ("", ".", "..", "a/b", "a\\b", "a\x00b", "a..b", "x" * 256):
        assert names.path_component_problem(bad) is not None, bad
    # host and cluster names are path components by construction
    for name in ("n1", "fox.educloud.no", "h" * 253):
        assert names.host_problem(name) is None and names.path_component_problem(name) is None


def test_tag_values() -> None:
    assert names.tag_problem("user", "a/b c") is None  # free text: only controls and length matter
    assert names.tag_problem("user", "u" * names.TAG_VALUE_MAX) is None
    assert "longer than 1024" in (names.tag_problem("user", "u" * 1025) or "")
    assert "'\\t'" in (names.tag_problem("cmd", "a\tb") or "")
    assert names.tags_problem("m", {"hostname": "n1", "host": "n1"}) is None
    path, reason = names.tags_problem("m", {"hostname": "n001", "host": "n002"}) or ("", "")
    assert path == "tag host" and "name two hosts" in reason
    assert names.tags_problem("m\x1b", {})[0] == "measurement"  # type: ignore[index]


BIDI_AND_SEPARATORS = [
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
]
BIDI_AND_SEPARATORS += ["\u2028", "\u2029"]


def test_bidi_controls_and_line_separators_are_control_characters() -> None:
    """`n1\u202e` shows on a dashboard as another name (the override reverses what follows), and U+2028/9
    break a line where none is: refused in tag values and names, escaped in reasons, replaced in tag_value."""
    for char in BIDI_AND_SEPARATORS:
        assert names.has_control(f"n1{char}x"), repr(char)
        reason = names.tag_problem("user", f"al{char}ice") or ""
        assert f"control character {char!r} at offset 2" in reason and char not in reason, reason
        assert names.host_problem(f"n1{char}") is not None
        assert names.tags_problem("m", {"hostname": "n1", "cmd": f"x{char}"}) is not None
        assert tag_value(f"a{char}b") == "a b"
        assert names.safe_text(f"a{char}b", 10) == "a b"
    [problem] = parse_payload(metric("hostname=n1,user=al\u202eice").encode(), now=NOW).problems
    assert problem.path == "tag user" and "'\\u202e'" in problem.reason, problem
    for fine in ("ü", "naïve", "日本", "ƒ123"):  # other non-ASCII text stays
        assert not names.has_control(fine) and names.tag_problem("user", fine) is None


def test_translated_tags_are_made_safe_not_refused() -> None:
    """Sonar's process names and users are free text from the node: the translation makes them safe tag
    values (the envelope keeps the original) rather than losing a whole sample over one process name."""
    assert tag_value("\x1b[31mevil\x7f") == " [31mevil "
    assert tag_value("a\\b\nc") == "a/b c"
    assert len(tag_value("c" * 5000)) == names.TAG_VALUE_MAX
    assert names.tag_problem("cmd", tag_value("\x1b[31m" + "c" * 5000)) is None


# --- line protocol: every entry reads it with parse_payload -------------------------------------------------


@pytest.mark.parametrize("key", ["hostname", "host", "node", "cluster", "job"])
def test_unsafe_names_in_lines_are_refused_with_the_reason_and_good_lines_kept(key: str) -> None:
    good = [metric(f"hostname=n{i}", i) for i in range(3)]
    bad = [
        metric(f"hostname={name}" if key == "hostname" else f"hostname=n1,{key}={name}") for name in UNSAFE
    ]
    payload = "\n".join([good[0], *bad, good[1], metric("hostname=n1,user=" + ESC), good[2]]) + "\n"
    parsed = parse_payload(payload.encode(), now=NOW, place="fox.metrics")
    assert [line.fields["value"] for line in parsed.lines] == [0, 1, 2]  # every good line kept, in order
    errors = parsed.errors
    assert [p.line for p in errors] == [*range(2, 2 + len(UNSAFE)), 3 + len(UNSAFE)]
    for problem, why in zip(errors, [*UNSAFE.values(), "'\\x1b' at offset 0"], strict=True):
        assert problem.place == "fox.metrics" and why in problem.reason, problem
        assert problem.path == ("tag user" if problem.line == 3 + len(UNSAFE) else f"tag {key}")
        assert "\x1b" not in str(problem)  # the reason is printable


def test_a_nul_in_a_line_is_refused() -> None:
    parsed = parse_payload(
        (metric("hostname=a\x00b") + "\n" + metric("hostname=n1") + "\n").encode(), now=NOW
    )
    assert len(parsed.lines) == 1 and "NUL" in parsed.errors[0].reason and parsed.errors[0].line == 1


def test_host_tags_naming_two_hosts_are_refused() -> None:
    parsed = parse_payload(
        f"{metric('hostname=n001,host=n002')}\n{metric('hostname=n001,host=n001')}\n", now=NOW
    )
    assert len(parsed.lines) == 1
    [problem] = parsed.errors
    assert problem.path == "tag host" and "hostname='n001' and host='n002' name two hosts" in problem.reason


def test_fast_path_and_slow_path_agree_on_names() -> None:
    """The fast path checks names with per-payload caches: a name refused once is refused every time, also
    after the same name was seen as valid in another tag."""
    lines = [
        metric("cluster=fox,hostname=n1,job=7"),
        metric("cluster=fox,hostname=n1,job=../7"),
        metric("cluster=../fox,hostname=n1,job=7"),
        metric("cluster=fox,hostname=n1,job=7,node=n2"),
        metric("cluster=fox,hostname=n1,job=7,host=n2"),
        metric("cluster=fox,hostname=n1,job=7,nodename=n2"),
        f"m,hostname=n1,type=node,type-id=0,cmd=a\tb value=1 {NOW}",
        metric("cluster=fox,hostname=n1,job=7"),
    ]
    parsed = parse_payload("\n".join(lines), now=NOW)
    assert len(parsed.lines) == 2 and [p.line for p in parsed.errors] == [2, 3, 4, 5, 6, 7]
    assert names.HOST_TAGS == ("hostname", "host", "node", "nodename")  # as parse.py's fast path has them


def test_gateway_normalise_refuses_unsafe_names_in_every_form() -> None:
    """The gateway's reading (`normalise`): ClusterCockpit lines, Telegraf's multi-field lines (`_foreign`),
    and cc-backend start_job events whose hosts cc-backend would key its metric queries on."""

    def start_job(host: str) -> str:
        payload = {
            "jobId": 1,
            "cluster": "fox",
            "user": "u",
            "resources": [{"hostname": host}],
            "numNodes": 1,
        }
        text = json.dumps({**payload, "startTime": NOW}).replace('"', '\\"')
        return f'job,function=start_job event="{text}" {NOW}'

    body = "\n".join(
        [
            metric("hostname=../x"),
            f"cpu,host=../x usage_user=1,usage_system=2 {NOW}",
            f"cpu,host=n1,cpu=\x1b[31m usage_user=1 {NOW}",
            f"mem,host=n1,hostname=n2 value=3 {NOW}",
            start_job("../x"),
            f"cpu,host=n1 usage_user=1,usage_system=2 {NOW}",
            start_job("n1"),
        ]
    )
    result = normalise(body.encode(), precision="s", cluster="fox", now=NOW, place="POST /write")
    assert [(p.line, p.path) for p in result.errors] == [
        (1, "tag hostname"),
        (2, "tag host"),
        (3, "tag cpu"),
        (4, "tag host"),
        (5, "event resources[0].hostname"),
    ]
    assert all(p.place == "POST /write" for p in result.errors)
    assert "'/' at offset 2" in result.errors[4].reason
    assert result.rejected == 5 and len(result.lines) == 3  # Telegraf's two values and the good start_job


def test_consume_ingest_refuses_a_forged_host_tag() -> None:
    """Issue 20 item 7: `hostname=n001,host=n002` from n001 is refused (whichever tag a reader keys on)."""
    payload = "\n".join(
        [
            metric("cluster=fox,hostname=n001"),
            metric("cluster=fox,hostname=n001,host=n002"),
            metric("cluster=fox,host=n001,nodename=n002"),
            metric("cluster=fox,hostname=n001,user=" + ESC),
            metric("cluster=fox,hostname=n001,host=n001", 2),
        ]
    ).encode()
    good, problems, _ = ingest_lines(payload)
    assert len(good) == 2 and "value=2" in good[1]
    assert [(p.line, p.path) for p in problems] == [(2, "tag host"), (3, "tag nodename"), (4, "tag user")]
    assert "n002" in problems[0].reason and "n002" in problems[1].reason


# --- Sonar: host lists of job records, job names -----------------------------------------------------------

TIME = "2025-05-03T10:00:00+02:00"


def jobs_envelope(*nodes: str, job_name: str = "run", cluster: str = "fox.educloud.no") -> dict[str, Any]:
    records = [
        {"job_id": 1, "job_state": "RUNNING", "start_time": TIME, "user_name": "bob", "nodes": ["c1-[5-6]"]},
        {"job_id": 2, "job_name": job_name, "job_state": "RUNNING", "start_time": TIME, "user_name": "al"},
    ]
    records[1]["nodes"] = list(nodes)
    attrs = {"time": TIME, "cluster": cluster, "slurm_jobs": records}
    return {"meta": {"producer": "sonar", "version": "0.19.0"}, "data": {"type": "job", "attributes": attrs}}


def refusal(envelope: dict[str, Any]) -> list[Problem]:
    with pytest.raises(InvalidInput) as caught:
        decode_envelope(json.dumps(envelope), expect="job")
    return caught.value.problems


def test_job_records_host_lists_follow_sonars_grammar() -> None:
    # Sonar 0.19's compressed ranges and Slurm's placeholder are accepted, as before
    for nodes in (["c1-[5-6,8-9],gpu-[10-12]"], ["c[1-3,5]-[2-4].fox"], ["None assigned"], ["n1", "n2"], []):
        env = decode_envelope(json.dumps(jobs_envelope(*nodes)), expect="job")
        assert isinstance(env, JobsEnvelope)
    for text, why in BAD_HOST_LISTS.items():
        [problem] = refusal(jobs_envelope("c1", text))
        assert problem.path == "data.attributes.slurm_jobs[1].nodes[1]", problem
        assert why in problem.reason and problem.kind == "sonar job", problem
        assert "this record is refused, the others are kept" in problem.reason


def test_a_bad_host_list_refuses_its_record_alone() -> None:
    """Issue 19: "good lines beside it are kept". The other records of the poll are the rest of the envelope
    (`PartlyInvalid.envelope`), valid, for the entry to store; the problem names the record's field."""
    for text in BAD_HOST_LISTS:
        with pytest.raises(PartlyInvalid) as caught:
            decode_envelope(json.dumps(jobs_envelope(text)), expect="job")
        env = caught.value.envelope
        assert isinstance(env, JobsEnvelope) and env.data is not None
        assert [job.job_id for job in env.data.attributes.slurm_jobs] == [1]
        assert [p.path for p in caught.value.problems] == ["data.attributes.slurm_jobs[1].nodes[0]"]
    # two bad records of three: the good one in the middle is kept, both bad ones are named
    doc = jobs_envelope("c[3-1]")
    doc["data"]["attributes"]["slurm_jobs"][0]["nodes"] = ["c1", "c[1-3"]
    doc["data"]["attributes"]["slurm_jobs"].append({"job_id": 3, "job_state": "PENDING", "nodes": ["c7"]})
    with pytest.raises(PartlyInvalid) as caught:
        decode_envelope(json.dumps(doc), expect="job")
    kept = caught.value.envelope.data.attributes.slurm_jobs  # type: ignore[union-attr]
    assert [job.job_id for job in kept] == [3]
    assert [p.path for p in caught.value.problems] == [
        "data.attributes.slurm_jobs[0].nodes[1]",
        "data.attributes.slurm_jobs[1].nodes[0]",
    ]


def test_host_lists_never_stand_for_a_path() -> None:
    """Every name a host list stands for is a host name: `..`, `../x`, `c[1-2]..fox`, `-x` are refused."""
    for text, why in {
        "..": "empty label",
        "../x": "character '/'",
        "c[1-2]..fox": "empty label",
        "c[1-2].": "empty label",
        "n1,.n2": "item 2 ('.n2') has an empty label",
        "-x": "label starting with '-'",
    }.items():
        [problem] = refusal(jobs_envelope(text))
        assert why in problem.reason, (text, problem)


def test_bad_host_lists_are_listed_beside_other_problems() -> None:
    """An envelope msgspec refuses for another reason is walked by `diagnose`: the host list is named too."""
    env = jobs_envelope("c[3-1]")
    env["data"]["attributes"]["slurm_jobs"][0]["job_id"] = "x"
    paths = [p.path for p in refusal(env)]
    assert paths == ["data.attributes.slurm_jobs[0].job_id", "data.attributes.slurm_jobs[1].nodes[0]"]


def test_job_names_are_made_safe_not_refused() -> None:
    """`sbatch -J $'\\x1b[31mx'` is any user's to type: the job is kept, its name made safe (control
    characters, bidi controls and line separators become spaces; over 1024 characters are cut)."""
    for name, safe in (
        ("\x1b[31mjob", " [31mjob"),
        ("a\x00b\x7fc\u202ed\u2028e", "a b c d e"),
        ("j" * 5000, "j" * names.JOB_NAME_MAX),
        ("siamE3F1 run #2 (ü)", "siamE3F1 run #2 (ü)"),
    ):
        env = decode_envelope(json.dumps(jobs_envelope("n1", job_name=name)), expect="job")
        assert isinstance(env, JobsEnvelope) and env.data is not None
        assert [job.job_name for job in env.data.attributes.slurm_jobs] == ["", safe]


def test_translation_names_the_bad_host_list_not_nodes_absent() -> None:
    """An envelope that skipped validation (built in Python) with `c[3-1]`: no start_job for that record, and
    the warning gives the field and the reason instead of "nodes absent"."""
    env = msgspec.convert(jobs_envelope("c[3-1]"), JobsEnvelope)
    problems: list[Problem] = []
    lines = jobs_to_lines(env, problems=problems)
    starts = [
        json.loads(str(line.fields["event"])) for line in lines if line.tags.get("function") == "start_job"
    ]
    assert [p["jobId"] for p in starts] == [1]
    [warning] = problems
    assert warning.path == "data.attributes.slurm_jobs[1].nodes[0]" and warning.severity == "warning"
    assert "first number greater than its second" in warning.reason and "absent" not in warning.reason


def test_start_job_events_with_unsafe_names_are_refused_by_their_readers() -> None:
    """consume jobs and the LP -> Sonar assembler read start_job payloads with `read_start_job`."""
    base = {"jobId": 1, "cluster": "fox", "user": "u", "resources": [{"hostname": "n1"}], "startTime": NOW}
    assert read_start_job(json.dumps(base)).resources[0].hostname == "n1"
    for change, path in (
        ({"resources": [{"hostname": "n1"}, {"hostname": "../x"}]}, "resources[1].hostname"),
        ({"cluster": "a/b"}, "cluster"),
        ({"user": "\x1b[31m"}, "user"),
    ):
        with pytest.raises(
            msgspec.ValidationError, match=rf"at `\$\.{path.replace('[', '.').replace(']', '.')}"
        ):
            read_start_job(json.dumps({**base, **change}))
    # the job name is the user's free text, not a key: made safe, never a reason to refuse the start_job
    for name, safe in (("a\x00b\x1b[31m", "a b [31m"), ("n" * 3000, "n" * names.JOB_NAME_MAX)):
        start = read_start_job(json.dumps({**base, "metaData": {"jobName": name}}))
        assert start.meta_data["jobName"] == safe and start.resources[0].hostname == "n1"


# --- hpcbus validate, hpcbus pub --validate ----------------------------------------------------------------


def test_validate_reports_the_place_and_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lp = tmp_path / "in.lp"
    lp.write_text(f"{metric('hostname=n1')}\n{metric('hostname=../x')}\n{metric('hostname=n1,host=n2')}\n")
    assert cli.main(["validate", str(lp)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{lp}:2: lp: tag hostname: host name '../x': character '/'")
    assert out[1].startswith(f"{lp}:3: lp: tag host: hostname='n1' and host='n2' name two hosts")
    sonar = tmp_path / "jobs.json"
    sonar.write_text(json.dumps(jobs_envelope("c1-[5-6],,x")) + "\n")
    assert cli.main(["validate", str(sonar)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{sonar}:1: sonar job: data.attributes.slurm_jobs[1].nodes[0]: node range 'c1-[5-6],,x': item 2 is "
        "empty (stray comma); this record is refused, the others are kept"
    ]


def test_pub_validate_refuses_unsafe_names_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    body = metric("hostname=n1") + "\n" + metric("hostname=n1,user=" + ESC) + "\n"
    # nothing listens on port 1: the refusal comes before any connection
    assert cli.main(["pub", "--validate", "-s", "nats://127.0.0.1:1", "fox.metrics", body]) == 1
    err = capsys.readouterr().err
    assert "fox.metrics:2: lp: tag user: tag value '\\x1b[31m' holds the control character" in err
    assert "hpcbus pub: not sent: " in err


def test_pub_validate_reads_sonar_subjects_as_envelopes(capsys: pytest.CaptureFixture[str]) -> None:
    body = json.dumps(jobs_envelope("c[1,1]", cluster="fox")) + "\n"
    assert cli.main(["pub", "--validate", "-s", "nats://127.0.0.1:1", "fox.sonar.job", body]) == 1
    err = capsys.readouterr().err
    assert "fox.sonar.job:1: sonar job: data.attributes.slurm_jobs[1].nodes[0]: node range 'c[1,1]'" in err
    assert "number 1 is repeated" in err and "hpcbus pub: not sent: " in err


def test_consume_jobs_refuses_a_start_job_naming_an_unsafe_host() -> None:
    """consume jobs' reader of cc-backend events: the job is not opened, the problem names the field."""
    from hpcbus.consumers.jobs.records import add_event
    from hpcbus.schemas.jobsummary import Limits, State
    from hpcbus.schemas.lineprotocol import Line

    state = State()
    payload = {"jobId": 7, "cluster": "c", "user": "u", "resources": [{"hostname": "../x"}], "startTime": NOW}
    event = Line("job", {"function": "start_job"}, {"event": json.dumps(payload)}, NOW)
    (problem,) = add_event(state, "c", event, NOW, Limits(window=30), "c.events.job")
    assert "host name '../x'" in problem.reason and "resources.0.hostname" not in problem.reason
    assert "$.resources[0].hostname" in problem.reason and problem.place == "c.events.job"
    assert not state.jobs


def test_consume_jobs_reads_the_other_records_of_an_envelope_with_a_bad_host_list() -> None:
    """consume jobs' reader of Slurm jobs envelopes: the record with `c[3-1]` is refused alone (the problem
    names it), job 1 beside it is opened; a start_job with an escape sequence in its name is opened too."""
    from hpcbus.consumers.jobs.records import add_event
    from hpcbus.schemas.jobsummary import Limits, State
    from hpcbus.schemas.lineprotocol import Line

    state = State()
    envelope = json.dumps(jobs_envelope("c[3-1]", cluster="c"))
    event = Line("slurm", {"function": "sonar"}, {"event": envelope}, NOW)
    (problem,) = add_event(state, "c", event, NOW, Limits(window=30), "c.events.slurm")
    assert problem.path == "data.attributes.slurm_jobs[1].nodes[0]" and problem.place == "c.events.slurm"
    assert "first number greater than its second" in problem.reason
    assert list(state.jobs) == ["c\t1"], state.jobs
    start = {"jobId": 7, "cluster": "c", "user": "u", "resources": [{"hostname": "n1"}], "startTime": NOW}
    start["metaData"] = {"jobName": ESC + "x"}
    event = Line("job", {"function": "start_job"}, {"event": json.dumps(start)}, NOW)
    assert add_event(state, "c", event, NOW, Limits(window=30), "c.events.job") == []
    assert sorted(state.jobs) == ["c\t1", "c\t7"]


# --- issue 29 item 8: every name that reaches the bus ------------------------------------------------------

BAD_MEASUREMENTS = {
    "a/b": "'/' at offset 1",
    "a\\b": "'\\\\' at offset 1",  # a backslash, a path separator elsewhere
    "a.b": "'.' at offset 1",
    "..": "'.' at offset 0",
    "a*": "'*' at offset 1",
    "a>": "'>' at offset 1",
    "a\\ b": "' ' at offset 1",  # an escaped space in a line
    "a\x1b[31m": "control character '\\x1b' at offset 1",
}
"""Measurement texts as written in a line -> a part of the reason given for them."""


def test_measurement_event_class_and_log_component_rule() -> None:
    for good in ("cpu_load", "flops_any", "nodestate", "slurm_energy_power", "job", "Mem-Used", "ü"):
        assert names.measurement_problem(good) is None, good
    for bad, why in (
        ("a/b", "'/'"),
        ("a.b", "'.'"),
        ("a*", "'*'"),
        ("a>", "'>'"),
        ("a b", "' '"),
        ("", "empty"),
    ):
        assert why in (names.measurement_problem(bad) or ""), bad
    assert (names.measurement_problem("a.b", "event class") or "").startswith("event class 'a.b': character")


@pytest.mark.parametrize(
    ("kind", "what"),
    [("value=1", "measurement"), ('event="{}"', "event class"), ('log="x"', "log component")],
)
def test_unsafe_measurements_event_classes_and_log_components_are_refused(kind: str, what: str) -> None:
    """`/` in a measurement or an event class was stored; they are subject tokens and store keys: refused with
    the reason at every entry (here parse_payload, which they all use), the good lines beside them kept."""
    tags = "hostname=n1,type=node" if kind.startswith("value") else "type=node"
    lines = [f"ok,{tags} {kind} {NOW}"] + [f"{name},{tags} {kind} {NOW}" for name in BAD_MEASUREMENTS]
    parsed = parse_payload(("\n".join([*lines, lines[0]]) + "\n").encode(), now=NOW)
    assert [line.measurement for line in parsed.lines] == ["ok", "ok"]
    assert [p.line for p in parsed.errors] == list(range(2, 2 + len(BAD_MEASUREMENTS)))
    for problem, why in zip(parsed.errors, BAD_MEASUREMENTS.values(), strict=True):
        assert problem.path == "measurement" and problem.reason.startswith(what + " "), problem
        assert why in problem.reason and "\x1b" not in problem.reason, problem


def test_type_id_is_a_device_id() -> None:
    """The metric store keys the level below the host with `type`+`type-id` (and `stype`+`stype-id`): a
    `type-id` (and an `stype`, a node-level line's `type-id` on the bus) is a device id, never `../../x`."""
    for good in (
        "0",
        "17",
        "00000000:3B:00.0",
        "GPU-5c89852c-d268-c3f3-1b07-005d5ae455ee",
        "GPU-1#2",
        "disk",
    ):
        assert names.device_id_problem(good) is None, good
    for bad in ("../../x", "a/b", "..", ".", "a..b", "a b", "a\\b", "x" * 65, "GPU\x1b"):
        assert names.device_id_problem(bad) is not None, bad
    lines = [
        f"m,hostname=n1,type=socket,type-id=0 value=1 {NOW}",
        f"m,hostname=n1,type=socket,type-id=../../x value=1 {NOW}",
        f"m,hostname=n1,type=socket,type-id=a..b,cluster=fox value=1 {NOW}",
        f"m,hostname=n1,type=node,stype=../x,stype-id=/homes value=1 {NOW}",
        f"m,hostname=n1,type=socket,type-id=0,stype=a/b value=1 {NOW}",
        f"m,hostname=n1,type=accelerator,type-id=00000000:3B:00.0 value=1 {NOW}",
        f"m,hostname=n1,type=node,stype=filesystem,stype-id=/homes value=1 {NOW}",  # the spec's own example
        f'job,function=start_job,type=socket,type-id=../x event="{{}}" {NOW}',
    ]
    parsed = parse_payload("\n".join(lines), now=NOW)
    assert [p.line for p in parsed.errors] == [2, 3, 4, 5, 8]
    assert [p.path for p in parsed.errors] == [
        "tag type-id",
        "tag type-id",
        "tag stype",
        "tag stype",
        "tag type-id",
    ]
    assert "type-id '../../x': character '/' at offset 2" in parsed.errors[0].reason
    assert [line.tags.get("type-id") for line in parsed.lines] == ["0", "00000000:3B:00.0", "filesystem"]
    assert names.DEVICE_TAGS == ("type-id", "stype")  # as parse.py's fast path (`_names_ok`) has them


def test_the_fast_paths_numeric_device_ids_are_ascii_numbers_only() -> None:
    """The fast path takes a run of ASCII digits as a device id without asking `names` (most lines are a
    CPU's); digits of other scripts (`str.isdigit` says True for them) and over-long ones still go to the
    slow path and are refused there, with or without a cluster tag."""
    ok = ["0", "17", "1" * 64]
    bad = ["\u00b2", "\u0663", "1" * 65]
    for cluster in ("", ",cluster=fox"):
        lines = [f"m,hostname=n1,type=hwthread{cluster},type-id={i} value=1 {NOW}" for i in ok + bad]
        parsed = parse_payload("\n".join(lines), now=NOW)
        assert [line.tags["type-id"] for line in parsed.lines] == ok, cluster
        assert [(p.line, p.path) for p in parsed.errors] == [
            (4, "tag type-id"),
            (5, "tag type-id"),
            (6, "tag type-id"),
        ]


def test_field_keys_and_fields_per_line() -> None:
    """A field key is a name too (control characters refused); a line carries at most FIELDS_MAX fields."""
    wide = ",".join(f"f{i}=1" for i in range(names.FIELDS_MAX))
    lines = [
        f"m,hostname=n1,type=node value=1,usage{ESC}=2 {NOW}",
        f"m,hostname=n1,type=node value=1,{wide} {NOW}",  # one more than the limit
        f"m,hostname=n1,type=node {wide} {NOW}".replace("f0=1", "value=1"),  # exactly the limit
    ]
    parsed = parse_payload("\n".join(lines), now=NOW)
    assert [(p.line, p.path) for p in parsed.errors] == [(1, "field 'usage\\x1b[31m'"), (2, "fields")]
    assert "holds the control character '\\x1b'" in parsed.errors[0].reason
    assert f"1001 fields in one line, more than {names.FIELDS_MAX}" in parsed.errors[1].reason
    assert len(parsed.lines) == 1 and len(parsed.lines[0].fields) == names.FIELDS_MAX


def test_gateway_normalise_refuses_names_made_of_field_keys_and_wide_lines() -> None:
    """Issue 29 item 8 at the gateway's reading: an ESC in a Telegraf field key (it became the measurement
    `cpu_usage\\x1b[31m` and passed), a field key that makes no measurement name (`usage.user`), a line of
    10,000 fields (10,000 new measurements) and `type-id=../../x` are refused with the reason; every good
    line and value beside them is published."""
    wide = ",".join(f"f{i}=1" for i in range(10_000))
    body = "\n".join(
        [
            f"cpu,host=n1 usage_user=1,usage_system=2 {NOW}",
            f"cpu,host=n1 usage{ESC}=1,usage_system=2 {NOW}",
            f"cpu,host=n1 usage.user=1,usage_system=2 {NOW}",
            f"wide,host=n1 {wide} {NOW}",
            f"cpu,host=n1,cpu=cpu0,type=hwthread,type-id=../../x usage_user=1 {NOW}",
            f"m,host=n1,type=socket,type-id=../../x value=1 {NOW}",
            f"RSS,job=17,step=0,task=a.b,host=n1 value=1 {NOW}",  # Slurm's profile plugin: a task is a word
            f"mem,host=n1 used=3 {NOW}",
        ]
    )
    result = normalise(body.encode(), precision="s", cluster="fox", now=NOW, place="POST /write")
    assert [(p.line, p.path) for p in result.errors] == [
        (2, "field 'usage\\x1b[31m'"),
        (3, "field usage.user"),
        (4, "fields"),
        (5, "tag type-id"),
        (6, "tag type-id"),
        (7, "tag task"),
    ]
    assert "'.' at offset 9" in result.errors[1].reason and "cpu_usage.user" in result.errors[1].reason
    assert "10000 fields in one line, more than 1000" in result.errors[2].reason
    assert "type-id '../../x'" in result.errors[3].reason
    assert all("\x1b" not in str(p) for p in result.problems)
    assert sorted(result.texts) == [
        f"cpu_usage_system,hostname=n1,type=node value=2.0 {NOW}",
        f"cpu_usage_user,hostname=n1,type=node value=1.0 {NOW}",
        f"mem_used,hostname=n1,type=node value=3.0 {NOW}",
    ]
    assert result.rejected == 6


def test_new_measurements_per_request_are_limited() -> None:
    """A request may introduce at most NEW_MEASUREMENTS_MAX measurements the metric registry does not
    declare: the values beyond are refused by line number (a partial write), the others published; the
    registry's own measurements and those already introduced do not count; a body read in steps counts once."""
    from hpcbus.producers.gateway.influx import normalise_in_steps
    from hpcbus.retry import Stopping
    from hpcbus.schemas.foreign.influx import NEW_MEASUREMENTS_MAX

    limit = NEW_MEASUREMENTS_MAX
    lines = [f"m{i},host=n1 value=1 {NOW}" for i in range(limit + 5)]
    lines += [f"m0,host=n1 value=2 {NOW}", f"cpu_load,host=n1 value=3 {NOW}"]  # introduced; registered
    lines.append(f"t,host=n1 a=1,b=2 {NOW}")  # a Telegraf line: both its values beyond the limit
    body = ("\n".join(lines) + "\n").encode()
    for result in (
        normalise(body, precision="s", cluster="fox", now=NOW, place="req"),
        asyncio.run(
            normalise_in_steps(
                body, Stopping(), step=4096, precision="s", cluster="fox", now=NOW, place="req"
            )
        ),
    ):
        assert result is not None
        assert len(result.lines) == limit + 2
        assert [p.line for p in result.errors] == [*range(limit + 1, limit + 6), limit + 8]
        assert (
            "1 new measurement ('m2000') beyond the 2000 one request may introduce" in result.errors[0].reason
        )
        assert result.errors[-1].reason.startswith("2 new measurements ('t_")
        assert result.rejected == 6


def test_sonar_gpu_uuids_become_device_ids() -> None:
    """A Sonar sample's GPU uuid is free text: its lines carry it as a `device_key` every entry accepts (the
    skeleton keeps the uuid, so the envelope comes back as it was)."""
    from hpcbus.schemas.lineprotocol import format_lines
    from hpcbus.schemas.sonar.types import SampleEnvelope
    from hpcbus.schemas.translate import LpToSonar, envelope_to_lines
    from hpcbus.schemas.translate.common import device_key

    assert (
        device_key("GPU-5c89852c-d268-c3f3-1b07-005d5ae455ee") == "GPU-5c89852c-d268-c3f3-1b07-005d5ae455ee"
    )
    for uuid in ("../../x", "a/b;c", "..", ".", "", "u" * 100):
        assert names.device_id_problem(device_key(uuid) or "-") is None, uuid
    doc = {
        "meta": {"producer": "sonar", "version": "0.19.0"},
        "data": {
            "type": "sample",
            "attributes": {
                "time": "2025-05-03T10:00:00+02:00",
                "cluster": "fox",
                "node": "n1",
                "system": {"gpus": [{"index": 0, "uuid": "../../x", "ce_util": 50}]},
            },
        },
    }
    env = decode_envelope(json.dumps(doc), expect="sample")
    lines = envelope_to_lines(env)
    parsed = parse_payload(format_lines(lines), now=0)
    assert parsed.errors == [] and any(line.tags.get("type-id") == "_.__._x" for line in parsed.lines)
    translator = LpToSonar()
    unmade: list[Problem] = []
    out = translator.add_lines(parsed.lines, now=0, problems=unmade) + translator.flush_all()
    assert [a.envelope for a in out] == [env] and isinstance(env, SampleEnvelope) and unmade == []


def test_every_entry_refuses_a_type_id_path_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lp = tmp_path / "in.lp"
    lp.write_text(f"{metric('hostname=n1')}\nm,hostname=n1,type=socket,type-id=../../x value=1 {NOW}\n")
    assert cli.main(["validate", "--max-future", str(10**10), str(lp)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{lp}:2: lp: tag type-id: type-id '../../x': character '/' at offset 2")
    body = f"a/b,hostname=n1,type=node value=1 {NOW}\n"
    assert cli.main(["pub", "--validate", "-s", "nats://127.0.0.1:1", "fox.metrics", body]) == 1
    assert "fox.metrics:1: lp: measurement: measurement 'a/b': character '/'" in capsys.readouterr().err
    payload = f"m,cluster=fox,hostname=n001,type=socket,type-id=../../x value=1 {NOW}\n".encode()
    _, problems, _ = ingest_lines(payload)
    assert [p.path for p in problems] == ["tag type-id"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("c1_5", "character '_' at offset 2"),
        ("a" * 253, "has a label of 253 characters, longer than 63"),
        ("a" * 63 + "." + "b" * 64, "has a label of 64 characters"),
        ("n1.-fox", "the label '-fox' starts or ends with '-'"),
        ("n1.", "has an empty label"),
    ],
)
def test_sonar_refuses_host_names_the_bus_carries(name: str, why: str) -> None:
    """Issue 32 item 2: the bus's host rule allows `_` and long labels; Sonar's `Hostname` (RFC 1123 labels of
    at most 63, NordicHPC/sonar `types.go`) does not, and says which part is wrong. The Sonar schema's type is
    the same rule, written once (`names.SONAR_HOST_PATTERN`)."""
    from hpcbus.schemas.sonar.types import HOSTNAME_PATTERN

    assert names.host_problem(name) is None or name.endswith(".") or ".-" in name
    reason = names.sonar_host_problem(name)
    assert reason is not None and why in reason, reason
    assert HOSTNAME_PATTERN == names.SONAR_HOST_PATTERN
    assert re.match(HOSTNAME_PATTERN, name) is None


@pytest.mark.parametrize("name", ["n1", "c1-5.fox.educloud.no", "a" * 63 + "." + "b" * 63, "1.2.3.4"])
def test_sonar_accepts_rfc_1123_names(name: str) -> None:
    assert names.sonar_host_problem(name) is None


def test_an_undecodable_sysinfo_event_makes_no_envelope_but_a_problem() -> None:
    """An envelope of `meta` alone ("neither `data` nor `errors`") is no Sonar envelope: an event whose
    envelope cannot be decoded (here a node Sonar refuses) makes a Problem, never a placeholder."""
    from hpcbus.schemas.lineprotocol import format_lines
    from hpcbus.schemas.translate import LpToSonar, envelope_to_lines

    doc = (CORPUS / "sonar" / "jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl").read_text().splitlines()[0]
    env = decode_envelope(doc.replace('"node":"n1.cluster1.uio.no"', '"node":"n1"'), expect="sysinfo")
    text = format_lines(envelope_to_lines(env)).replace('\\"node\\":\\"n1\\"', '\\"node\\":\\"c1_5\\"')
    assert "c1_5" in text
    parsed = parse_payload(text.encode(), now=0)
    assert parsed.errors == [] and len(parsed.lines) == 1
    problems: list[Problem] = []
    assert LpToSonar().add_lines(parsed.lines, now=0, problems=problems) == []
    (problem,) = problems
    assert problem.reason.startswith("sysinfo envelope not decodable") and "c1_5" in problem.reason
    # no caller may leave the list out and lose the problem unseen: `problems` is required on both doors
    from hpcbus.schemas.translate import lines_to_envelopes

    with pytest.raises(TypeError, match="problems"):
        LpToSonar().add_lines(parsed.lines, now=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="problems"):
        lines_to_envelopes(parsed.lines)  # type: ignore[call-arg]
    problems.clear()
    assert lines_to_envelopes(parsed.lines, problems=problems) == [] and problems == [problem]
