"""The Grafana dashboards against data the real pipeline wrote.

A real InfluxDB is filled by the real pipeline: `produce node` on this host (a real Slurm job of the test
Slurm running on it) and on the `hpc` fixture tree (RAPL, InfiniBand, Lustre), `produce slurm`, a real
Sonar GPU sample (corpus, moved to now) translated onto the bus, `consume influx` and `consume jobs` (the
`job_summary` points of the Slurm job and of the GPU node's process-group job). Then every template-variable query and every panel query of every
dashboard is executed as Grafana would send it, with `$timeFilter`, `$__interval` and `$<variable>`
substituted by Grafana's rules for InfluxQL, and must return data with the expected columns; then again
with `$rp` = `5m` after the downsampling continuous queries ran over the window.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus import cli
from hpcbus.commands.deploy.dashboards.boards import dashboards, measurements
from hpcbus.commands.deploy.dashboards.downsampling import selects
from hpcbus.commands.deploy.dashboards.provisioning import files
from hpcbus.commands.deploy.dashboards.settings import GrafanaSettings
from hpcbus.influx.settings import InfluxSettings
from hpcbus.schemas.sonar import iter_envelopes
from hpcbus.schemas.translate import batch, envelope_to_lines, route
from tests.consumer_helpers import ROOT, Process, Worker, js_publish, wait_for
from tests.corpus import CORPUS
from tests.pipeline_helpers import (
    Services,
    influx_sink,
    jobs_worker,
    node_producer,
    pipeline_services,  # noqa: F401  (the fixture)
    slurm_producer,
)
from tests.services import InfluxDB

COMMITTED = ROOT / "deploy" / "grafana"
GPU_SAMPLES = CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
GPU_JOB = "2703861@168341194"  # the corpus node's GPU job (a process group: key `<job>@<epoch>`)


# ---- Grafana's substitution rules for InfluxQL -------------------------------------------------------------


@dataclass
class Var:
    """A template variable with the values chosen for it."""

    name: str
    values: list[str]
    multi: bool = False
    include_all: bool = False
    custom_all: bool = False
    """`values` is the variable's custom All value (`allValue`), which Grafana puts in unformatted."""


def escape_regex(value: str) -> str:
    """Grafana's `escapeRegex` (what the InfluxDB data source applies to multi-value and All values)."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), value)


def format_value(var: Var, query: str) -> str:
    """Grafana's InfluxDB `interpolateQueryExpr`: a single-value variable as it is (escaped when the query
    uses it in a regex), a multi-value or include-All one regex-escaped, several values as `(a|b)`."""
    if var.custom_all:
        return var.values[0]
    if not var.multi and not var.include_all:
        (value,) = var.values
        in_regex = re.search(rf"[=!]~\s*/[^/]*\${var.name}\b", query)
        return escape_regex(value) if in_regex else value
    escaped = [escape_regex(v) for v in var.values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


INTERVALS = [  # Grafana's rangeutil.roundInterval: (up to this many ms, interval)
    (1500, "1s"), (3500, "2s"), (7500, "5s"), (12500, "10s"), (17500, "15s"), (25000, "20s"), (45000, "30s"),
    (90000, "1m"), (180000, "2m"), (450000, "5m"), (1100000, "10m"), (2000000, "15m"), (2700000, "20m"),
    (5400000, "30m"), (10800000, "1h"),
]  # fmt: skip


def interval(from_ms: int, to_ms: int, min_interval_s: int, max_points: int = 1000) -> str:
    """`$__interval`: the range over the panel's data points, rounded as Grafana rounds it, at least the
    data source's minimum interval."""
    raw = max((to_ms - from_ms) / max_points, min_interval_s * 1000)
    for limit, text in INTERVALS:
        if raw <= limit:
            return text
    return "1h"


