"""Issue 34: `consume influx` writes the `job_summary` point of each `jobsummary` event that comes on
`<cluster>.events.jobsummary`, byte for byte the point `consume jobs` writes from the same summary (one
encoder, `schemas.jobsummary.influx_point`), so a second InfluxDB copy has the summaries `hpcbus report`
and the dashboards read, and in the copy `consume jobs` writes too the second write is the same point.
A summary event that is not one, names another cluster or job, or came on another subject is refused with
its reason (the runner dead-letters the message) and the message's other lines are kept. Both paths (the
compiled splice and the pure one) give the same body. The real services: tests/test_two_influx.py."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.contract import BadInput
from hpcbus.influx.settings import InfluxSettings
from hpcbus.schemas.jobsummary import FLAGS, Summary, event_line, influx_point
from hpcbus.schemas.lineprotocol import FormatError, format_line
from hpcbus.schemas.problems import Problem
from tests.summaries import a_summary

SUMMARIES = "lab.events.jobsummary"
NOW = 1_764_000_200


class Bus:
    def jetstream(self) -> None:
        return None


def take(messages: list[tuple[str, bytes]], prefix: str = "") -> tuple[list[str], list[str], list[Problem]]:
    """(metric lines, ns lines, problems) of `messages` taken by a compiled and a pure sink of cluster `lab`
    (under the subject `prefix`), asserted equal."""
    out = []
    settings = msgspec.convert({}, InfluxSettings)
    for compiled in (True, False):
        sink = InfluxSink(Bus(), None, settings, "lab", "t", prefix=prefix, compiled=compiled)  # type: ignore[arg-type]
        problems: list[Problem] = []
        for subject, data in messages:
            msg = type("Msg", (), {"subject": subject, "data": data, "reply": ""})()
            try:
                sink.take(msg)  # type: ignore[arg-type]
            except BadInput as exc:
                problems += exc.problems
        batch = sink.cut()
        body = sink._body(batch)
        out.append((body, batch.logs, problems))
    assert out[0] == out[1]
    return out[0]


def event(summary: Summary) -> bytes:
    """The message `consume jobs` publishes for `summary`."""
    return (format_line(event_line(summary)) + "\n").encode()


def test_the_point_of_a_summary_event_is_the_point_consume_jobs_writes() -> None:
    summary = a_summary("lab", end=NOW - 100)
    _, logs, problems = take([(SUMMARIES, event(summary))])
    assert problems == []
    point = format_line(influx_point(summary))
    assert point.startswith("job_summary,account=proj,cluster=lab,job=4242,") and point.endswith(
        f" {(NOW - 100) * 10**9}"
    )
    assert logs[0] == point  # the summary's own second, not the event's place inside it
    assert len(logs) == 2 and logs[1].startswith("jobsummary,cluster=lab,job=4242 event=")


def test_a_bad_summary_event_is_refused_with_its_reason_and_the_rest_kept() -> None:
    good = a_summary("lab", "1", end=NOW - 100)
    broken = event(good).replace(b"samples", b"sampels")
    other_cluster = event(a_summary("elsewhere", "2", end=NOW - 100)).replace(
        b"cluster=elsewhere", b"cluster=lab"
    )
    other_job = event(a_summary("lab", "3", end=NOW - 100)).replace(b"job=3", b"job=4")
    metric = f"mem_used,hostname=n1,type=node value=1 {NOW}\n".encode()
    messages = [
        (SUMMARIES, broken + metric),
        (SUMMARIES, other_cluster),
        (SUMMARIES, other_job),
        ("lab.events.job", event(good)),  # a summary on another subject: not the jobs worker's
        (SUMMARIES, event(good)),
    ]
    lines, logs, problems = take(messages)
    reasons = [p.reason for p in problems]
    assert len(reasons) == 4, reasons
    assert "not a job summary: Object missing required field `samples`" in reasons[0]
    assert "names cluster 'elsewhere'" in reasons[1] and "job '3'" in reasons[2]
    assert "comes on <cluster>.events.jobsummary only" in reasons[3] and "lab.events.job" in reasons[3]
    assert {(p.place, p.kind, p.path) for p in problems[:3]} == {
        (SUMMARIES, "jobsummary event", "field event")
    }
    # the metric beside the broken event is written; of the summaries only the good one, event and point
    assert len(lines) == 1 and lines[0].startswith("mem_used,cluster=lab,")
    assert [text.split(",", 1)[0] for text in logs] == ["job_summary", "jobsummary"]
    assert logs[0] == format_line(influx_point(good))


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
"""A field's text: anything."""
_name = st.text(st.characters(categories=("L", "N")) | st.sampled_from("-_.@"), min_size=1, max_size=12)
"""A tag's text: a user, account or partition name (what Slurm allows; tags are checked by the name rules)."""
_job = st.from_regex(r"[0-9]{1,9}(_[0-9]{1,4})?", fullmatch=True)
_float = st.floats(allow_nan=False, allow_infinity=False, width=64)
_int = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def summaries(draw: st.DrawFn) -> Summary:
    """Any summary `consume jobs` could write: every optional number there or not, in any magnitude."""
    floats = ("elapsed", "cpu_seconds", "cpu_eff", "mem_avg", "mem_eff", "gpu_util", "energy", "coverage")
    ints = (
        "nodes",
        "cores",
        "gpus",
        "mem_peak",
        "mem_requested",
        "gpu_mem_peak",
        "read_bytes",
        "write_bytes",
    )
    fields: dict[str, object] = {name: draw(st.none() | _float) for name in floats}
    fields |= {name: draw(st.none() | _int) for name in ints}
    fields |= {name: draw(st.none() | _name) for name in ("user", "account", "partition")}
    fields["state"] = draw(st.none() | _text)
    fields["samples"] = draw(_int)
    fields["flags"] = draw(st.lists(st.sampled_from(FLAGS), unique=True))
    end = draw(st.integers(min_value=946_684_800, max_value=NOW))
    return a_summary("lab", draw(_job), end=end, start=end - 100, **fields)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(summaries())
