"""Forgery protection: a node's credentials cannot put data on the bus that claims another node.

The checks of `hpcbus consume ingest` on their own (subjects, lines, envelopes), then the whole path on a
nats-server that loads `hpcbus deploy nats-auth`'s authorization: n001 publishes, with its own seed, a
message holding its own line and one that claims `hostname=n002`; the worker forwards n001's line to
`<cluster>.metrics` (where a plain subscriber and InfluxDB get it) and refuses the other: reported on the log
subject with who and what, dead-lettered with the original, never in the telemetry stream nor InfluxDB."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from hpcbus.bus import deadletter_stream, ingest_stream, telemetry_stream
from hpcbus.consumers.ingest.sink import check_envelope, check_lines
from hpcbus.schemas import subjects
from tests.consumer_helpers import Process, Worker, count_points, wait_for
from tests.services import InfluxDB
from tests.test_nats_auth import Secured, secured  # noqa: F401  (the module's fixture)

NOW = int(time.time())


def test_ingest_subjects_read_from_the_right() -> None:
    assert (
        subjects.ingest("fox.educloud.no", "n001", "fox.educloud.no.metrics")
        == "fox.educloud.no.ingest.n001.metrics"
    )
    parsed = subjects.parse_ingest("cc.fox.educloud.no.ingest.n001.events.nodejob", "cc")
    assert parsed.host == "n001" and str(parsed.target) == "cc.fox.educloud.no.events.nodejob"
    for bad in ("fox.metrics", "fox.ingest.metrics", "fox.ingest.n001.control.get", "fox.ingest.n1.sonar.x"):
        with pytest.raises(subjects.SubjectError):
            subjects.parse_ingest(bad)
    with pytest.raises(subjects.SubjectError, match="host name"):
        subjects.ingest_node_wildcard("fox", "n001.fox.org")
    with pytest.raises(subjects.SubjectError, match="not a subject of cluster"):
        subjects.ingest("fox", "n001", "other.metrics")


def test_lines_must_name_the_credentials_host() -> None:
    payload = (
        f"mem_used,cluster=fox,hostname=n001,type=node value=1 {NOW}\n"
        f"mem_used,cluster=fox,hostname=n002,type=node value=2 {NOW}\n"
        f"mem_used,cluster=fox,host=n001,type=node value=3 {NOW}\n"  # cc-metric-store's tag name
        f"mem_used,cluster=bar,hostname=n001,type=node value=4 {NOW}\n"
        f'nodejob,cluster=fox event="{{}}" {NOW}\n'
        "garbage\n"
    ).encode()
    good, problems, reformed = check_lines(payload, "fox.ingest.n001.metrics", "n001", "fox")
    assert [g.split(" ")[1] for g in good] == ["value=1", "value=3.0"]  # as sent; host= rewritten
    assert reformed  # the host= line was formatted
    assert "hostname=n001" in good[1]  # host= read as hostname=
    reasons = [p.reason for p in problems]
    assert "claims hostname=n002 but was published with the credentials of n001" in reasons
    assert any("claims cluster=bar" in r for r in reasons)
    assert any("no hostname tag" in r for r in reasons)
    assert len(problems) == 4  # and the garbage line, with its line number
    assert any(p.line == 6 for p in problems)


def test_envelopes_must_name_the_credentials_host() -> None:
    own = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": {"node": "n001"}}}).encode()
    other = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": {"node": "n002"}}}).encode()
    errors = json.dumps({"meta": {}, "errors": [{"detail": "x", "node": "n002"}]}).encode()
    assert check_envelope(own, "s", "n001", "fox") == []
    assert [p.path for p in check_envelope(other, "s", "n001", "fox")] == ["data.attributes.node"]
    assert [p.path for p in check_envelope(errors, "s", "n001", "fox")] == ["errors[0].node"]
    assert "not a Sonar envelope" in check_envelope(b"{", "s", "n001", "fox")[0].reason


def test_envelopes_must_name_the_subjects_cluster() -> None:
    """The translation tags a sample's lines with its `cluster`: a node of fox must not write bar's series."""
    attributes = {"node": "n001", "cluster": "fox"}
    own = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": attributes}}).encode()
    attributes = {"node": "n001", "cluster": "bar"}
    other = json.dumps({"meta": {}, "data": {"type": "sample", "attributes": attributes}}).encode()
    errors = json.dumps({"meta": {}, "errors": [{"detail": "x", "node": "n001", "cluster": "bar"}]}).encode()
    assert check_envelope(own, "s", "n001", "fox") == []
    refused = check_envelope(other, "s", "n001", "fox")
    assert [p.path for p in refused] == ["data.attributes.cluster"]
    assert "claims cluster=bar" in refused[0].reason and "fox" in refused[0].reason
    assert [p.path for p in check_envelope(errors, "s", "n001", "fox")] == ["errors[0].cluster"]


@pytest.mark.services
def test_a_forged_line_is_refused_reported_and_never_stored(
    secured: Secured,  # noqa: F811
    influxdb: InfluxDB,
    tmp_path: Path,
    workers: list[Process],
) -> None:
    c, url = secured.cluster, secured.url
    db = f"ingest_{uuid.uuid4().hex[:8]}"
    bus = ["--nats", url, "--cluster", c]
    for name, argv in (
        ("worker-ingest", ["consume", "ingest", *bus]),
        ("worker-influx", ["consume", "influx", *bus, "--influx-url", influxdb.url, "--db", db]),
    ):
        w = Worker(argv, tmp_path / f"{name}.log", secured.env(name))
        workers.append(w)
        w.start(timeout=60)
    marker = uuid.uuid4().hex[:8]
    own = f"forgery_test,cluster={c},hostname=n001,type=node,run={marker} value=1.0 {NOW}"
    forged = f"forgery_test,cluster={c},hostname=n002,type=node,run={marker} value=2.0 {NOW}"

    async def publish_and_watch() -> tuple[list[bytes], list[Msg]]:
        seen: list[bytes] = []
        reader = await secured.connect("reader")
        node = await secured.connect("node-n001")
        try:

            async def on(msg: Msg) -> None:
                if marker.encode() in msg.data:
                    seen.append(msg.data)

            await reader.subscribe(subjects.metrics(c), cb=on)
            logs: list[Msg] = []

            async def on_log(msg: Msg) -> None:
                if b"n002" in msg.data:
                    logs.append(msg)

            await reader.subscribe(subjects.log(c, "hpcbus"), cb=on_log)
            await reader.flush()
            ack = await node.jetstream().publish(
                subjects.ingest(c, "n001", subjects.metrics(c)), f"{own}\n{forged}\n".encode(), timeout=10
            )
            assert ack.stream == ingest_stream(c).name
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not (seen and logs) and loop.time() < deadline:
                await asyncio.sleep(0.05)
            return seen, logs
        finally:
            await reader.close()
            await node.close()

    seen, logs = asyncio.run(publish_and_watch())
    # the plain ClusterCockpit subscriber gets n001's line only (in its canonical form: type-id added)
    assert len(seen) == 1 and seen[0].count(b"\n") == 1, seen
    assert b"hostname=n001" in seen[0] and b"value=1.0" in seen[0] and b"n002" not in seen[0]
    report = logs[0].data.decode()
    assert "loglevel=error" in report and "claims hostname=n002" in report and "credentials of n001" in report
    assert f"{c}.ingest.n001.metrics" in report  # where it came from

    where = f"WHERE run = '{marker}'"
    wait_for(lambda: count_points(influxdb, db, "forgery_test", where) == 1, 60, "n001's line in InfluxDB")

    async def stored() -> tuple[list[bytes], dict[str, str]]:
        nc = await secured.connect("admin")
        try:
            js = nc.jetstream()
            dead = await js.get_last_msg(deadletter_stream(c).name, subjects.deadletter(c, "metrics"))
            info = await js.stream_info(telemetry_stream(c).name)
            bodies = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(telemetry_stream(c).name, seq)
                if msg.data and marker.encode() in msg.data:
                    bodies.append(msg.data)
            return bodies, {**(dead.headers or {}), "data": (dead.data or b"").decode()}
        finally:
            await nc.close()

    bodies, dead = asyncio.run(stored())
    assert bodies == seen  # the telemetry stream holds n001's line, never the forged one
    assert dead["Hpcbus-Subject"] == f"{c}.ingest.n001.metrics" and forged in dead["data"]
    assert "claims hostname=n002" in dead["Hpcbus-Problems"]
    assert count_points(influxdb, db, "forgery_test", f"{where} AND hostname = 'n002'") == 0