def interpolate(query: str, variables: dict[str, Var], from_ms: int, to_ms: int, step: str) -> str:
    query = query.replace("$timeFilter", f"time >= {from_ms}ms and time <= {to_ms}ms")
    query = query.replace("$__interval", step)

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise AssertionError(f"query uses ${name}, which the dashboard does not define: {query}")
        return format_value(variables[name], query)

    return re.sub(r"\$\{(\w+)\}|\$([A-Za-z_]\w*)", one, query)


# ---- what a query should return ----------------------------------------------------------------------------


def outer_select(query: str) -> str:
    """The column list of the outermost SELECT (subqueries in FROM skipped)."""
    body = query[len("SELECT ") :]
    depth = 0
    for i, ch in enumerate(body):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and body.startswith(" FROM ", i):
            return body[:i]
    raise AssertionError(f"no FROM in {query}")


def split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def expected_columns(query: str) -> list[str]:
    cols = []
    for item in split_top(outer_select(query)):
        m = re.search(r' AS "([^"]+)"$', item) or re.fullmatch(r'"([^"]+)"', item)
        assert m, f"cannot name the column of {item!r} in {query}"
        cols.append(m.group(1))
    return ["time", *cols]


def tags_used(query: str) -> set[str]:
    """Tag keys a query filters or groups by (`"x" =~ /../`, `"x" = '..'`, GROUP BY "x")."""
    found = set(re.findall(r'"([\w-]+)" (?:=~|!~|=|<>|!=) [/\']', query))
    for group in re.findall(r"GROUP BY ([^)]*?)(?: fill\(|\)|$)", query):
        found |= set(re.findall(r'"([\w-]+)"', group))
    return found


def measurements_of(query: str) -> set[str]:
    return set(re.findall(r'"\$rp"\."([\w-]+)"', query))


# ---- the dashboards ------------------------------------------------------------------------------------------


def targets(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def test_committed_files_are_what_the_command_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = files(InfluxSettings(), GrafanaSettings())
    committed = {str(p.relative_to(COMMITTED)): p.read_text() for p in COMMITTED.rglob("*") if p.is_file()}
    assert committed.keys() == expected.keys(), "run `hpcbus deploy grafana` and commit deploy/grafana/"
    for name, text in expected.items():
        assert committed[name] == text, f"deploy/grafana/{name} differs: run `hpcbus deploy grafana`"
    # A second InfluxDB (docs/scaling.md, "Two InfluxDBs") is only another URL: the data source names it,
    # the dashboards are the same for either.
    second = "http://influx-b.example.org:8086"
    argv = ["deploy", "grafana", "--output", str(tmp_path), "--db", "site", "--influx-user", "graf"]
    assert cli.main([*argv, "--influx-url", second]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(written) == sorted(str(tmp_path / n) for n in expected)
    source = (tmp_path / "provisioning/datasources/hpcbus.yaml").read_text()
    assert 'dbName: "site"' in source and 'user: "graf"' in source and '"$INFLUX_PASSWORD"' in source
    assert f'url: "{second}"' in source
    boards = {n: t for n, t in expected.items() if n.startswith("dashboards/")}
    assert boards and all((tmp_path / n).read_text() == t for n, t in boards.items())
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["deploy", "grafana", "--output", str(blocker)]) == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and str(blocker) in err and "Traceback" not in err
    assert cli.main(["deploy", "grafana", "--min-interval", "30 seconds"]) == 2
    assert "min_interval" in capsys.readouterr().err


def test_every_panel_query_is_raw_influxql_on_the_provisioned_source() -> None:
    boards, used = dashboards()
    assert len(boards) == 4
    for name, board in boards.items():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:2] == ["rp", "cluster"], name
        for panel, target in targets(board):
            assert target["rawQuery"] is True and target["datasource"]["uid"] == "hpcbus-influxdb"
            assert "$timeFilter" in target["query"], (name, panel["title"])
            assert target["resultFormat"] == ("table" if panel["type"] == "table" else "time_series")
            assert measurements_of(target["query"]) <= used
    assert used == measurements()


