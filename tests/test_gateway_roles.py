"""Issue 29 item 10: the gateway is no second door. A node credential may post what `consume ingest` lets a
node send, about its own hosts only; the master's may post Sonar job and cluster envelopes. Through a real
gateway process and nats-server: answers, reasons, and what JetStream holds afterwards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcbus.producers.gateway.auth import hash_secret
from hpcbus.schemas import subjects
from hpcbus.schemas.jobsummary import POINT, event_line
from hpcbus.schemas.lineprotocol import event, format_line
from hpcbus.schemas.nodejob import NodeJob, node_job_line
from tests.consumer_helpers import Process
from tests.corpus import CORPUS
from tests.summaries import a_summary
from tests.test_gateway import basic, http, start_gateway, stored

pytestmark = pytest.mark.services

SONAR = CORPUS / "sonar"
FOX = "fox.educloud.no"
NODE = "c1-10.fox"
"""The node of the corpus sample (`slurmmonitor__fox_sample_slurmnode_v0.18.json`)."""


def roles_file(tmp_path: Path) -> Path:
    path = tmp_path / "roles.toml"
    path.write_text(
        f'[clusters."{FOX}"]\nsecret = "{hash_secret("master-pw", iterations=1000)}"\nrole = "master"\n'
        f'[clusters."{FOX}".credentials.c1-10]\nsecret = "{hash_secret("node-pw", iterations=1000)}"\n'
        f'hosts = ["{NODE}"]\n'
        f'[clusters."{FOX}".credentials.profile]\nsecret = "{hash_secret("shared-pw", iterations=1000)}"\n'
        'hosts = ["c2-[1-4]"]\n'
    )
    return path


def test_a_node_credential_posts_what_a_node_may_and_the_master_the_rest(
    nats_factory: Any, tmp_path: Path, workers: list[Process]
) -> None:
    server = nats_factory()  # the corpus' cluster name is fixed: a bus of this test's own
    _, url = start_gateway(workers, tmp_path, server.url, "--auth-file", str(roles_file(tmp_path)))
    node = basic(FOX, "c1-10:node-pw")
    master = basic(FOX, "master-pw")
    jobs = (SONAR / "sonar__fox_jobs_v0.18.1_trimmed.json").read_bytes()
    cluster = (SONAR / "sonar__fox_cluster_v0.16.json").read_bytes()
    sample = (SONAR / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_bytes()

    # a node credential may not post Slurm records or cluster descriptions at all (403, with the reason)
    for topic, body in (("job", jobs), ("cluster", cluster)):
        answer = http(f"{url}/sonar/{topic}", body, headers=node)
        assert answer.status == 403, (topic, answer.status, answer.body)
        assert f"{FOX}/c1-10 may not send Sonar {topic} records" in answer.body.decode()
    # its own sample passes; the same sample claiming another node is refused with the reason
    assert http(f"{url}/sonar/sample", sample, headers=node).status == 200
    forged = json.loads(sample)
    forged["data"]["attributes"]["node"] = "c1-11.fox"
    answer = http(f"{url}/sonar/sample", json.dumps(forged).encode(), headers=node)
    # another node's name is a question of permission, as another cluster's is (403), not invalid input
    assert answer.status == 403 and "claims node=c1-11.fox" in answer.body.decode(), answer.body

    # line protocol: its own metric is stored; another host's nodejob (the host inside the JSON) and a
    # Slurm record as an event line are refused in the same request, with the reasons (a partial write)
    now = 1_764_000_000
    own = f"mem_used,hostname={NODE},type=node value=1 {now}"
    other_job = node_job_line(
        NodeJob(job_id=7770001, cluster=FOX, hostname="c1-11.fox", start_time=now), "start", now
    )
    other_job.tags["hostname"] = NODE
    record = format_line(event("slurm", jobs.decode(), time=now, function="sonar", hostname=NODE))
    body = f"{own}\n{format_line(other_job)}\n{record}\n".encode()
    answer = http(f"{url}/write?db=x&precision=s", body, headers=node)
    text = answer.body.decode()
    assert answer.status == 400 and "partial write" in text and "dropped=2" in text, text
    assert "claims hostname=c1-11.fox" in text and "may not send slurm events" in text, text
    # a credential shared by several nodes (Slurm's profile plugin) speaks for each of them, not others
    shared = basic(FOX, "profile:shared-pw")
    body = f"cpu_load,hostname=c2-3,type=node value=1 {now}\ncpu_load,hostname=c9-1,type=node value=1 {now}\n"
    answer = http(f"{url}/write?db=x&precision=s", body.encode(), headers=shared)
    assert answer.status == 400 and "claims hostname=c9-1" in answer.body.decode(), answer.body
    # a wrong secret under a credential's name is no credential
    assert http(f"{url}/write?db=x", body.encode(), headers=basic(FOX, "c1-10:master-pw")).status == 401

    # the master may post job and cluster records
    for topic, body in (("job", jobs), ("cluster", cluster)):
        answer = http(f"{url}/sonar/{topic}", body, headers=master)
        assert answer.status == 200, (topic, answer.status, answer.body)

    held = stored(server.url, FOX)
    by_subject: dict[str, list[bytes]] = {}
    for subject, payload, _ in held:
        by_subject.setdefault(subject, []).append(payload)
    assert (
        len(by_subject[subjects.sonar(FOX, "job")]) >= 1
        and len(by_subject[subjects.sonar(FOX, "cluster")]) == 1
    )
    metrics = b"".join(by_subject[subjects.metrics(FOX)])
    assert f"hostname={NODE}".encode() in metrics and b"c2-3" in metrics and b"c9-1" not in metrics
    assert (
        subjects.events(FOX, "nodejob") not in by_subject and subjects.events(FOX, "slurm") not in by_subject
    )
    samples = by_subject[subjects.sonar(FOX, "sample")]
    assert len(samples) == 1 and b"c1-11.fox" not in samples[0]


def test_no_credential_may_post_a_job_summary(
    nats_factory: Any, tmp_path: Path, workers: list[Process]
) -> None:
    """Issue 34: `consume influx` writes the `job_summary` point of each `jobsummary` event, so the summaries
    are the jobs worker's word alone. The gateway refuses a `jobsummary` event and a `job_summary` line from
    every credential, the master's as a node's, through `/write` and `/api/v2/write`, saying why, and passes
    the rest of the request; nothing reaches `<cluster>.events.jobsummary`."""
    server = nats_factory()
    _, url = start_gateway(workers, tmp_path, server.url, "--auth-file", str(roles_file(tmp_path)))
    summary = a_summary(FOX, end=1_764_000_100)
    # a metric named like the point (a whole point would be split into `job_summary_<field>` metrics)
    point = f"{POINT},cluster={FOX},hostname={NODE},job=4242 value=1 1764000100000000000"
    forged = f"{format_line(event_line(summary))}\n{point}\n"
    posts = [
        ("/write?db=x&precision=ns", basic(FOX, "master-pw")),
        ("/api/v2/write?bucket=x&precision=ns", {"Authorization": f"Token {FOX}:master-pw"}),
        ("/write?db=x&precision=ns", basic(FOX, "c1-10:node-pw")),
        ("/api/v2/write?bucket=x&precision=ns", {"Authorization": f"Token {FOX}:c1-10:node-pw"}),
    ]
    for i, (path, headers) in enumerate(posts):
        own = f"mem_used,hostname={NODE},type=node value={i} 1764000100000000000\n"
        answer = http(url + path, (own + forged).encode(), headers=headers)
        text = answer.body.decode()
        assert answer.status == 400 and "partial write" in text and "dropped=2" in text, (path, text)
        assert text.count("is written by the jobs worker (hpcbus consume jobs) only") == 2, text
    held = stored(server.url, FOX)
    assert subjects.jobsummary(FOX) not in {subject for subject, _, _ in held}
    lines = [line for _, payload, _ in held for line in payload.decode().splitlines()]
    assert sorted(line.split(" ")[1] for line in lines if line.startswith("mem_used,")) == [
        f"value={i}" for i in range(4)
    ]
    assert not [line for line in lines if line.startswith(("jobsummary", "job_summary"))], lines