def test_any_summary_comes_back_as_the_same_point(summary: Summary) -> None:
    """What `consume jobs` writes (`format_line(influx_point(summary))`) is what `consume influx` derives
    from the summary's event, whatever the numbers and texts: JSON keeps every float exactly, and each
    field is written in its one type."""
    try:
        point = format_line(influx_point(summary))
        message = event(summary)
    except FormatError:
        return  # consume jobs could not write it either
    _, logs, problems = take([(SUMMARIES, message)])
    assert problems == [] and logs[0] == point


def test_metric_messages_are_not_looked_through() -> None:
    """A metric message is not searched for summaries (the byte search alone cost 12 % of reading an agent
    message): an event line there is stored as an event, as ever, and gets no point. Only the master, the
    gateway and the Sonar and ingest workers may publish there, and none of them sends a summary (the
    gateway refuses one: tests/test_gateway_roles.py). On a log subject, a summary is refused."""
    summary = a_summary("lab", end=NOW - 100)
    lines, logs, problems = take([("lab.metrics", event(summary))])
    assert problems == [] and lines == [] and len(logs) == 1 and logs[0].startswith("jobsummary,")
    _, logs, problems = take([("lab.log.hpcbus", event(summary))])
    assert logs == [] and "comes on <cluster>.events.jobsummary only" in problems[0].reason


@pytest.mark.parametrize("subject", ["lab.events.jobsummary", "lab.metrics"])
def test_a_summary_named_in_a_tag_only_is_no_summary(subject: str) -> None:
    """`jobsummary` in a tag value makes the message looked through, and nothing else."""
    text = f"cpu_load,hostname=n1,note=jobsummary,type=node value=1 {NOW}\n"
    lines, logs, problems = take([(subject, text.encode())])
    assert problems == [] and logs == [] and len(lines) == 1


def test_only_the_jobs_workers_own_subject_makes_points_and_no_one_sends_one() -> None:
    """Review of issue 34. `lab.events.x.events.jobsummary` (which an identity allowed `lab.events.>` but
    denied `lab.events.jobsummary` may publish on) parses as the events of cluster `lab.events.x`: it was
    taken for the jobs worker's subject and its summary made a point. A `job_summary` line sent on an events
    or log subject, as text the compiled path forwards as it is (one `value`) or with summary fields, was
    stored as a point `hpcbus report` reads; a `jobsummary` line that is no event was kept. All refused, the
    lines beside them kept, on both paths."""
    summary = a_summary("lab", end=NOW - 100)
    metric = f"mem_used,hostname=n1,type=node value=1 {NOW}\n".encode()
    canonical = f"job_summary,cluster=lab,hostname=n1,job=4242,type=node value=1 {NOW}\n".encode()
    fields = f'job_summary,cluster=lab,job=4242,user=mallory log="x",cpu_eff=99.0 {NOW}\n'.encode()
    not_event = f"jobsummary,cluster=lab,hostname=n1,job=4242,type=node value=1 {NOW}\n".encode()
    messages = [
        ("lab.events.x.events.jobsummary", event(summary)),
        ("lab.log.job_summary", fields + metric),
        ("lab.events.nodejob", canonical),
        (SUMMARIES, not_event),
        (SUMMARIES, event(summary)),
    ]
    lines, logs, problems = take(messages)
    reasons = [p.reason for p in problems]
    assert len(reasons) == 4, reasons
    assert "comes on <cluster>.events.jobsummary only" in reasons[0], reasons
    assert problems[0].place == "lab.events.x.events.jobsummary"
    assert all("points are written from the jobs worker's jobsummary events only" in r for r in reasons[1:3])
    assert {p.kind for p in problems[1:3]} == {"job_summary line"}
    assert "is an event" in reasons[3]
    assert len(lines) == 1 and lines[0].startswith("mem_used,cluster=lab,")
    # the one good summary: its point and its event
    assert logs == [format_line(influx_point(summary)), logs[1]] and logs[1].startswith("jobsummary,")


def test_under_a_subject_prefix_the_prefixed_subject_is_the_jobs_workers() -> None:
    """`[bus] subject_prefix = "cc"`: the jobs worker publishes on `cc.lab.events.jobsummary`, which makes
    the point; the nested subject under the prefix does not, nor does a `job_summary` line sent on the jobs
    worker's own subject."""
    summary = a_summary("lab", end=NOW - 100)
    forged = f'job_summary,cluster=lab,job=4242,user=mallory event="{{}}",cpu_eff=99.0 {NOW}\n'.encode()
    messages = [
        ("cc.lab.events.jobsummary", event(summary)),
        ("cc.lab.events.x.events.jobsummary", event(summary)),
        ("cc.lab.events.jobsummary", forged),
    ]
    _, logs, problems = take(messages, prefix="cc")
    assert logs[0] == format_line(influx_point(summary)) and len(logs) == 2, logs
    assert [p.place for p in problems] == ["cc.lab.events.x.events.jobsummary", "cc.lab.events.jobsummary"]
    assert "comes on <cluster>.events.jobsummary only" in problems[0].reason
    assert "points are written from the jobs worker's jobsummary events only" in problems[1].reason
