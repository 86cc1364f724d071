"""`hpcbus status` against a running pipeline: simulated nodes, a real InfluxDB worker, real nats-server.

It answers in seconds, names a node stopped on purpose, shows a worker killed on purpose as gone and its
durable's backlog growing, exits 1 for each (0 while all is well, 3 when NATS is not there), and `--json`
carries the same facts as the screen."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.consumer_helpers import ROOT, Worker, make_telemetry_stream, wait_for
from tests.services import InfluxDB, NatsServer


def status(url: str, cluster: str, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcbus", "status", "--nats", url, "--cluster", cluster, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def facts(url: str, cluster: str, *extra: str) -> tuple[int, dict[str, Any]]:
    p = status(url, cluster, "--json", *extra)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_unreachable_nats_is_a_sentence_and_exit_3_within_seconds() -> None:
    started = time.monotonic()
    p = status("nats://127.0.0.1:1", "c", "--timeout", "1")
    assert p.returncode == 3, p.stderr
    assert "not reachable" in p.stderr and "Traceback" not in p.stderr
    assert time.monotonic() - started < 15
    j = status("nats://127.0.0.1:1", "c", "--timeout", "1", "--json")  # a check reading stdout: a verdict
    assert j.returncode == 3 and json.loads(j.stdout)["healthy"] is False, (j.stdout, j.stderr)
    assert json.loads(j.stdout)["nats_reachable"] is False
    bad = status("nats://127.0.0.1:99999", "c")  # a usage mistake, said before connecting
    assert bad.returncode == 2 and "port" in bad.stderr.lower() and "Traceback" not in bad.stderr, bad.stderr
    bad = status("http//bad", "c")
    assert bad.returncode == 2 and "expected nats://HOST" in bad.stderr, bad.stderr


@pytest.mark.services
def test_status_names_a_stopped_node_a_killed_worker_and_its_growing_backlog(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path, workers: list[Any]
) -> None:
    url = nats_server.url
    bus = ["--nats", url, "--cluster", cluster]
    config = tmp_path / "hpcbus.toml"
    config.write_text("[delivery]\nstats_seconds = 1.0\n")
    worker = Worker(
        ["consume", "influx", *bus, "--influx-url", influxdb.url, "--db", "st", "--config", str(config)],
        tmp_path / "influx.log",
    )
    workers.append(worker)
    worker.start()
    sim = ["simulate", *bus, "--interval", "1", "--hostname-prefix", "n"]
    steady = Worker([*sim, "--nodes", "3"], tmp_path / "steady.log")
    doomed = Worker([*sim, "--nodes", "1", "--first", "9"], tmp_path / "doomed.log")
    workers += [steady, doomed]
    steady.start(ready=None)
    doomed.start(ready=None)
    quick = ("--worker-window", "60", "--node-window", "30", "--stalled-after", "3")

    def all_seen() -> dict[str, Any] | None:
        code, report = facts(url, cluster, *quick)
        (c,) = report["clusters"]
        hosts = {n["host"] for n in c["nodes"]["hosts"]}
        alive = [w for w in c["workers"] if w["alive"] and w["name"] == "hpcbus-influx"]
        ok = (
            code == 0
            and hosts == {"n00001", "n00002", "n00003", "n00009"}
            and alive
            and c["nodes"]["interval_s"]
        )
        return report if ok else None

    report = wait_for(all_seen, 90, "a healthy status with 4 nodes and the worker", interval=1)
    assert report["healthy"] and report["problems"] == []
    started = time.monotonic()
    p = status(url, cluster, *quick)
    assert time.monotonic() - started < 5, p.stdout
    assert p.returncode == 0 and p.stdout.rstrip().endswith("healthy"), p.stdout
    assert "hpcbus-influx" in p.stdout and "4 seen" in p.stdout

    doomed.stop()  # a node stops reporting: silent after three intervals
    _, report = wait_for(
        lambda: (r := facts(url, cluster, *quick))[0] == 1 and r, 30, "n00009 to be silent", interval=1
    )
    (c,) = report["clusters"]
    assert [n["host"] for n in c["nodes"]["silent"]] == ["n00009"]
    assert any("n00009" in p["what"] for p in report["problems"])
    screen = status(url, cluster, *quick)
    assert screen.returncode == 1 and "silent n00009" in screen.stdout and "UNHEALTHY" in screen.stdout

    worker.stop()  # SIGKILL: no goodbye, its telemetry just stops

    def gone() -> dict[str, Any] | None:
        code, report = facts(url, cluster, *quick)
        (c,) = report["clusters"]
        dead = [w for w in c["workers"] if w["name"] == "hpcbus-influx" and not w["alive"]]
        return report if code == 1 and dead else None

    report = wait_for(gone, 30, "the worker to show as gone", interval=1)
    assert any(p["where"].startswith("worker hpcbus-influx") for p in report["problems"])
    (c,) = report["clusters"]
    (before,) = [d for d in c["durables"] if d["name"] == "hpcbus-influx"]
    wait_for(
        lambda: [
            d
            for d in facts(url, cluster, *quick)[1]["clusters"][0]["durables"]
            if d["name"] == "hpcbus-influx"
            and d["pending"] + d["ack_pending"] > before["pending"] + before["ack_pending"]
        ],
        30,
        "the durable's backlog to grow",
        interval=1,
    )
    stalled = wait_for(
        lambda: [p for p in facts(url, cluster, *quick)[1]["problems"] if "stalled" in p["what"]],
        30,
        "the durable to be called stalled",
        interval=1,
    )
    assert "hpcbus-influx" in stalled[0]["where"]
    screen = status(url, cluster, *quick)
    assert screen.returncode == 1 and "GONE" in screen.stdout and "stalled" in screen.stdout


def test_nodes_interval_silence_and_probe_hits() -> None:
    from hpcbus.commands.status.nodes import Seen, judge, skeleton_times

    seen = Seen()
    line = b'sample,cluster=c,function=skeleton,hostname=n\\,1,type=node,type-id=0 event="{}" 1700000030000000000'
    assert list(skeleton_times(line + b"\nother,hostname=x value=1 1", 5.0)) == [("n,1", 1_700_000_030.0)]
    for host, times in {"a": (970, 1000), "b": (900, 870), "c": (1000,)}.items():
        for t in times:
            seen.add(host, float(t))
    seen.add("d", 500.0, exact=False)  # only a probe further back saw it
    nodes = judge(seen, now=1005.0, silent_intervals=3, source="bus")
    by_host = {n.host: n for n in nodes.hosts}
    assert by_host["a"].interval_s == 30 and by_host["c"].interval_s == 30  # c: the cluster's median
    assert [n.host for n in nodes.silent] == ["b", "d"]  # b: 105 s > 3 x 30 s; d: not since the probe
    assert not by_host["d"].exact and by_host["b"].exact


def test_the_screen_fits_any_width() -> None:
    from hpcbus.commands.status.facts import Report, Server
    from hpcbus.commands.status.live import fit
    from hpcbus.commands.status.render import render

    report = Report(
        time=1e9,
        took_s=0.5,
        servers=[Server(url="nats://x:4222", reachable=False, error="refused")],
        clusters=[],
    )
    text = render(report, 20)
    assert all(len(line) <= 20 for line in text.splitlines()) and "server nats://x:42" in text
    assert fit(["a" * 50, "b", "c", "d"], 1, 1) == "…"
    assert fit(["a" * 50, "b", "c", "d"], 10, 2).split("\n") == ["aaaaaaaaa…", "… 3 more l"]


@pytest.mark.services
def test_influxdb_names_hosts_silent_for_longer_than_the_stream_keeps(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path
) -> None:
    url = nats_server.url
    sim = Worker(
        [
            "simulate",
            "--nats",
            url,
            "--cluster",
            cluster,
            "--nodes",
            "1",
            "--interval",
            "1",
            "--samples",
            "2",
        ],
        tmp_path / "sim.log",
    )
    sim.start(ready=None)
    assert sim.wait(120) == 0, sim.log()
    db = f"status_{cluster.split('.')[0]}"
    influxdb.create_db(db)
    long_ago = int(time.time()) - 7200
    influxdb.write(
        [f"hpcbus_collect_seconds,cluster={cluster},hostname=ghost,type=node value=0.5 {long_ago}"], db
    )
    _, bus_only = facts(url, cluster)
    assert "ghost" not in {n["host"] for n in bus_only["clusters"][0]["nodes"]["hosts"]}
    code, both = facts(url, cluster, "--influx", "--influx-url", influxdb.url, "--db", db)
    assert code == 1
    nodes = both["clusters"][0]["nodes"]
    (ghost,) = [n for n in nodes["silent"] if n["host"] == "ghost"]
    assert ghost["last_sample"] == long_ago and ghost["exact"] and nodes["source"] == "bus+influxdb"
    down, report = facts(
        url, cluster, "--influx", "--influx-url", "http://127.0.0.1:1", "--influx-timeout", "2"
    )
    assert down == 1 and any("InfluxDB" in p["what"] for p in report["problems"]), report["problems"]


@pytest.mark.services
def test_a_cluster_member_down_is_named_with_the_replica_it_held(tmp_path: Path, cluster: str) -> None:

    from tests.services.nats_cluster import NatsCluster

    with NatsCluster(tmp_path / "cluster") as members:
        stream = make_telemetry_stream(members.urls, cluster)

        def healthy() -> dict[str, Any] | None:
            code, report = facts(members.url, cluster)
            (s,) = report["clusters"][0]["streams"]
            return report if code == 0 and s["leader"] and len(s["followers"]) == 2 else None

        report = wait_for(healthy, 60, "a healthy replicated stream", interval=0.5)
        assert [s["reachable"] for s in report["servers"]] == [True, True, True]
        (s,) = report["clusters"][0]["streams"]
        assert s["replicas"] == 3 and all(r["current"] for r in s["followers"])
        victim = next(i for i in range(3) if i != members.leader(stream))
        members.kill(victim)
        name = members.members[victim].name

        def noticed() -> dict[str, Any] | None:
            code, report = facts(members.url, cluster)
            wheres = " ".join(p["where"] + " " + p["what"] for p in report["problems"])
            return report if code == 1 and f"replica {name}" in wheres else None

        report = wait_for(
            noticed, 60, lambda: f"status to name {name}: {status(members.url, cluster).stdout}", interval=0.5
        )
        assert [p for p in report["problems"] if p["where"] == f"server {members.urls[victim]}"]


@pytest.mark.services
def test_a_cluster_without_a_stream_or_under_another_prefix_is_named(
    nats_server: NatsServer, cluster: str
) -> None:
    import asyncio

    import nats

    from hpcbus.bus import ensure_stream, telemetry_stream

    p = status(nats_server.url, cluster)
    assert p.returncode == 1 and f"no stream HPCBUS_{cluster.replace('.', '_')}" in p.stdout, p.stdout

    async def make() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await ensure_stream(nc.jetstream(), telemetry_stream(cluster))
        finally:
            await nc.close()

    asyncio.run(make())
    p = status(nats_server.url, cluster, "--subject-prefix", "cc")
    assert p.returncode == 1 and "not this cluster under subject prefix 'cc'" in p.stdout, p.stdout
    assert status(nats_server.url, cluster).returncode == 0


def test_worker_reports_read_right_through_a_restart() -> None:
    """Issue 33 item 4, the arithmetic: a counter smaller than before was reset by a restart (counted from 0:
    never a negative rate), a gauge (`kind=gauge`, or one of a worker not yet upgraded) is never a rate, and a
    last report saying `running 0` is a stopped process, at once."""
    from hpcbus.commands.status.workers import Reports
    from hpcbus.schemas.lineprotocol import Line

    def report(t: int, values: dict[str, int], name: str = "hpcbus-influx") -> list[Line]:
        out = []
        for key, value in values.items():
            tags = {"hostname": "w1", "stype": "worker", "stype-id": name, "type": "node"}
            if key in ("pending", "open_jobs", "running"):
                tags["kind"] = "gauge"
            out.append(Line(f"hpcbus_{key}", tags, {"value": value}, t))
        return out

    reports = Reports()
    reports.add(report(1000, {"delivered": 600, "pending": 40, "open_jobs": 7, "running": 1}))
    reports.add(report(1010, {"delivered": 50, "pending": 10, "open_jobs": 9, "running": 1}))  # restarted
    (w,) = reports.workers(now=1011, errors={})
    assert w.rates == {"delivered": 5.0} and w.alive and not w.stopped  # 50 since the restart, in 10 s
    assert w.counters["open_jobs"] == 9 and w.backlog == 10
    reports.add(report(1012, {"delivered": 60, "pending": 0, "open_jobs": 9, "running": 0}))  # stopping
    (w,) = reports.workers(now=1013, errors={})
    assert w.stopped and not w.alive
    legacy = Reports()  # a worker from before `kind=gauge`: its gauges are known by name
    for t, n in ((0, 5), (60, 2)):
        legacy.add([Line("hpcbus_pending_summaries", {"hostname": "w", "stype-id": "jobs"}, {"value": n}, t)])
    assert legacy.workers(now=61, errors={})[0].rates == {}


def test_a_durable_whose_worker_holds_messages_while_pulling_is_not_stalled() -> None:
    """Issue 33 item 4: `consume sonar` holds messages for its envelope's lines on purpose (30 s); its
    durable, never acknowledged yet but pulled from and delivered to, is not stalled. One nobody pulls from
    is."""
    from hpcbus.commands.status.facts import Cluster, Durable, Nodes, Report
    from hpcbus.commands.status.health import judge
    from hpcbus.commands.status.settings import StatusSettings

    def durable(waiting: int, delivered: float | None) -> Durable:
        return Durable(
            stream="S", name="hpcbus-sonar", filter=[], pending=0, ack_pending=40, redelivered=0,
            waiting=waiting, last_ack_s=None, acks_per_s=0.0, drain_s=None, last_delivery_s=delivered,
        )  # fmt: skip

    for d, stalled in ((durable(1, 2.0), False), (durable(0, 2.0), True), (durable(1, 500.0), True)):
        nodes = Nodes(source="bus", seen=0, interval_s=None, silent=[])
        cluster = Cluster(name="c", streams=[], durables=[d], deadletters=None, workers=[], nodes=nodes)
        report = Report(time=0.0, took_s=0.0, servers=[], clusters=[cluster])
        report = judge(report, StatusSettings(stalled_after=120))
        assert any("stalled" in p.what for p in report.problems) == stalled, d


@pytest.mark.services
def test_status_right_through_a_worker_restart(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path, workers: list[Any]
) -> None:
    """Issue 33 item 4 on a real pipeline: a worker stopped with SIGTERM is said stopped at once (not
    `alive` for three intervals), and once it runs again status is healthy at every look, its rates never
    negative and its gauges never rates."""
    url = nats_server.url
    bus = ["--nats", url, "--cluster", cluster]
    config = tmp_path / "hpcbus.toml"
    config.write_text("[delivery]\nstats_seconds = 0.5\n")
    argv = [
        "consume",
        "influx",
        *bus,
        "--influx-url",
        influxdb.url,
        "--db",
        "restart",
        "--config",
        str(config),
    ]
    sim = Worker(["simulate", *bus, "--interval", "1", "--nodes", "2"], tmp_path / "sim.log")
    workers.append(sim)
    sim.start(ready=None)
    quick = ("--worker-window", "60", "--node-window", "30")

    def mine(report: dict[str, Any]) -> list[dict[str, Any]]:
        return [w for w in report["clusters"][0]["workers"] if w["name"] == "hpcbus-influx"]

    def run_worker(log: str) -> Worker:
        w = Worker(argv, tmp_path / log)
        workers.append(w)
        w.start()
        wait_for(
            lambda: (r := facts(url, cluster, *quick)) and r[0] == 0 and mine(r[1]), 60, "healthy", interval=1
        )
        return w

    first = run_worker("first.log")
    assert first.terminate() == 0
    code, report = facts(url, cluster, *quick)  # the report it made as it stopped is already there
    (w,) = mine(report)
    assert code == 1 and w["stopped"] and not w["alive"], w
    assert any("stopped" in p["what"] for p in report["problems"])
    run_worker("second.log")
    seen = 0.0
    for _ in range(6):  # a look after each of its next reports: healthy each time, no negative or gauge rate

        def newer(after: float = seen) -> tuple[int, dict[str, Any]] | None:
            code, report = facts(url, cluster, *quick)
            return (code, report) if mine(report) and mine(report)[0]["last_report"] > after else None

        code, report = wait_for(newer, 30, "the worker's next report", interval=0.2)
        (w,) = mine(report)
        seen = w["last_report"]
        assert code == 0 and w["alive"], report["problems"]
        assert all(v >= 0 for v in w["rates"].values()), w["rates"]
        assert not {"pending", "running", "deadletter_stream_dropped"} & set(w["rates"]), w["rates"]
