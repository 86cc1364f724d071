"""The pure parts of `hpcbus report`: InfluxQL quoting, the bars and units of the text, and how numbers are
worked out from buckets (the services test, tests/test_report_pipeline.py, checks them on real data)."""

from __future__ import annotations

import pytest

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
        # started 10 s before the first sample (each point measures the step before it), ended at the last
        node_events=[{"hostname": "n1", "hwthreads": [0, 1, 2, 3], "startTime": 90, "stopTime": 130}],
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


T = 1_764_000_000


def busy_loop(**extra: object) -> JobData:
    """One thread at 95 % of a core, sampled every 10 s at T .. T+30: each point is what it used in the 10 s
    before (the first, a process's lifetime average: it is new)."""
    times = [T + 10 * i for i in range(4)]
    fields: dict[str, object] = {
        "ref": JobRef("c", "5@99"),
        "step": 10,
        "first": times[0],
        "last": times[-1],
        "samples": [Buckets("n1", values=dict.fromkeys(times, 1.0))],
        "cpu": [Buckets("n1", values=dict.fromkeys(times, 95.0))],
        "mem": [Buckets("n1", values=dict.fromkeys(times, 1024.0))],
        "mem_max": [Buckets("n1", values=dict.fromkeys(times, 1024.0))],
        **extra,
    }
    return JobData(**fields)  # type: ignore[arg-type]


def test_cpu_and_elapsed_time_are_counted_over_the_same_interval() -> None:
    """Issue 32: one busy thread must not read more than one core busy, nor its nodes disagree with it."""
    # A batch job that started 3 s before its first sample: that point counts for 3 s, not 10 (1.15 cores).
    started = busy_loop(
        ref=JobRef("c", "5"),
        start_job={"startTime": T - 3, "numHwthreads": 1, "numNodes": 1, "resources": [{"hostname": "n1"}]},
        stop_job={"stopTime": T + 30, "jobState": "completed"},
    )
    report = build(started, ReportSettings())
    assert report.elapsed == 33.0 and report.cpu_seconds == pytest.approx(0.95 * 3 + 3 * 9.5)
    assert report.cores_busy is not None and 0.9 <= report.cores_busy <= 1.0
    assert report.cpu_eff is not None and 90.0 <= report.cpu_eff <= 100.0
    # A process group nobody saw start: the job's interval begins at its first sample, which measured
    # nothing of it, so that point is neither counted nor drawn.
    report = build(busy_loop(), ReportSettings())
    assert (report.start, report.end, report.elapsed) == (T, T + 30, 30.0)
    assert report.cpu_seconds == pytest.approx(3 * 9.5) and report.cores_busy == pytest.approx(0.95)
    cpu = next(t for t in report.series if t.metric == "cpu")
    assert cpu.times == [T + 10, T + 20, T + 30] and cpu.values == pytest.approx([0.95] * 3)
    mem = next(t for t in report.series if t.metric == "mem")
    assert mem.times[0] == T  # memory was measured at the first sample
    # With the summary of `consume jobs`, the node's figures are the summary's (39.0 beside 34.94 before).
    summarised = busy_loop(summary={"start": T, "end": T + 30, "elapsed": 30.0, "cpu_seconds": 28.0})
    report = build(summarised, ReportSettings())
    assert report.cpu_seconds == 28.0 and [n.cpu_seconds for n in report.per_node] == [28.0]
    two = busy_loop(
        summary={"start": T, "end": T + 30, "elapsed": 30.0, "cpu_seconds": 40.0},
        summary_nodes=[{"hostname": "n1", "cpu_seconds": 28.0}, {"hostname": "n2", "cpu_seconds": 12.0}],
        samples=[Buckets(h, values={T: 1.0, T + 10: 1.0}) for h in ("n1", "n2")],
    )
    report = build(two, ReportSettings())
    assert {n.hostname: n.cpu_seconds for n in report.per_node} == {"n1": 28.0, "n2": 12.0}
    assert sum(n.cpu_seconds for n in report.per_node) == report.cpu_seconds


