"""The subject prefix (`--subject-prefix cc`: ClusterCockpit's tree of today, `cc.<cluster>.metrics`) and
cc-backend 1.5's own subjects (`--cc-job-subject cc.job.event`, `--cc-node-state-subject cc.node.state`).

The prefix belongs to the subject tree, not to the cluster: tags, envelopes and stream names keep the plain
(dotted) cluster name. The end-to-end tests run real hpcbus processes against a real nats-server (and
InfluxDB): a node producer, `consume influx`, `hpcbus pub`, `deadletter list|replay`, the OCS producer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import nats
import pytest

from hpcbus.bus import round_trip
from hpcbus.consumers.deadletter.command import replay_subject
from hpcbus.options import add_section_arguments
from hpcbus.producers.ccbackend import CcBackendRelay, cc_line
from hpcbus.producers.pub.command import full_subject
from hpcbus.producers.slurm.producer import SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, parse_payload
from hpcbus.schemas.sonar.types import ClusterAttributes, ClusterNodes, ClusterPartition
from hpcbus.schemas.translate import route
from hpcbus.settings import (
    CCBACKEND,
    CcBackendSettings,
    SettingsError,
    add_bus_arguments,
    bus_settings,
    cc_backend_settings,
    clusters,
)
from hpcbus.streams import deadletter_stream, telemetry_stream
from tests.consumer_helpers import Process, Worker, bus_messages, triples, wait_for, wait_for_async
from tests.services import InfluxDB, NatsServer
from tests.test_ocs_producer import record, write
from tests.test_slurm_producer_state import COMPLETED, corpus_poll

DOTTED = "fox.educloud.no"

# --- the tree ------------------------------------------------------------------------------------------------


def test_builders_put_the_prefix_in_front_of_the_cluster() -> None:
    assert subjects.metrics(DOTTED, prefix="cc") == "cc.fox.educloud.no.metrics"
    assert subjects.events(DOTTED, "job", prefix="cc") == "cc.fox.educloud.no.events.job"
    assert subjects.log("fox", "hpcbus", prefix="cc") == "cc.fox.log.hpcbus"
    assert subjects.control("fox", "PUT", prefix="org.cc") == "org.cc.fox.control.put"
    assert subjects.sonar("fox", "jobs", prefix="cc") == "cc.fox.sonar.job"
    assert subjects.stored("fox", prefix="cc") == [
        "cc.fox.metrics",
        "cc.fox.telemetry",
        "cc.fox.events.>",
        "cc.fox.log.>",
        "cc.fox.sonar.>",
    ]
    assert subjects.deadletter("fox", "metrics", prefix="cc") == "cc.fox.deadletter.metrics"
    assert subjects.deadletter_wildcard("fox", prefix="cc") == "cc.fox.deadletter.>"
    assert subjects.metrics(DOTTED) == "fox.educloud.no.metrics"  # no prefix: the original spec's tree
    for bad in ("c c", "cc.", "cc.*", ">", ".cc"):
        with pytest.raises(subjects.SubjectError):
            subjects.metrics("fox", prefix=bad)


@pytest.mark.parametrize(
    ("subject", "prefix", "cluster", "category", "detail"),
    [
        ("cc.fox.educloud.no.metrics", "cc", DOTTED, "metrics", ""),
        ("cc.fox.educloud.no.events.job", "cc", DOTTED, "events", "job"),
        ("cc.cc.metrics", "cc", "cc", "metrics", ""),
        ("org.cc.alex.control.get", "org.cc", "alex", "control", "get"),
        ("cc.fox.educloud.no.metrics", "", "cc.fox.educloud.no", "metrics", ""),  # without: part of the name
    ],
)
def test_parse_takes_the_prefix_off(
    subject: str, prefix: str, cluster: str, category: str, detail: str
) -> None:
    parsed = subjects.parse(subject, prefix)
    assert (parsed.cluster, parsed.category, parsed.detail, parsed.prefix) == (
        cluster,
        category,
        detail,
        prefix,
    )
    assert str(parsed) == subject


@pytest.mark.parametrize("bad", ["fox.metrics", "ccfox.metrics", "cc.metrics", "cc.fox.events"])
def test_parse_refuses_what_is_not_under_the_prefix(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.parse(bad, "cc")


def test_streams_follow_the_prefix_but_keep_the_clusters_name() -> None:
    spec = telemetry_stream(DOTTED, prefix="cc", max_age=60.0)
    assert spec.name == "HPCBUS_fox_educloud_no" == telemetry_stream(DOTTED).name
    assert spec.subjects == subjects.stored(DOTTED, prefix="cc") and spec.max_age == 60.0
    dlq = deadletter_stream(DOTTED, prefix="cc")
    assert (dlq.name, dlq.subjects) == ("HPCBUS_DLQ_fox_educloud_no", ["cc.fox.educloud.no.deadletter.>"])


def test_route_prefixes_subjects_and_leaves_the_lines_alone() -> None:
    lines = [
        Line("cpu_load", {"hostname": "c1", "type": "node"}, {"value": 1.0}, 1700000000),
        Line("job", {"cluster": "saga", "function": "stop_job"}, {"event": "{}"}, 1700000000),
    ]
    routed = route(lines, DOTTED, prefix="cc")
    assert list(routed) == ["cc.fox.educloud.no.metrics", "cc.saga.events.job"]
    assert routed["cc.fox.educloud.no.metrics"][0].tags == {"hostname": "c1", "type": "node"}


# --- settings ------------------------------------------------------------------------------------------------


def _parse(argv: list[str], *, cc: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bus_arguments(p)
    if cc:
        add_section_arguments(p, CCBACKEND)
    return p.parse_args(argv)


def test_subject_prefix_from_flag_environment_and_file(tmp_path: Path) -> None:
    assert bus_settings(_parse([]), {}).subject_prefix == ""  # the original spec has none
    assert bus_settings(_parse(["--subject-prefix", "cc"]), {}).subject_prefix == "cc"
    assert bus_settings(_parse([]), {"HPCBUS_SUBJECT_PREFIX": "cc"}).subject_prefix == "cc"
    config = tmp_path / "hpcbus.toml"
    config.write_text('[bus]\nsubject_prefix = "cc"\ncluster = "fox.educloud.no"\n')
    bus = bus_settings(_parse(["--config", str(config)]), {})
    assert (bus.subject_prefix, clusters(bus)) == ("cc", [DOTTED])
    bad = bus_settings(_parse(["--cluster", "fox", "--subject-prefix", "c c"]), {})
    with pytest.raises(SettingsError, match="--subject-prefix"):
        clusters(bad)


def test_cc_backend_subjects_are_checked() -> None:
    cc = cc_backend_settings(_parse(["--cc-job-subject", "cc.job.event"], cc=True), environ={})
    assert cc == CcBackendSettings(cc_job_subject="cc.job.event")
    env = {"HPCBUS_CC_NODE_STATE_SUBJECT": "cc.node.state"}
    assert cc_backend_settings(_parse([], cc=True), environ=env).cc_node_state_subject == "cc.node.state"
    with pytest.raises(SettingsError, match="--cc-job-subject"):
        cc_backend_settings(_parse(["--cc-job-subject", "cc.job.*"], cc=True), environ={})


def test_pub_and_replay_subjects_move_under_the_prefix() -> None:
    assert full_subject("fox.metrics", "") == "fox.metrics"
    assert full_subject("fox.metrics", "cc") == "cc.fox.metrics"
    assert full_subject("cc.fox.metrics", "cc") == "cc.fox.metrics"  # already under it
    assert full_subject("cc.metrics", "cc") == "cc.cc.metrics"  # the cluster named cc
    assert replay_subject("cc.fox.metrics", "cc") == "cc.fox.metrics"
    assert replay_subject("fox.educloud.no.events.job", "cc") == "cc.fox.educloud.no.events.job"
    assert replay_subject("fox.metrics", "") == "fox.metrics"
    assert replay_subject("elsewhere", "cc") == "elsewhere"  # not ours: as it was


# --- cc-backend's own subjects -------------------------------------------------------------------------------


def test_cc_line_is_what_cc_backend_reads() -> None:
    job = Line(
        "job",
        {"cluster": "fox", "function": "start_job", "origin": "sonar"},
        {"event": '{"jobId":1}'},
        1700000000,
    )
    cc = cc_line(job)
    assert cc == Line("job", {"function": "start_job"}, {"event": '{"jobId":1}'}, 1700000000 * 10**9)
    nodestate = Line(
        "nodestate", {"cluster": "fox", "origin": "sonar"}, {"event": '{"cluster":"fox"}'}, 1700000000
    )
    assert cc_line(nodestate) == Line("nodestate", {}, {"event": '{"cluster":"fox"}'}, 1700000000 * 10**9)
    assert cc_line(Line("job", {"function": "other"}, {"event": "{}"}, 1)) is None
    assert cc_line(Line("cpu_load", {}, {"value": 1.0}, 1)) is None


def _cluster_attributes() -> ClusterAttributes:
    return ClusterAttributes(
        time="2025-09-12T15:00:00+02:00",
        cluster=DOTTED,
        slurm=True,
        partitions=[ClusterPartition(name="normal", nodes=["c1-[1-2]"])],
        nodes=[ClusterNodes(names=["c1-[1-2]"], states=["IDLE"])],
    )


def test_slurm_producer_publishes_cc_backend_subjects_one_line_per_message() -> None:
    relay = CcBackendRelay(
        CcBackendSettings(cc_job_subject="cc.job.event", cc_node_state_subject="cc.node.state")
    )
    producer = SlurmProducer(SlurmSettings(), DOTTED, SlurmState(DOTTED), prefix="cc", relay=relay)
    out = producer.build(corpus_poll(COMPLETED.read_text(), cluster=_cluster_attributes()))
    assert set(out.lines) == {
        f"cc.{DOTTED}.events.slurm",
        f"cc.{DOTTED}.events.job",
        f"cc.{DOTTED}.events.cluster",
        f"cc.{DOTTED}.events.nodestate",
    }
    tree_jobs = out.lines[f"cc.{DOTTED}.events.job"]
    messages = list(out.messages())
    cc_jobs = [(p, i) for s, p, i in messages if s == "cc.job.event"]
    assert len(cc_jobs) == len(tree_jobs) == out.started + out.stopped > 0
    for (payload, _), line in zip(cc_jobs, tree_jobs, strict=True):
        assert payload.count(b"\n") == 1
        text = payload.decode()
        assert text.startswith(f"job,function={line.tags['function']} event=")
        assert int(text.rsplit(" ", 1)[1]) == line.time * 10**9  # ns on cc-backend's subject only
        assert line.time < 10**10  # seconds on the hpcbus tree
    (states,) = [p for s, p, _ in messages if s == "cc.node.state"]
    ts = int(states.decode().rsplit(" ", 1)[1])
    assert ts > 10**18
    (parsed,) = parse_payload(states, now=0).lines
    assert parsed.measurement == "nodestate"
    assert json.loads(str(parsed.fields["event"])) == {
        "cluster": DOTTED,
        "nodes": [{"hostname": "c1-1", "states": ["idle"]}, {"hostname": "c1-2", "states": ["idle"]}],
    }
    off = SlurmProducer(
        SlurmSettings(), DOTTED, SlurmState(DOTTED), relay=CcBackendRelay(CcBackendSettings())
    )
    plain = off.build(corpus_poll(COMPLETED.read_text()))
    assert plain.cc == [] and all(s.startswith(f"{DOTTED}.events.") for s, _, _ in plain.messages())


# --- end to end ----------------------------------------------------------------------------------------------


def _metric_measurement(payload: bytes) -> str:
    return next(line.measurement for line in parse_payload(payload, now=0).lines if "value" in line.fields)


@pytest.mark.services
def test_node_producer_influx_pub_and_deadletter_under_the_prefix(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    """A dotted cluster under `cc`: the node agent publishes on `cc.<cluster>.metrics`, `consume influx`
    stores it tagged with the plain cluster, `hpcbus pub` and `deadletter replay` use the prefixed tree."""
    db = f"db_{os.getpid()}_{abs(hash(cluster)) % 10**6}"
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    agent = Worker(
        ["produce", "node", *bus, "--subject-prefix", "cc", "--interval", "1"], tmp_path / "agent.log"
    )
    workers.append(agent.start(ready=None))

    def metrics() -> list[tuple[str, bytes, str]]:
        return [t for t in triples(bus_messages(nats_server.url, cluster)) if t[0] == f"cc.{cluster}.metrics"]

    wait_for(lambda: metrics(), 30, lambda: f"a sample on cc.{cluster}.metrics\n{agent.log()}")
    stored = triples(bus_messages(nats_server.url, cluster))
    assert all(s.startswith(f"cc.{cluster}.") for s, _, _ in stored), {s for s, _, _ in stored}
    measurement = _metric_measurement(metrics()[0][1])

    # The consumer reads the same tree with the prefix from the environment.
    influx = Worker(
        ["consume", "influx", *bus, "--influx-url", influxdb.url, "--db", db],
        tmp_path / "influx.log",
        {"HPCBUS_SUBJECT_PREFIX": "cc"},
    )
    workers.append(influx.start())

    def tagged(name: str) -> set[str]:
        rows = influxdb.points(f'SELECT count("value") FROM "{name}" GROUP BY "cluster"', db)
        return {r.get("cluster", "") for r in rows}

    wait_for(
        lambda: tagged(measurement) == {cluster}, 30, lambda: f"{measurement} in InfluxDB\n{influx.log()}"
    )
    agent.terminate()

    # hpcbus pub: SUBJECT within the tree; a good line is stored, a bad one dead-lettered under the prefix.
    good = "pubbed,hostname=h1,type=node value=7 1700000000"
    pub = Worker(["pub", *bus, "--subject-prefix", "cc", f"{cluster}.metrics", good], tmp_path / "pub.log")
    workers.append(pub.start(ready=None))
    assert pub.wait(20) == 0, pub.log()
    wait_for(lambda: tagged("pubbed") == {cluster}, 20, lambda: f"the pubbed point\n{influx.log()}")
    bad = b'rejected,hostname=h1,type=node value="text" 1700000000\n'
    pub = Worker(
        ["pub", *bus, "--subject-prefix", "cc", "--raw", f"cc.{cluster}.metrics", bad.decode()],
        tmp_path / "pub2.log",
    )
    workers.append(pub.start(ready=None))
    assert pub.wait(20) == 0, pub.log()
    dead = wait_for(
        lambda: triples(bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ")), 20, lambda: influx.log()
    )
    assert [s for s, _, _ in dead] == [f"cc.{cluster}.deadletter.metrics"]

    listing = Worker(["deadletter", "list", "--json", *bus, "--subject-prefix", "cc"], tmp_path / "list.log")
    workers.append(listing.start(ready=None))
    assert listing.wait(20) == 0
    (entry,) = [json.loads(line) for line in listing.log().splitlines() if line.startswith("{")]
    assert entry["subject"] == f"cc.{cluster}.metrics"

    replay = Worker(["deadletter", "replay", *bus, "--subject-prefix", "cc"], tmp_path / "replay.log")
    workers.append(replay.start(ready=None))
    assert replay.wait(20) == 0, replay.log()
    assert f"replayed to cc.{cluster}.metrics" in replay.log()
    again = [p for s, p, _ in triples(bus_messages(nats_server.url, cluster)) if p == bad]
    assert len(again) == 2  # the original and its replay, both on cc.<cluster>.metrics
    assert all(
        s == f"cc.{cluster}.metrics"
        for s, p, _ in triples(bus_messages(nats_server.url, cluster))
        if p == bad
    )


@pytest.mark.services
def test_ocs_producer_delivers_job_events_to_cc_backends_subject(
    nats_server: NatsServer, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    """`--cc-job-subject cc.job.event`: every start_job/stop_job also reaches a core-NATS subscriber of that
    subject (as cc-backend subscribes), one line per message with a nanosecond timestamp; the hpcbus tree
    (under `cc`) keeps seconds, and the cc-backend subject stays outside the telemetry stream."""
    accounting = tmp_path / "accounting.jsonl"
    write(accounting, record(1), record(2))
    got: list[bytes] = []

    async def run() -> None:
        nc = await nats.connect(nats_server.url)
        try:

            async def on_msg(msg: Any) -> None:
                got.append(msg.data)

            await nc.subscribe("cc.job.event", cb=on_msg)
            await round_trip(nc, 5)
            args = [
                "produce",
                "ocs",
                "--nats",
                nats_server.url,
                "--cluster",
                cluster,
                "--subject-prefix",
                "cc",
            ]
            args += ["--accounting", str(accounting), "--interval", "0.1", "--start-jobs"]
            args += ["--cc-job-subject", "cc.job.event"]
            ocs = Worker(args, tmp_path / "ocs.log")
            workers.append(ocs.start(ready=None))
            await wait_for_async(lambda: len(got) >= 4, 30, lambda: f"{got}\n{ocs.log()}")
            assert ocs.terminate() == 0
        finally:
            await nc.close()

    asyncio.run(run())
    events = []
    for payload in got:
        assert payload.count(b"\n") == 1 and payload.endswith(b"\n")
        text = payload.decode()
        assert text.startswith(("job,function=start_job event=", "job,function=stop_job event="))
        ns = int(text.rsplit(" ", 1)[1])
        (line,) = parse_payload(payload, now=0).lines  # hpcbus' own reader agrees it is one valid line
        event = json.loads(str(line.fields["event"]))
        expected = event["startTime"] if line.tags["function"] == "start_job" else event["stopTime"]
        assert ns == expected * 10**9
        events.append((line.tags["function"], event["jobId"]))
    assert sorted(events) == [("start_job", 1), ("start_job", 2), ("stop_job", 1), ("stop_job", 2)]
    assert events.index(("start_job", 1)) < events.index(("stop_job", 1))

    stored = triples(bus_messages(nats_server.url, cluster))
    assert {s for s, _, _ in stored} >= {f"cc.{cluster}.events.job", f"cc.{cluster}.events.slurm"}
    assert all(s.startswith(f"cc.{cluster}.") for s, _, _ in stored)  # cc.job.event is not in the stream
    for subject, payload, _ in stored:
        if subject.endswith(".events.job"):
            assert all(line.time < 10**10 for line in parse_payload(payload, now=0).lines)  # seconds there


@pytest.mark.services
async def test_outbox_keeps_core_subject_messages_while_nats_is_away(nats_factory: Any) -> None:
    """A cc-backend subject no stream captures: published with core NATS, in order, and kept in the outbox
    while the server is down (never handed to the client's reconnect buffer, where it could vanish)."""
    from hpcbus.connection import connect
    from hpcbus.outbox import Outbox, OutboxSettings
    from hpcbus.settings import BusSettings

    server = nats_factory()
    outbox = Outbox(OutboxSettings(publish_timeout=1.0), core_subjects=["cc.job.event"])
    nc = await connect(BusSettings(nats=[server.url]), "test-outbox")
    got: list[bytes] = []
    listener = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)

    async def on_msg(msg: Any) -> None:
        got.append(msg.data)

    await listener.subscribe("cc.job.event", cb=on_msg)
    await round_trip(listener, 5)
    sender = asyncio.create_task(outbox.run(nc))
    try:
        outbox.put("cc.job.event", b"one\n", "id1")
        await wait_for_async(lambda: got == [b"one\n"], 30, lambda: f"the first message: {got}")
        server.stop()
        await wait_for_async(lambda: not nc.is_connected, 10, "the client to see the server go")
        outbox.put("cc.job.event", b"two\n", "id2")
        outbox.put("cc.job.event", b"three\n", "id3")
        await asyncio.sleep(0.5)
        assert len(outbox) == 2  # kept, not lost
        server.start()
        await wait_for_async(
            lambda: got == [b"one\n", b"two\n", b"three\n"] and len(outbox) == 0,
            30,
            lambda: f"the backlog in order: {got}",
        )
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        await listener.close()
        await nc.close()
