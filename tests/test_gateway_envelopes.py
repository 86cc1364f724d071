"""Sonar envelopes larger than one NATS message, end to end against real services: Sonar's POST to the
gateway (and `hpcbus pub`) -> JetStream -> the real `consume sonar` and `consume influx` workers -> InfluxDB
and the Sonar directory tree. Jobs and cluster envelopes are cut into valid envelopes that fit the server's
`max_payload` (read from the server); a sample or a single record too large for one message is refused by
name. Every wait is on state: the stream's content, InfluxDB's rows, the tree's files."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus.bus import ID_HEADER_BYTES
from hpcbus.schemas.sonar import decode_envelope, encode_envelope
from hpcbus.schemas.sonar.types import JobsEnvelope
from hpcbus.schemas.translate import batch, envelope_to_lines, jobs_to_lines, route
from tests.consumer_helpers import (
    TO_LP,
    TO_SONAR,
    Process,
    Worker,
    bus_messages,
    js_publish,
    settled,
    sonar_worker,
    wait_for,
)
from tests.services import InfluxDB
from tests.sonar_big import SONAR, big_cluster, big_jobs, big_sample
from tests.test_gateway import http, start_gateway

pytestmark = pytest.mark.services

SERVER_LIMIT = 1024 * 1024
"""nats-server's default `max_payload`, which the servers of these tests announce unless told otherwise."""


def on_subject(url: str, subject: str) -> list[bytes]:
    return [m.data or b"" for m in bus_messages(url, subject.split(".sonar.")[0]) if m.subject == subject]


def keys(records: list[Any]) -> list[tuple[int, str]]:
    return [(r["job_id"], r.get("job_step", "")) for r in records]


def tree_records(root: Path) -> list[dict[str, Any]]:
    """The Slurm records of every jobs envelope in the tree, one line per envelope."""
    return [
        r
        for path in sorted(root.rglob("0+job-slurm.json"))
        for line in path.read_text().splitlines()
        for r in json.loads(line)["data"]["attributes"]["slurm_jobs"]
    ]


def influx_records(influxdb: InfluxDB, db: str) -> list[dict[str, Any]]:
    """The Slurm records of every `slurm` event point in InfluxDB (the envelope JSON in its `event`)."""
    if db not in {row["name"] for row in influxdb.points("SHOW DATABASES")}:
        return []
    rows = influxdb.points('SELECT "event" FROM "slurm"', db)
    return [r for row in rows for r in json.loads(row["event"])["data"]["attributes"]["slurm_jobs"]]