def long_job(interval: int = 10, busy_for: int = 1000, span: int = 10_000, max_points: int = 10) -> JobData:
    """A process group nobody saw start, sampled every `interval` s for `span` s, one core busy for the first
    `busy_for` s, read as `fetch` reads it with `--max-points`: buckets of `step` s starting at the first
    sample, each the mean of the samples in [t, t + step) (each measured the interval before it; the first,
    the process's lifetime average)."""
    times = list(range(T, T + span + 1, interval))
    step = max(interval, -(-span // max_points))
    util = {s: 100.0 if s - interval < T + busy_for else 0.0 for s in times}
    count: dict[int, float] = {}
    total: dict[int, float] = {}
    for s in times:
        t = T + (s - T) // step * step
        count[t] = count.get(t, 0.0) + 1
        total[t] = total.get(t, 0.0) + util[s]
    return JobData(
        ref=JobRef("c", "5@99"),
        step=step,
        first=T,
        last=times[-1],
        extent={"n1": (T, times[-1], len(times))},
        samples=[Buckets("n1", values=count)],
        cpu=[Buckets("n1", values={t: v / count[t] for t, v in total.items() if v})],
        mem=[Buckets("n1", values=dict.fromkeys(count, 1024.0))],
        mem_max=[Buckets("n1", values=dict.fromkeys(count, 1024.0))],
    )


@pytest.mark.parametrize("interval", [10, 30, 70])
def test_a_point_of_many_samples_counts_for_what_they_measured(interval: int) -> None:
    """Review of issue 32: the bucket at t holds the samples t .. t + step - interval, which measured
    (t - interval, t + step - interval], not (t - step, t]. One core busy for the first 1000 s of 10,000 s
    with 10 points (step 1000) read 10 CPU seconds (the first bucket counted nothing, the second 1 % of a
    core for 1000 s) and the plot lost its first CPU point."""
    data = long_job(interval)
    assert data.step == 1000
    report = build(data, ReportSettings())
    assert data.last is not None and report.elapsed == data.last - T
    # the true CPU seconds in [T, T + 10000]: the samples' utilisation x the part of their interval in it
    assert report.cpu_seconds == pytest.approx(1000.0, abs=interval)
    cpu = next(t for t in report.series if t.metric == "cpu")
    assert cpu.times[0] == T and cpu.values[0] == pytest.approx(1.0)
    # Short jobs (a point per sample) are as before: the first sample measured nothing of the job.
    short = long_job(10, busy_for=100, span=100, max_points=1000)
    assert short.step == 10
    report = build(short, ReportSettings())
    assert report.cpu_seconds == pytest.approx(100.0)
    assert next(t for t in report.series if t.metric == "cpu").times[0] == T + 10


def test_every_text_line_fits_80_columns() -> None:
    """The text promises 80 columns (issue 32: a memory line was 128): details that do not fit beside a bar
    go under it, long values wrap under their column; nothing is lost on the way."""
    from hpcbus.consumers.report.text import render

    hosts = ["node-" + "x" * 70, "c1-2", "h" * 253]
    times = [T + 10 * i for i in range(4)]
    cards = [Buckets(hosts[0], card="GPU-" + "9" * 36, values=dict.fromkeys(times, 40.0))]
    data = busy_loop(
        ref=JobRef("c", "5"),
        start_job={
            "startTime": T - 10,
            "numHwthreads": 12,
            "numNodes": 3,
            "requestedMemory": 3 * 200,
            "resources": [{"hostname": h} for h in hosts],
            "metaData": {"slurmInfo": "x", "jobName": "a rather long job name " * 4},
        },
        stop_job={"stopTime": T + 30, "jobState": "completed"},
        samples=[Buckets(h, values=dict.fromkeys(times, 1.0)) for h in hosts],
        mem_max=[Buckets(h, values=dict.fromkeys(times, 80.0 * 1024)) for h in hosts],
        gpu_util=cards,
        gpu_mem_max=[Buckets(hosts[0], card=cards[0].card, values=dict.fromkeys(times, 900.0))],
        gpu_mem_total={f"{hosts[0]}/{cards[0].card}": 40960.0},
        mem_total={h: 16 * 2**20 for h in hosts},
    )
    out = render(build(data, ReportSettings()))
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert not too_long, too_long
    flat = " ".join(out.split())
    assert "240.0 MiB of 600.0 MiB" in flat and "of 200.0 MiB" in flat  # the details, under their bars
    assert "h" * 80 in out.replace("\n", "").replace(" ", "")  # the long host name, cut, not dropped
    group = render(build(busy_loop(node_events=[{"hostname": "n1", "startTime": T - 10}]), ReportSettings()))
    assert max(len(line) for line in group.splitlines()) <= 80, group
    assert "cores busy on average" in group