def test_interpolation_follows_grafanas_rules() -> None:
    single = Var("rp", ["5m"])
    hosts = Var("host", ["a.b", "c/d"], multi=True, include_all=True)
    one = Var("job", ["12"], multi=True)
    q = 'SELECT mean("value") FROM "$rp"."x" WHERE "hostname" =~ /^$host$/ AND "stype-id" =~ /^${job}$/ AND $timeFilter GROUP BY time($__interval)'
    assert interpolate(q, {v.name: v for v in (single, hosts, one)}, 1000, 61000, "10s") == (
        'SELECT mean("value") FROM "5m"."x" WHERE "hostname" =~ /^(a\\.b|c\\/d)$/ AND "stype-id" =~ /^12$/ '
        "AND time >= 1000ms and time <= 61000ms GROUP BY time(10s)"
    )
    assert interval(0, 3_600_000, 1) == "5s" and interval(0, 60_000, 30) == "30s"


# ---- the pipeline ----------------------------------------------------------------------------------------------


@dataclass
class Pipeline:
    influx: InfluxDB
    db: str
    cluster: str
    slurm_job: str
    start_ms: int
    host: str
    fixture_host: str
    workers: list[Process] = field(default_factory=list)

    def q(self, text: str) -> dict[str, Any]:
        return self.influx.query(text, self.db)

    def grew(self, measurement: str, where: str) -> bool:
        """The counter took at least two different values (a rate of it has a point)."""
        rows = self.influx.points(f'SELECT spread("value") FROM "{measurement}" {where}', self.db)
        return bool(rows) and rows[0]["spread"] > 0

    def count(self, measurement: str, where: str = "") -> int:
        rows = self.influx.points(f'SELECT count("value") FROM "{measurement}" {where}', self.db)
        return int(rows[0]["count"]) if rows else 0


def gpu_envelopes(cluster: str, times: list[int]) -> list[Any]:
    """The corpus GPU node's two samples, moved to `times` and to the test's cluster."""
    envelopes = [env for _, env in iter_envelopes(GPU_SAMPLES.read_text(), expect="sample")]
    out = []
    for env, t in zip(envelopes, times, strict=True):
        raw = msgspec.json.decode(msgspec.json.encode(env))
        raw["data"]["attributes"]["time"] = datetime.fromtimestamp(t, UTC).isoformat()
        raw["data"]["attributes"]["cluster"] = cluster
        out += [e for _, e in iter_envelopes(json.dumps(raw), expect="sample")]
    return out


JOB_SCRIPT = """#!/bin/sh
srun python3 - <<'EOF'
import os, time
path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "hpcbus-grafana-%s" % os.getpid())
end = time.time() + 12
while time.time() < end:
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * 4)
        f.flush(); os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    with open(path, "rb") as f:
        f.read()
    t = time.time() + 0.3
    while time.time() < t:
        pass
    time.sleep(0.3)
os.unlink(path)
EOF
"""


