"""Unsafe names and bad host lists at every entry, as real processes against real services (issue 19 section
3, issue 20 items 7 and 8): the gateway answers with the place and the reason and publishes the good lines,
`consume influx` stores the good lines and dead-letters the message, `consume sonar` writes nothing outside
its tree whatever the names (both directions), and `consume ingest` refuses a forged `host` tag. The rules
themselves and the CLI entries (validate, pub --validate): tests/test_names.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from hpcbus.schemas import subjects
from hpcbus.schemas.sonar import decode_envelope
from hpcbus.streams import deadletter_stream, telemetry_stream
from tests.consumer_helpers import (
    TO_LP,
    TO_SONAR,
    Process,
    Worker,
    bus_messages,
    count_points,
    js_publish,
    settled,
    sonar_worker,
    triples,
    wait_for,
)
from tests.services import InfluxDB, NatsServer
from tests.test_consume_sonar import GPU_SAMPLES, corpus, lp_messages
from tests.test_gateway import http, start_gateway
from tests.test_names import BAD_HOST_LISTS, ESC, UNSAFE, jobs_envelope
from tests.test_nats_auth import Secured, secured  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.services

NOW = int(time.time())


def lines_with_unsafe_names(measurement: str, run: str) -> tuple[list[str], list[str]]:
    """(good lines, bad lines): every unsafe name as a hostname, a forged `host` tag, escape sequences."""
    good = [f"{measurement},hostname=n{i},run={run},type=node value={i} {NOW}" for i in range(3)]
    bad = [f"{measurement},hostname={name},run={run},type=node value=9 {NOW}" for name in UNSAFE]
    bad += [
        f"{measurement},hostname=n1,host=n2,run={run},type=node value=9 {NOW}",
        f"{measurement},hostname=n1,run={run},type=node,user={ESC} value=9 {NOW}",
        f"{measurement},cluster=../x,hostname=n1,run={run},type=node value=9 {NOW}",
        f"{measurement},hostname=a\x00b,run={run},type=node value=9 {NOW}",
    ]
    return good, bad


def interleaved(good: list[str], bad: list[str]) -> bytes:
    """Good lines first, between and after the bad ones: none of them may be lost beside a bad one."""
    return (
        "\n".join([good[0], *bad[: len(bad) // 2], good[1], *bad[len(bad) // 2 :], good[2]]) + "\n"
    ).encode()


def test_gateway_refuses_unsafe_names_with_the_reason_and_publishes_the_good_lines(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    _, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    good, bad = lines_with_unsafe_names("gw_names", "r1")
    answer = http(f"{url}/write?db=x&precision=s", interleaved(good, bad))
    assert answer.status == 400
    error = answer.json()["error"]
    assert error.startswith("partial write: ") and error.endswith(f"dropped={len(bad)}")
    for part in ("tag hostname: host name '../x'", "tag host: hostname='n1' and host='n2' name two hosts"):
        assert part in error
    assert "holds the control character '\\x1b'" in error and "\x1b" not in error  # printable reasons
    assert "tag cluster: cluster '../x': this request may publish for" in error and "NUL" in error
    stored = [
        line
        for _, payload, _ in triples(bus_messages(nats_server.url, cluster))
        for line in payload.decode().splitlines()
    ]
    assert stored == good  # every good line, nothing else

    # Sonar's HTTP sink: a record with a bad host list is refused alone naming it (a partial write, as for
    # line protocol), the other record of the envelope is stored; a job name with an escape sequence is made
    # safe, never a reason to refuse
    for text, why in BAD_HOST_LISTS.items():
        answer = http(f"{url}/sonar/job", json.dumps(jobs_envelope(text, cluster=cluster)).encode())
        assert answer.status == 400, answer.body
        error = answer.json()["error"]
        assert error.startswith("partial write: "), error
        assert f"data.attributes.slurm_jobs[1].nodes[0]: node range {text!r}: " in error and why in error
    sonar_subject = subjects.sonar(cluster, "job")
    kept = [
        job.job_id
        for m in bus_messages(nats_server.url, cluster)
        if m.subject == sonar_subject
        for job in decode_envelope(m.data, expect="job").data.attributes.slurm_jobs  # type: ignore[union-attr]
    ]
    assert kept == [1], kept  # the good record of the five envelopes (the same each time: stored once)
    answer = http(f"{url}/sonar/job", json.dumps(jobs_envelope("n1", job_name=ESC, cluster=cluster)).encode())
    assert answer.status == 200 and answer.json() == {"published": 1}, answer.body
    answer = http(
        f"{url}/sonar/job", json.dumps(jobs_envelope("c1-[5-6,8-9],gpu-[10-12]", cluster=cluster)).encode()
    )
    assert answer.status == 200 and answer.json() == {"published": 1}


def test_consume_influx_stores_the_good_lines_and_dead_letters_the_unsafe_names(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    db = f"names_{uuid.uuid4().hex[:8]}"
    argv = ["consume", "influx", "--nats", nats_server.url, "--cluster", cluster]
    w = Worker([*argv, "--influx-url", influxdb.url, "--db", db], tmp_path / "influx.log")
    workers.append(w)
    w.start()
    good, bad = lines_with_unsafe_names("influx_names", "r2")
    js_publish(nats_server.url, [(subjects.metrics(cluster), interleaved(good, bad))])
    wait_for(lambda: count_points(influxdb, db, "influx_names") == 3, 30, "the three good lines in InfluxDB")
    dead = wait_for(lambda: bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ"), 30, "the dead letter")
    [letter] = dead
    problems = json.loads((letter.headers or {})["Hpcbus-Problems"])
    half = len(bad) // 2  # lines 2.. hold the first half, then a good line, then the second half
    assert [p["line"] for p in problems] == [*range(2, 2 + half), *range(3 + half, 3 + len(bad))]
    assert any(p["path"] == "tag hostname" and "host name '../x'" in p["reason"] for p in problems)
    assert any(p["path"] == "tag user" and "'\\x1b'" in p["reason"] for p in problems)
    rows = influxdb.points('SELECT "value", "hostname" FROM "influx_names"', db)
    assert sorted(r["hostname"] for r in rows) == ["n0", "n1", "n2"]
    tags = json.dumps(influxdb.points('SHOW TAG VALUES FROM "influx_names" WITH KEY = "user"', db))
    assert "31m" not in tags  # no escape sequence stored


def test_consume_sonar_writes_nothing_outside_its_tree_whatever_the_names(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """Both directions with `--directory`: line protocol naming hosts `../x`, `a/b`, ... and Sonar envelopes
    naming such nodes are refused (dead-lettered with the reason); the good sample beside them gets its file,
    and no file appears anywhere but the tree."""
    tree = tmp_path / "deep" / "tree"
    sonar_worker(
        workers,
        tmp_path,
        nats_server.url,
        cluster,
        "--to",
        "both",
        "--grace",
        "1",
        "--directory",
        f"{tree}/{{cluster}}",
    )
    sample = corpus(GPU_SAMPLES, "sample")[0]
    good_lp = lp_messages(sample, cluster)
    bad_lp = [
        (
            subjects.metrics(cluster),
            f"sonar_names,hostname={name},type=node,type-id=0 value=1 {NOW}\n".encode(),
        )
        for name in ("../x", "../../escaped", "a/b", "..", "a\\b", ESC, "h" * 300)
    ]
    raw = json.loads(json.dumps({"meta": {"producer": "sonar", "version": "0.19.0"}}))
    bad_sonar = []
    for name in ("../../escaped", "a/b", "..", ESC):
        attributes = {"time": "2025-04-13T10:00:00+02:00", "cluster": cluster, "node": name, "system": {}}
        envelope = {**raw, "data": {"type": "sample", "attributes": attributes}}
        bad_sonar.append((subjects.sonar(cluster, "sample"), json.dumps(envelope).encode()))
    jobs = [
        (subjects.sonar(cluster, "job"), json.dumps(jobs_envelope(text)).encode()) for text in BAD_HOST_LISTS
    ]
    js_publish(nats_server.url, [*bad_lp, *good_lp, *bad_sonar, *jobs])
    own = tree / cluster / "2025/04/13" / f"0+sample-{sample.data.attributes.node}.json"
    wait_for(own.exists, 30, "the good sample's file")
    wait_for(lambda: settled(nats_server.url, cluster, TO_SONAR, TO_LP), 30, "both directions settled")
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    outside = [
        f for f in files if not f.startswith(f"deep/tree/{cluster}/") and not f.endswith((".log", ".toml"))
    ]
    assert outside == [] and files, files
    written = [p for p in (tree / cluster).rglob("*") if p.is_file()]
    # the good sample, and the good record of each job envelope (its bad-host-list record refused alone)
    job_files = [p for p in written if p != own]
    assert own in written and len(job_files) == 1 and job_files[0].name == "0+job-slurm.json", written
    records = [
        job.job_id
        for line in job_files[0].read_text().splitlines()
        for job in decode_envelope(line, expect="job").data.attributes.slurm_jobs  # type: ignore[union-attr]
    ]
    assert records and set(records) == {1}, records
    [envelope] = [decode_envelope(line, expect="sample") for line in own.read_text().splitlines()]
    assert envelope == sample
    dead = bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ")
    assert len(dead) == len(bad_lp) + len(bad_sonar) + len(jobs)
    reasons = [json.loads((m.headers or {})["Hpcbus-Problems"]) for m in dead]
    assert all(r for r in reasons)
    paths = {p["path"] for problems in reasons for p in problems}
    assert {"tag hostname", "data.attributes.node", "data.attributes.slurm_jobs[1].nodes[0]"} <= paths


def test_consume_ingest_refuses_a_forged_host_tag_and_unsafe_names(
    secured: Secured,  # noqa: F811
    tmp_path: Path,
    workers: list[Process],
) -> None:
    c, url = secured.cluster, secured.url
    w = Worker(
        ["consume", "ingest", "--nats", url, "--cluster", c],
        tmp_path / "ingest.log",
        secured.env("worker-ingest"),
    )
    workers.append(w)
    w.start(timeout=60)
    marker = uuid.uuid4().hex[:8]
    lines = [
        f"names_ingest,cluster={c},hostname=n001,run={marker},type=node value=1 {NOW}",
        f"names_ingest,cluster={c},hostname=n001,host=n002,run={marker},type=node value=2 {NOW}",
        f"names_ingest,cluster={c},hostname=n001,run={marker},type=node,user={ESC} value=3 {NOW}",
        f"names_ingest,cluster={c},hostname=n001,run={marker},type=node value=4 {NOW}",
    ]

    async def publish() -> None:
        node = await secured.connect("node-n001")
        try:
            payload = ("\n".join(lines) + "\n").encode()
            await node.jetstream().publish(
                subjects.ingest(c, "n001", subjects.metrics(c)), payload, timeout=10
            )
        finally:
            await node.close()

    async def stored() -> tuple[list[bytes], Any]:
        nc = await secured.connect("admin")
        try:
            js = nc.jetstream()
            info = await js.stream_info(telemetry_stream(c).name)
            bodies = []
            for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):  # none while empty
                msg = await js.get_msg(telemetry_stream(c).name, seq)
                if msg.data and marker.encode() in msg.data:
                    bodies.append(msg.data)
            dead: Msg | Any = None
            if bodies:
                dead = await js.get_last_msg(deadletter_stream(c).name, subjects.deadletter(c, "metrics"))
            return bodies, dead
        finally:
            await nc.close()

    asyncio.run(publish())
    bodies, dead = wait_for(
        lambda: (got := asyncio.run(stored()))[0] and got, 60, "n001's own lines forwarded"
    )
    [body] = bodies
    assert b"value=1" in body and b"value=4" in body and b"n002" not in body and b"\x1b" not in body
    assert dead is not None and marker.encode() in (dead.data or b"")
    problems = json.loads((dead.headers or {})["Hpcbus-Problems"])
    assert [p["line"] for p in problems] == [2, 3]
    assert problems[0]["path"] == "tag host" and "n002" in problems[0]["reason"]
    assert problems[1]["path"] == "tag user" and "'\\x1b'" in problems[1]["reason"]


def test_gateway_refuses_wide_lines_unsafe_keys_and_device_paths_and_stores_the_rest(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """Issue 29 items 8 and 9 through a real gateway: a 90 kB line of 10,000 fields (it made 10,000
    measurements), an ESC in a Telegraf field key (answered 204, read by raw NATS readers, dead-lettered by
    every worker), `type-id=../../x`, `/` in a measurement and an event class are refused with the reason in a
    partial write; the lines beside them are stored, and nothing refused reaches NATS. The new measurements of
    one request are limited (the excess refused by line number); a Sonar envelope dated 9999 is refused."""
    _, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    wide = ",".join(f"f{i:05d}=1" for i in range(10_000))  # the 90 kB line
    body = "\n".join(
        [
            f"gw29,host=n1 usage_user=1,usage_system=2 {NOW}",
            f"gw29wide,host=n1 {wide} {NOW}",
            f"gw29,host=n1 usage{ESC}=1,usage_idle=3 {NOW}",
            f"gw29_socket,hostname=n1,type=socket,type-id=../../x value=4 {NOW}",
            f"gw29/x,hostname=n1,type=node value=5 {NOW}",
            f'gw29/ev,type=node event="{{}}" {NOW}',
            f"gw29_socket,hostname=n1,type=socket,type-id=0 value=6 {NOW}",
        ]
    ).encode()
    assert len(body) > 90_000
    answer = http(f"{url}/write?db=x&precision=s", body)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error.startswith("partial write: ") and error.endswith("dropped=5"), error
    for part in (
        "POST /write:2: lp: fields: 10000 fields in one line, more than 1000",
        "POST /write:3: lp: field 'usage\\x1b[31m': field key 'usage\\x1b[31m' holds the control character",
        "POST /write:4: lp: tag type-id: type-id '../../x': character '/' at offset 2 is not allowed",
        "POST /write:5: lp: measurement: measurement 'gw29/x': character '/'",
        "POST /write:6: lp: measurement: event class 'gw29/ev': character '/'",
    ):
        assert part in error, (part, error)
    assert "\x1b" not in error
    messages = bus_messages(nats_server.url, cluster)
    raw = b"".join(m.data or b"" for m in messages)
    assert b"\x1b" not in raw and b"../../x" not in raw and b"gw29/" not in raw and b"gw29wide" not in raw
    assert sorted(line for line in raw.decode().splitlines() if line.startswith("gw29")) == [
        f"gw29_socket,hostname=n1,type=socket,type-id=0 value=6 {NOW}",
        f"gw29_usage_system,hostname=n1,type=node value=2.0 {NOW}",
        f"gw29_usage_user,hostname=n1,type=node value=1.0 {NOW}",
    ]

    # a request introduces at most 2,000 new measurements: the rest are refused by line, the first stored
    many = "\n".join(f"gw29n{i},hostname=n1,type=node value={i} {NOW}" for i in range(2_003)).encode()
    answer = http(f"{url}/write?db=x&precision=s", many)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error.startswith("partial write: ") and error.endswith("dropped=3"), error
    assert (
        "POST /write:2001: lp metric: measurement: 1 new measurement ('gw29n2000') beyond the 2000" in error
    )
    stored_names = {
        line.split(",", 1)[0]
        for m in bus_messages(nats_server.url, cluster)
        for line in (m.data or b"").decode().splitlines()
        if line.startswith("gw29n")
    }
    assert stored_names == {f"gw29n{i}" for i in range(2_000)}

    # Sonar: an envelope dated 9999 is refused naming the field; one of today is stored
    attributes = {"time": "9999-12-31T23:59:59Z", "cluster": cluster, "node": "n1", "system": {}}
    envelope = {
        "meta": {"producer": "sonar", "version": "0.19.0"},
        "data": {"type": "sample", "attributes": attributes},
    }
    answer = http(f"{url}/sonar/sample", json.dumps(envelope).encode())
    assert answer.status == 400, answer.body
    assert "sonar sample: data.attributes.time: '9999-12-31T23:59:59Z' is " in answer.json()["error"]
    assert "later than now + max_future" in answer.json()["error"]
    attributes["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW))
    answer = http(f"{url}/sonar/sample", json.dumps(envelope).encode())
    assert answer.status == 200, answer.body
    dated = [
        m.data
        for m in bus_messages(nats_server.url, cluster)
        if m.subject == subjects.sonar(cluster, "sample")
    ]
    assert len(dated) == 1 and b"9999-" not in dated[0]
