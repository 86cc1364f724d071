"""The pure parts of `hpcbus report`: InfluxQL quoting, the bars and units of the text, and how numbers are
worked out from buckets (the services test, tests/test_report_pipeline.py, checks them on real data)."""

from __future__ import annotations

from hpcbus.consumers.report.model import Buckets, JobData, JobRef, build, duration, size
from hpcbus.consumers.report.settings import ReportSettings
from hpcbus.consumers.report.text import BAR, bar
from hpcbus.influx.query import literal, regex


def test_influxql_quoting_keeps_user_text_inside_its_literal() -> None:
    assert literal("it's") == "'it\\'s'"
    assert literal("a\\b") == "'a\\\\b'"
    assert regex('"jobId":1[,}]') == '/"jobId":1[,}]/'
    assert regex("a/b") == "/a\\/b/"


def test_bar_and_units() -> None:
    assert bar(0) == "[" + " " * BAR + "]"
    assert bar(50) == "[" + "|" * (BAR // 2) + " " * (BAR // 2) + "]"
    assert bar(250) == "[" + "|" * BAR + "]"  # over 100 % (RSS counts shared pages twice) stays in the box
    assert "unknown" in bar(None)
    assert duration(3725) == "01:02:05" and duration(90000) == "1-01:00:00" and duration(None) == "?"
    assert size(200 * 2**20) == "200.0 MiB" and size(512) == "512 B" and size(None) == "?"


def test_buckets_without_a_process_point_count_as_zero_and_flags_follow_thresholds() -> None:
    # 4 buckets of 10 s with samples; CPU reported in two of them (processes idle at 0 are not written).
    data = JobData(
        ref=JobRef("c", "7@99"),
        step=10,
        first=100,
        last=130,
        samples=[Buckets("n1", values={100: 1, 110: 1, 120: 1, 130: 1})],
        cpu=[Buckets("n1", values={100: 100.0, 110: 100.0})],
        mem=[Buckets("n1", values={100: 1024.0, 110: 1024.0, 120: 1024.0, 130: 1024.0})],
        mem_max=[Buckets("n1", values={100: 2048.0})],
        node_events=[{"hostname": "n1", "hwthreads": [0, 1, 2, 3], "startTime": 100, "stopTime": 140}],
    )
    report = build(data, ReportSettings())
    assert report.state == "ENDED" and report.elapsed == 40.0 and report.cores == 4
    assert report.cpu_seconds == 20.0  # 1 core x 10 s, twice
    assert report.cpu_eff == 100.0 * 20.0 / (4 * 40.0)
    assert report.mem_peak == 2 * 2**20 and report.mem_requested is None
    assert [f.name for f in report.flags] == ["cpu_underused"]
    cpu = next(t for t in report.series if t.metric == "cpu")
    assert cpu.times == [100, 110, 120, 130] and cpu.values == [1.0, 1.0, 0.0, 0.0]
    assert [f.name for f in build(data, ReportSettings(cpu_underused=10.0)).flags] == []