@pytest.fixture(scope="module")
def pipeline(pipeline_services: Services) -> Iterator[Pipeline]:  # noqa: F811
    nats, influx, slurm = pipeline_services.nats, pipeline_services.influx, pipeline_services.slurm
    tmp = pipeline_services.tmp
    cluster = f"graf{int(time.time() * 1000) % 10**9}.example.org"
    db = f"grafana_{cluster.split('.')[0]}"
    fixture_host = f"hpc-{cluster.split('.')[0]}"
    bus = ["--nats", nats.url, "--cluster", cluster]
    start_ms = int(time.time() * 1000) - 5000
    p = Pipeline(influx, db, cluster, "", start_ms, "", fixture_host)
    try:
        consume = influx_sink(bus, influx, db, tmp / "influx.log", "--stats-seconds", "1")
        node = node_producer(bus, tmp, tmp / "node.log")
        hpc = Worker(
            [
                "produce",
                "node",
                *bus,
                "--root",
                str(ROOT / "tests/fixtures/node/hpc"),
                "--hostname",
                fixture_host,
                "--interval",
                "1",
                "--no-processes",
            ],
            tmp / "hpc.log",
        )
        producer = slurm_producer(bus, slurm, tmp)
        jobs = jobs_worker(bus, influx, db, tmp, "--process-quiet", "5", "--interval", "1")
        p.workers += [consume, jobs, node, hpc, producer]
        consume.start()
        jobs.start()
        for w in (node, hpc, producer):
            w.start(ready=None)
        job = slurm.sbatch(JOB_SCRIPT)
        p.slurm_job = str(job)
        wait_for(lambda: p.count("mem_used") >= 2, 60, "node samples in InfluxDB")
        p.host = next(
            r["value"]
            for r in influx.points('SHOW TAG VALUES FROM "mem_used" WITH KEY = "hostname"', db)
            if r["value"] != fixture_host
        )
        now = int(time.time())
        js_publish(
            nats.url,
            [
                (subject, payload)
                for env in gpu_envelopes(cluster, [now - 2, now - 1])
                for subject, group in route(envelope_to_lines(env)).items()
                for payload in batch(group)
            ],
        )
        slurm.wait_job(job, timeout=120)
        mine = f"WHERE \"stype-id\" = '{job}'"
        wait_for(
            lambda: all(p.grew(m, mine) for m in ("process_cpu_time", "process_read", "process_written")),
            60,
            "the Slurm job's CPU time, reads and writes to grow between samples",
        )
        wait_for(lambda: p.count("process_acc_utilization") >= 8, 60, "the GPU job's per-card series")
        wait_for(lambda: p.count("hpcbus_delivered") >= 2, 60, "consume influx's self-telemetry")
        wait_for(
            lambda: (
                p.count("ib_recv_bw") >= 2 and p.count("cpu_load", f"WHERE hostname = '{fixture_host}'") >= 3
            ),
            60,
            "the hpc tree's rates",
        )
        keys = {str(job), GPU_JOB}
        wait_for(
            lambda: (
                {r["value"] for r in influx.points('SHOW TAG VALUES FROM "job_summary" WITH KEY = "job"', db)}
                >= keys
            ),
            90,
            "consume jobs' job_summary points of the Slurm job and the GPU job",
        )
        yield p
    finally:
        for process in p.workers:
            process.stop()


# ---- executing the dashboards ------------------------------------------------------------------------------


@dataclass
class Checked:
    dashboards: int = 0
    panels: int = 0
    queries: int = 0
    variables: int = 0
    empty_allowed: list[str] = field(default_factory=list)


def resolve_variables(
    p: Pipeline, board: dict[str, Any], rp: str, from_ms: int, to_ms: int, checked: Checked
) -> dict[str, Var]:
    """Each variable in order: custom ones take `rp`, query ones run their query (earlier variables
    substituted) and must list values; jobs are the test's two jobs, everything else is All."""
    out: dict[str, Var] = {}
    for v in board["templating"]["list"]:
        multi, include_all = bool(v.get("multi")), bool(v.get("includeAll"))
        if v["type"] == "custom":
            options = [o["value"] for o in v["options"]]
            assert rp in options
            out[v["name"]] = Var(v["name"], [rp], multi, include_all)
            continue
        text = interpolate(v["query"], out, from_ms, to_ms, "1s")
        values = [row["value"] for row in p.influx.points(text, p.db)]
        checked.variables += 1
        assert values, f"variable ${v['name']} lists nothing: {text}"
        if v["name"] == "job":
            chosen = [p.slurm_job, GPU_JOB]
            assert set(chosen) <= set(values), (chosen, values)
        elif v["name"] == "cluster":
            chosen = [p.cluster]
            assert values == chosen
        elif v.get("allValue"):  # All, as Grafana sends it with a custom all value
            out[v["name"]] = Var(v["name"], [v["allValue"]], multi, include_all, custom_all=True)
            continue
        else:
            chosen = values
        out[v["name"]] = Var(v["name"], chosen, multi, include_all)
    return out


