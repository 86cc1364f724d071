"""Timestamps outside [2000-01-01, now + max_future] and repeated field keys are Problems with line numbers.

The unit of a timestamp is guessed by magnitude (s/ms/us/ns); a value outside the live bands must never be
stored as 1970 (`value=1 7258118400` once was: 2200 in seconds, read as ms).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import parse_payload, to_seconds
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE, EARLIEST

NOW = 1_763_900_000  # 2025-11-23
DAY = 86_400
GOOD = "ok,hostname=a,type=node value=1 1763900000"


def _parse(text: str, max_future: int | None = DAY):
    return parse_payload(text, now=NOW, place="fox.metrics", max_future=max_future)


def test_far_future_seconds_are_not_read_as_1970_milliseconds() -> None:
    parsed = _parse(f"{GOOD}\nm,hostname=a,type=node value=1 7258118400\n{GOOD}\n")
    assert [ln.measurement for ln in parsed.lines] == ["ok", "ok"]
    (problem,) = parsed.errors
    assert (problem.place, problem.line, problem.path) == ("fox.metrics", 2, "timestamp")
    assert (
        "read as ms" in problem.reason and "1970-03-26" in problem.reason and "before 2000" in problem.reason
    )
    assert str(problem).startswith("fox.metrics:2: lp metric: timestamp: timestamp 7258118400")


def test_zero_and_pre_2000_times_are_problems() -> None:
    parsed = _parse(
        "m,hostname=a,type=node value=1 0\n"
        f"m,hostname=a,type=node value=1 {EARLIEST - 1}\n"
        f"m,hostname=a,type=node value=1 {EARLIEST}\n"
        'job,function=start_job event="{}" 0\n'
    )
    assert [ln.time for ln in parsed.lines] == [EARLIEST]
    assert [(p.line, p.path) for p in parsed.errors] == [(1, "timestamp"), (2, "timestamp"), (4, "timestamp")]
    assert "1970-01-01T00:00:00Z" in parsed.errors[0].reason


def test_the_future_margin_holds_in_every_unit() -> None:
    last = NOW + DAY
    lines = [
        f"m,hostname=a,type=node value=1 {last}",  # s, the last second allowed
        f"m,hostname=a,type=node value=1 {last + 1}",
        f"m,hostname=a,type=node value=1 {last}999",  # ms
        f"m,hostname=a,type=node value=1 {last + 1}000",
        f"m,hostname=a,type=node value=1 {last}999999",  # us
        f"m,hostname=a,type=node value=1 {last + 1}000000",
        f"m,hostname=a,type=node value=1 {last}999999999",  # ns
        f"m,hostname=a,type=node value=1 {last + 1}000000000",
    ]
    parsed = _parse("\n".join(lines))
    assert [ln.time for ln in parsed.lines] == [last] * 4
    assert [p.line for p in parsed.errors] == [2, 4, 6, 8]
    assert all("later than now + max_future" in p.reason for p in parsed.errors)
    # a larger margin takes them
    assert len(_parse("\n".join(lines), max_future=DAY + 1).lines) == 8


def test_missing_timestamp_is_now_and_inside_the_window() -> None:
    (line,) = _parse("m,hostname=a,type=node value=1").lines
    assert line.time == NOW


def test_without_max_future_any_non_negative_time_is_taken_as_before() -> None:
    parsed = parse_payload(
        "m,hostname=a,type=node value=1 7258118400\nm,hostname=a,type=node value=1 0", now=0
    )
    assert [ln.time for ln in parsed.lines] == [7_258_118, 0]
    assert parsed.problems == []


@settings(max_examples=400, deadline=None)
@given(
    ts=st.one_of(
        st.integers(min_value=0, max_value=9 * 10**18),
        st.integers(min_value=EARLIEST - 10, max_value=5_000_000_010),
        st.integers(min_value=EARLIEST * 10**9 - 10, max_value=(NOW + 2 * DAY) * 10**9),
    ),
    with_tag=st.booleans(),
)
def test_fast_and_slow_paths_apply_one_rule(ts: int, with_tag: bool) -> None:
    """Accepted iff 2000-01-01 <= to_seconds(ts) <= now + max_future, whichever path the line takes (an extra
    tag `host` instead of `hostname` sends it the slow way)."""
    host = "host" if with_tag else "hostname"
    parsed = _parse(f"m,{host}=a,type=node,type-id=0 value=1 {ts}")
    ok = EARLIEST <= to_seconds(ts) <= NOW + DAY
    assert [ln.time for ln in parsed.lines] == ([to_seconds(ts)] if ok else [])
    assert [p.path for p in parsed.errors] == ([] if ok else ["timestamp"])


def test_repeated_field_keys_are_problems() -> None:
    parsed = _parse(
        f"{GOOD}\n"
        "m,hostname=a,type=node value=1,value=2 1763900000\n"
        'm,hostname=a,type=node value=1,note="a",note="b" 1763900000\n'
        'job,function=start_job event="{}",event="{\\"x\\":1}" 1763900000\n'
        f"{GOOD}\n"
    )
    assert len(parsed.lines) == 2
    assert [(p.line, p.path) for p in parsed.errors] == [
        (2, "field value"),
        (3, "field note"),
        (4, "field event"),
    ]
    assert "given twice" in parsed.errors[0].reason
    assert str(parsed.errors[0]).startswith("fox.metrics:2: lp metric: field value:")


def test_lookalikes_of_repeated_keys_are_fine() -> None:
    text = (
        "m,hostname=a,value=3,type=node value=1 1763900000\n"  # a tag key `value`
        'm,hostname=a,type=node value=1,note="x,value=2" 1763900000\n'  # inside a string
        "m,cmd=a\\,value\\=2,hostname=a,type=node value=1 1763900000\n"  # escaped in a tag value
        'job,function=start_job event="{\\"a\\":\\"b=c,d=e\\"}" 1763900000\n'
    )
    parsed = _parse(text)
    assert parsed.errors == []
    assert len(parsed.lines) == 4


def test_default_margin_is_a_day() -> None:
    assert DEFAULT_MAX_FUTURE == DAY


def test_validate_reports_the_window_with_line_numbers(tmp_path, capsys) -> None:
    import time

    from hpcbus import cli

    now = int(time.time())
    f = tmp_path / "in.lp"
    f.write_text(
        f"m,hostname=a,type=node value=1 {now}\n"
        "m,hostname=a,type=node value=1 7258118400\n"
        f"m,hostname=a,type=node value=1 {now + 2 * DAY}\n"
        f"m,hostname=a,type=node value=1,value=2 {now}\n"
    )
    assert cli.main(["validate", str(f)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in out] == [f"{f}:{n}" for n in (2, 3, 4)]
    assert cli.main(["validate", "--max-future", str(3 * DAY), str(f)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in out] == [f"{f}:{n}" for n in (2, 4)]
    assert cli.main(["validate", "--max-future", "-1", str(f)]) == 2