def pub(url: str, subject: str, source: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`hpcbus pub SUBJECT < source`, a real process."""
    with source.open("rb") as stdin:
        return subprocess.run(
            [sys.executable, "-m", "hpcbus", "pub", "--nats", url, *args, subject],
            stdin=stdin,
            capture_output=True,
            timeout=60,
        )


def start_workers(
    workers: list[Process], tmp_path: Path, url: str, cluster: str, influxdb: InfluxDB, tree: Path
) -> str:
    """`consume sonar --to lp --directory` and `consume influx` for the cluster; the database's name."""
    db = f"env_{uuid.uuid4().hex[:8]}"
    sonar_worker(workers, tmp_path, url, cluster, "--to", "lp", "--directory", str(tree))
    influx = Worker(
        [
            "consume", "influx", "--nats", url, "--cluster", cluster, "--influx-url", influxdb.url, "--db", db,
            "--config", str(tmp_path / "hpcbus.toml"),
        ],
        tmp_path / "influx.log",
    )  # fmt: skip
    workers.append(influx)
    influx.start()
    return db


def test_a_2mb_jobs_envelope_is_stored_completely_once_by_the_gateway_and_by_pub(
    nats_factory: Any, influxdb: InfluxDB, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    server = nats_factory()
    _, url = start_gateway(workers, tmp_path, server.url, "--cluster", cluster)
    subject = f"{cluster}.sonar.job"
    env = big_jobs(2_000_000, cluster)
    body = encode_envelope(env) + b"\n"  # as Sonar's curl sends it: one envelope and a newline
    assert len(body) > 2_000_000

    answer = http(f"{url}/sonar/job", body, headers={"Content-Type": "application/json"})
    assert answer.status == 200, answer.body
    assert answer.json() == {"published": 1, "messages": 2}
    # answered only after every part was stored: both are in the stream the moment the answer is here
    parts = on_subject(server.url, subject)
    assert len(parts) == 2 and all(len(p) <= SERVER_LIMIT - ID_HEADER_BYTES for p in parts)
    decoded = [decode_envelope(p, expect="job") for p in parts]
    assert all(isinstance(e, JobsEnvelope) and e.meta == env.meta for e in decoded)
    assert [r for e in decoded for r in e.data.attributes.slurm_jobs] == env.data.attributes.slurm_jobs  # type: ignore[union-attr]
    # the answer lost, Sonar's curl sends it again: nothing is stored twice
    assert http(f"{url}/sonar/job", body).json() == {"published": 1, "messages": 2}
    assert on_subject(server.url, subject) == parts

    # `hpcbus pub` of another 2 MB envelope (a later time): cut the same way, and a repeated pub stores nothing
    assert env.data is not None
    later = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            env.data,
            attributes=msgspec.structs.replace(env.data.attributes, time="2026-03-03T16:36:57+02:00"),
        ),
    )
    source = tmp_path / "jobs.json"
    source.write_bytes(encode_envelope(later))
    for _ in range(2):
        done = pub(server.url, subject, source, "--jetstream")
        assert done.returncode == 0, done.stderr
        assert done.stderr.decode().count("stored as") == 2
    pub_parts = on_subject(server.url, subject)[2:]
    assert len(pub_parts) == 2
    assert [r for p in pub_parts for r in decode_envelope(p, expect="job").data.attributes.slurm_jobs] == (  # type: ignore[union-attr]
        later.data.attributes.slurm_jobs  # type: ignore[union-attr]
    )

    # the real workers: every record once in InfluxDB and once in the Sonar tree
    tree = tmp_path / "tree"
    db = start_workers(workers, tmp_path, server.url, cluster, influxdb, tree)
    want = keys(msgspec.to_builtins(env.data.attributes.slurm_jobs)) * 2
    wait_for(lambda: len(influx_records(influxdb, db)) >= len(want), 120, f"{len(want)} records in {db}")
    wait_for(lambda: len(tree_records(tree)) >= len(want), 60, "the records in the tree")
    wait_for(lambda: settled(server.url, cluster, TO_LP), 60, "consume sonar settled")
    assert Counter(keys(influx_records(influxdb, db))) == Counter(
        want
    )  # each twice: two envelopes, no copies
    assert Counter(keys(tree_records(tree))) == Counter(want)
    assert len(set(want)) * 2 == len(want) == 2 * len(env.data.attributes.slurm_jobs)
    files = [line for p in tree.rglob("0+job-slurm.json") for line in p.read_text().splitlines()]
    assert len(files) == 4  # one line per part, as Jobanalyzer reads them
    print(f"largest envelope stored: {len(body)} bytes in {len(parts)} messages")


def test_a_record_or_sample_too_large_is_refused_by_name_and_the_rest_is_stored(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    server = nats_factory()
    _, url = start_gateway(workers, tmp_path, server.url, "--cluster", cluster)
    env = big_jobs(30_000, cluster)
    assert env.data is not None
    records = env.data.attributes.slurm_jobs
    # a free-text field with no length rule (a job name would be cut to 1,024 characters, never refused)
    huge = msgspec.structs.replace(records[5], reservation="x" * (SERVER_LIMIT + 10))
    bad = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            env.data,
            attributes=msgspec.structs.replace(
                env.data.attributes, slurm_jobs=[*records[:5], huge, *records[6:]]
            ),
        ),
    )
    answer = http(f"{url}/sonar/job", encode_envelope(bad))
    assert answer.status == 413, answer.body
    error = answer.json()["error"]
    assert f"job {huge.job_id}" in error and "data.attributes.slurm_jobs[5]" in error, error
    stored = on_subject(server.url, f"{cluster}.sonar.job")
    got = [r for p in stored for r in decode_envelope(p, expect="job").data.attributes.slurm_jobs]  # type: ignore[union-attr]
    assert got == [*records[:5], *records[6:]]  # every other record kept

    # a sample is one reading: never cut in two, refused with the reason, nothing stored
    sample = encode_envelope(big_sample(SERVER_LIMIT + 1000, cluster))
    answer = http(f"{url}/sonar/sample", sample)
    assert answer.status == 413 and "never cut" in answer.json()["error"], answer.body
    assert on_subject(server.url, f"{cluster}.sonar.sample") == []
    # and `hpcbus pub` says the same and sends nothing
    source = tmp_path / "sample.json"
    source.write_bytes(sample)
    done = pub(server.url, f"{cluster}.sonar.sample", source)
    assert done.returncode == 1 and "never cut" in done.stderr.decode(), done.stderr
    assert on_subject(server.url, f"{cluster}.sonar.sample") == []