def check_all(
    p: Pipeline, rp: str, from_ms: int, to_ms: int, may_be_empty: re.Pattern[str] | None = None
) -> Checked:
    checked = Checked()
    boards, _ = dashboards()
    step = interval(from_ms, to_ms, 1)
    for name, board in boards.items():
        checked.dashboards += 1
        variables = resolve_variables(p, board, rp, from_ms, to_ms, checked)
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            checked.panels += 1
            for target in panel["targets"]:
                checked.queries += 1
                text = interpolate(target["query"], variables, from_ms, to_ms, step)
                where = f"{name} / {panel['title']} / {target['refId']}: {text}"
                series = [s for r in p.q(text).get("results", []) for s in r.get("series", [])]
                if not series and may_be_empty is not None and may_be_empty.search(text):
                    checked.empty_allowed.append(where)
                    continue
                assert series, f"no data: {where}"
                columns = expected_columns(target["query"])
                for s in series:
                    assert s["columns"] == columns, where
                for i, column in enumerate(columns[1:], 1):
                    assert any(row[i] is not None for s in series for row in s["values"]), (
                        f"{column} always null: {where}"
                    )
    return checked


@pytest.mark.services
def test_dashboards_use_only_names_the_pipeline_writes(pipeline: Pipeline) -> None:
    written = {row["name"] for row in pipeline.influx.points("SHOW MEASUREMENTS", pipeline.db)}
    used = measurements()
    assert used <= written, f"not written by the pipeline: {sorted(used - written)}"
    keys: dict[str, set[str]] = {}
    for row in pipeline.influx.points("SHOW TAG KEYS", pipeline.db) + pipeline.influx.points(
        "SHOW FIELD KEYS", pipeline.db
    ):
        keys.setdefault(row["_measurement"], set()).add(row.get("tagKey") or row["fieldKey"])
    boards, _ = dashboards()
    for board in boards.values():
        queries = [t["query"] for _, t in targets(board)] + [
            v["query"] for v in board["templating"]["list"] if v["type"] == "query"
        ]
        for q in queries:
            for m in measurements_of(q):
                assert tags_used(q) <= keys[m], (m, tags_used(q) - keys[m], q)
            for f in re.findall(r'(?:mean|max|last|count|sum)\("([\w-]+)"\)', q):
                assert any(f in keys[m] for m in measurements_of(q)) or f == "value", (f, q)


@pytest.mark.services
def test_every_variable_and_panel_query_returns_data_from_the_real_pipeline(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    to_ms = int(time.time() * 1000) + 1000
    checked = check_all(pipeline, "autogen", pipeline.start_ms, to_ms)
    with capsys.disabled():
        print(
            f"\nraw: {checked.dashboards} dashboards, {checked.panels} panels, {checked.queries} panel queries, {checked.variables} variable queries checked"
        )
    assert (checked.dashboards, checked.empty_allowed) == (4, [])
    assert checked.queries >= checked.panels > 40


@pytest.mark.services
def test_the_downsampled_policy_serves_the_same_dashboards(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    """`deploy influx-retention` on the pipeline's database, then each continuous query's SELECT INTO run for
    the window (the shared InfluxDB has no CQ service; tests/test_retention.py runs the real service): every
    query works on `5m` too; only a rate needs two 5-minute means, so rates may be empty over a window
    shorter than two buckets."""
    p = pipeline
    assert cli.main(["deploy", "influx-retention", "--influx-url", p.influx.url, "--db", p.db]) == 0
    capsys.readouterr()
    first = p.start_ms // 300_000 * 300_000
    last = int(time.time() * 1000) // 300_000 * 300_000 + 300_000
    window = f" WHERE time >= {first}ms AND time < {last}ms GROUP BY"
    for select in selects(p.db, "autogen", measurements()).values():
        p.q(select.replace(" GROUP BY", window, 1))
    checked = check_all(p, "5m", first, last, may_be_empty=re.compile(r"non_negative_derivative"))
    with capsys.disabled():
        print(
            f"\n5m: {checked.panels} panels, {checked.queries} panel queries, {len(checked.empty_allowed)} rates empty over one bucket"
        )
    assert checked.queries - len(checked.empty_allowed) > 100