def test_the_limit_is_the_servers_max_payload(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    """A server announcing 64 KiB: a cluster envelope with many nodes and a jobs envelope are cut to fit it,
    a sample of 100 KB (which a default server takes whole) is refused, and `consume sonar --to lp` cuts
    its events to the same limit: every node and record reaches the tree."""
    limit = 64 * 1024
    server = nats_factory(max_payload=limit)
    _, url = start_gateway(workers, tmp_path, server.url, "--cluster", cluster)
    clusters = big_cluster(3000, cluster)
    jobs = big_jobs(300_000, cluster)
    answer = http(f"{url}/sonar/cluster", encode_envelope(clusters))
    assert answer.status == 200, answer.body
    assert answer.json()["messages"] >= 4
    answer = http(f"{url}/sonar/job", encode_envelope(jobs))
    assert answer.status == 200 and answer.json()["messages"] >= 5, answer.body
    sizes = [len(m.data or b"") for m in bus_messages(server.url, cluster)]
    assert sizes and max(sizes) <= limit - ID_HEADER_BYTES
    answer = http(f"{url}/sonar/sample", encode_envelope(big_sample(100_000, cluster)))
    assert answer.status == 413 and f"({limit - ID_HEADER_BYTES})" in answer.json()["error"], answer.body

    tree = tmp_path / "tree"
    sonar_worker(workers, tmp_path, server.url, cluster, "--to", "lp", "--directory", str(tree))
    wait_for(lambda: settled(server.url, cluster, TO_LP), 60, "consume sonar settled")
    nodes = [
        n
        for path in tree.rglob("0+cluzter-slurm.json")
        for line in path.read_text().splitlines()
        for n in json.loads(line)["data"]["attributes"].get("nodes", [])
    ]
    assert nodes == msgspec.to_builtins(clusters.data.attributes.nodes)  # type: ignore[union-attr]
    assert keys(tree_records(tree)) == keys(msgspec.to_builtins(jobs.data.attributes.slurm_jobs))  # type: ignore[union-attr]
    events = [m for m in bus_messages(server.url, cluster, f"{cluster}.events.")]
    assert events and max(len(m.data or b"") for m in events) <= limit
    hosts = [
        n["hostname"]
        for m in events
        if m.subject == f"{cluster}.events.nodestate"
        for line in (m.data or b"").decode().splitlines()
        for n in json.loads(json.loads('"' + line.split(' event="', 1)[1].rsplit('" ', 1)[0] + '"'))["nodes"]
    ]
    assert len(hosts) == 3000 * 64 and len(set(hosts)) == len(hosts)


def test_consume_sonar_to_sonar_publishes_a_large_jobs_envelope_in_parts(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    """The way back: a producer's `slurm` events of a 2 MB jobs envelope (in parts) are joined by the
    assembler, and the envelope goes out on `.sonar.job` in parts that fit, every record once in the tree."""
    server = nats_factory()
    env = big_jobs(2_000_000, cluster)
    lines = jobs_to_lines(env, cc_events=False)
    tree = tmp_path / "tree"
    sonar_worker(
        workers, tmp_path, server.url, cluster, "--to", "sonar", "--grace", "1", "--directory", str(tree)
    )
    js_publish(server.url, [(s, p) for s, group in route(lines, cluster).items() for p in batch(group)])
    subject = f"{cluster}.sonar.job"
    wait_for(lambda: len(on_subject(server.url, subject)) >= 2, 60, "the envelope's parts on .sonar.job")
    wait_for(lambda: settled(server.url, cluster, TO_SONAR), 60, "consume sonar settled")
    parts = on_subject(server.url, subject)
    assert len(parts) == 2 and max(map(len, parts)) <= SERVER_LIMIT
    got = [r for p in parts for r in decode_envelope(p, expect="job").data.attributes.slurm_jobs]  # type: ignore[union-attr]
    assert got == env.data.attributes.slurm_jobs  # type: ignore[union-attr]
    assert keys(tree_records(tree)) == keys(msgspec.to_builtins(got))


def test_up_to_max_body_no_envelope_is_refused_for_its_size(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    """`max_body` is the only size limit of a jobs envelope: one just below it (8 MiB here, 32 MiB by default)
    is stored in parts, every record once; one byte more is 413 for the body, before anything is read."""
    max_body = 8 * 2**20
    server = nats_factory()
    _, url = start_gateway(workers, tmp_path, server.url, "--cluster", cluster, "--max-body", str(max_body))
    env = big_jobs(max_body - 20_000, cluster)
    assert env.data is not None
    body = encode_envelope(env)
    records = env.data.attributes.slurm_jobs
    while len(body) > max_body:  # just below the limit
        records = records[:-1]
        env = msgspec.structs.replace(
            env,
            data=msgspec.structs.replace(
                env.data, attributes=msgspec.structs.replace(env.data.attributes, slurm_jobs=records)
            ),
        )
        body = encode_envelope(env)
    assert max_body - 5_000 < len(body) <= max_body
    answer = http(f"{url}/sonar/job", body)
    assert answer.status == 200, answer.body
    parts = on_subject(server.url, f"{cluster}.sonar.job")
    assert answer.json() == {"published": 1, "messages": len(parts)} and len(parts) == 9
    got = [r for p in parts for r in decode_envelope(p, expect="job").data.attributes.slurm_jobs]  # type: ignore[union-attr]
    assert got == records
    answer = http(f"{url}/sonar/job", body + b" " * (max_body + 1 - len(body)))
    assert answer.status == 413 and f"larger than {max_body} bytes" in answer.json()["error"], answer.body


def test_consume_sonar_to_sonar_dead_letters_a_sample_too_large_for_one_message(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    """A sample rebuilt from its lines that is larger than one message is never cut in two: it goes to the
    dead-letter stream whole (in parts there, which `deadletter replay` joins) with the reason."""
    limit = 256 * 1024
    server = nats_factory(max_payload=limit)
    env = big_sample(limit + 10_000, cluster)
    lines = envelope_to_lines(env, cluster=cluster)
    tree = tmp_path / "tree"
    sonar_worker(
        workers, tmp_path, server.url, cluster, "--to", "sonar", "--grace", "1", "--directory", str(tree)
    )
    js_publish(
        server.url, [(s, p) for s, group in route(lines, cluster).items() for p in batch(group, limit // 2)]
    )
    wait_for(
        lambda: bus_messages(server.url, cluster, kind="HPCBUS_DLQ"),
        60,
        "the sample in the dead-letter stream",
    )
    wait_for(lambda: settled(server.url, cluster, TO_SONAR), 60, "consume sonar settled")
    letters = bus_messages(server.url, cluster, kind="HPCBUS_DLQ")
    assert all((m.headers or {}).get("Hpcbus-Subject") == f"{cluster}.sonar.sample" for m in letters)
    assert "never cut" in (letters[0].headers or {})["Hpcbus-Problems"]
    whole = b"".join(m.data or b"" for m in letters)
    assert (
        len(whole) > limit
        and decode_envelope(whole, expect="sample").data.attributes.node == env.data.attributes.node
    )  # type: ignore[union-attr]
    assert on_subject(server.url, f"{cluster}.sonar.sample") == [] and not list(tree.rglob("0+sample-*"))


def test_consume_sonar_to_lp_dead_letters_an_envelope_whose_line_cannot_fit(
    nats_factory: Any, tmp_path: Path, workers: list[Process], cluster: str
) -> None:
    """A sysinfo that fits one message as JSON but not as an event line (its quotes escaped) is
    dead-lettered with the reason; the worker goes on (it used to retry the publish forever)."""
    limit = 64 * 1024
    server = nats_factory(max_payload=limit)
    raw = (SONAR / "jobanalyzer__cluster1_sysinfo_v0.19.jsonl").read_bytes().splitlines()[0]
    good = decode_envelope(raw, expect="sysinfo")
    assert good.data is not None
    attrs = msgspec.structs.replace(good.data.attributes, topo_text='"' * 25_000)
    bad = msgspec.structs.replace(good, data=msgspec.structs.replace(good.data, attributes=attrs))
    assert len(encode_envelope(bad)) < limit - 1000
    sonar_worker(workers, tmp_path, server.url, cluster, "--to", "lp")
    subject = f"{cluster}.sonar.sysinfo"
    js_publish(server.url, [(subject, encode_envelope(bad)), (subject, raw)])
    wait_for(lambda: settled(server.url, cluster, TO_LP), 60, "consume sonar settled")
    events = bus_messages(server.url, cluster, f"{cluster}.events.sysinfo")
    assert len(events) == 1 and b"topo_text" not in (events[0].data or b"")
    letters = bus_messages(server.url, cluster, kind="HPCBUS_DLQ")
    assert letters and "longer than one NATS message" in (letters[0].headers or {})["Hpcbus-Problems"]
