"""One node, one name (issue 19, section 3): the host-name form shared by `produce node` and `consume sonar`.

The rule (`schemas.hostnames`) on its own, then the node agent's `--once` output (Sonar envelope and line
protocol) and the Sonar bridge in both directions as real worker processes, all with the same setting.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus import cli
from hpcbus.producers.ccbackend import CcBackendRelay
from hpcbus.producers.node.pipeline import AgentConfig
from hpcbus.producers.ocs.follow import Follower
from hpcbus.producers.ocs.pipeline import Pipeline
from hpcbus.producers.slurm.producer import Outgoing, SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas.ccbackend import StartJob
from hpcbus.schemas.hostnames import host_list, host_name, host_names, rename_hosts, rename_job
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.noderange import expand
from hpcbus.schemas.slurm.values import split_nodelist
from hpcbus.schemas.sonar import decode_envelope, iter_envelopes
from hpcbus.schemas.sonar.types import (
    ClusterAttributes,
    ClusterNodes,
    ClusterPartition,
    JobsEnvelope,
    SlurmJob,
)
from hpcbus.settings import CcBackendSettings, HostnameSettings
from tests.consumer_helpers import Process, bus_messages, js_publish, sonar_worker, wait_for
from tests.corpus import CORPUS
from tests.node_fixtures import tree
from tests.services import NatsServer
from tests.test_node_producer import CLUSTER
from tests.test_ocs_producer import by_subject as ocs_by_subject
from tests.test_ocs_producer import record as ocs_record
from tests.test_slurm_producer_state import RUNNING_PENDING, corpus_poll, decode


@pytest.mark.parametrize(
    ("name", "form", "want"),
    [
        ("c1-10.fox.example.org", "as-is", "c1-10.fox.example.org"),
        ("c1-10.fox.example.org", "short", "c1-10"),
        ("c1-10", "short", "c1-10"),
        ("c1-10", "domain", "c1-10.fox.example.org"),
        ("c1-10.other.org", "domain", "c1-10.fox.example.org"),
        ("10.1.2.3", "short", "10.1.2.3"),
        ("", "domain", ""),
    ],
)
def test_host_name(name: str, form: str, want: str) -> None:
    assert host_name(name, form, "fox.example.org") == want  # type: ignore[arg-type]


def test_host_lists_keep_their_ranges() -> None:
    assert host_list("c1-[5-6,8-9].fox,gpu-[10-12]", "short") == "c1-[5-6,8-9],gpu-[10-12]"
    assert host_list("c[1-3,5]-[2-4].fox,b1", "domain", "x.org") == "c[1-3,5]-[2-4].x.org,b1.x.org"
    assert host_list("None assigned", "domain", "x.org") == "None assigned"
    assert host_list("c1.fox", "as-is") == "c1.fox"


def test_host_names_and_job_records() -> None:
    hosts = ("c1.fox", "c1.other", "c2", "10.1.2.3")
    assert host_names(hosts, "as-is") is hosts
    assert host_names(hosts, "short") == ("c1", "c2", "10.1.2.3")  # one node, one name: once
    assert host_names(hosts, "domain", "x.org") == ("c1.x.org", "c2.x.org", "10.1.2.3")
    job = SlurmJob(job_id=1, job_state="RUNNING", nodes=["c1-[1-2].fox", "gpu-3"])
    assert rename_job(job, "domain", "x.org").nodes == ["c1-[1-2].x.org", "gpu-3.x.org"]
    assert (
        rename_job(job, "as-is") is job
        and rename_job(SlurmJob(job_id=2, job_state="PENDING"), "short").nodes == []
    )


def test_the_domain_form_needs_a_domain() -> None:
    with pytest.raises(msgspec.ValidationError, match="needs hostname_domain"):
        msgspec.convert({"hostname_form": "domain"}, AgentConfig)
    with pytest.raises(msgspec.ValidationError, match="hostname_form"):
        msgspec.convert({"hostname_form": "fqdn"}, HostnameSettings)
    assert AgentConfig(hostname_form="short").node_name("c1-10.fox") == "c1-10"
    assert AgentConfig(hostname_form="short", hostname="n.x").node_name("c1-10.fox") == "n.x"  # explicit


def test_every_envelope_kind_is_renamed() -> None:
    [(_, sample)] = list(
        iter_envelopes((CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_text())
    )
    assert sample.data.attributes.node == "c1-10.fox"
    assert rename_hosts(sample, "short").data.attributes.node == "c1-10"
    assert rename_hosts(sample, "as-is") is sample
    jobs = [
        env
        for path in sorted((CORPUS / "sonar").glob("*job*"))
        for _, env in iter_envelopes(path.read_text())
    ]
    jobs = [env for env in jobs if isinstance(env, JobsEnvelope) and env.data is not None]
    assert jobs
    for env in jobs:
        renamed = rename_hosts(env, "domain", "x.org")
        for j in renamed.data.attributes.slurm_jobs:
            assert all(n.endswith(".x.org") or " " in n for n in j.nodes), j.nodes  # placeholders kept


def test_cluster_envelopes_are_renamed() -> None:
    [(_, env)] = list(iter_envelopes((CORPUS / "sonar" / "slurmmonitor__fox_cluster_v0.18.json").read_text()))
    renamed = rename_hosts(env, "domain", "x.org")
    a, b = env.data.attributes, renamed.data.attributes
    assert [p.nodes for p in a.partitions] != [p.nodes for p in b.partitions]
    assert all(n.endswith(".x.org") for p in b.partitions for n in p.nodes)
    assert all(n.endswith(".x.org") for group in b.nodes for n in group.names)


@pytest.fixture
def produce_node(monkeypatch: pytest.MonkeyPatch) -> None:
    if ("produce", "node") not in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, ("produce", "node"), "hpcbus.producers.node.command")


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ((), "c1-10.fox.example.org"),
        (("--hostname-form", "short"), "c1-10"),
        (("--hostname-form", "domain", "--hostname-domain", "cluster.org"), "c1-10.cluster.org"),
    ],
)
def test_node_agent_once_names_the_node_in_the_form(
    produce_node: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: tuple[str, ...], want: str
) -> None:
    root = tree(tmp_path, "hpc")
    (root / "proc" / "sys" / "kernel" / "hostname").write_text("c1-10.fox.example.org\n")
    argv = [
        "produce",
        "node",
        "--once",
        "--cluster",
        CLUSTER,
        "--root",
        str(root),
        "--settle",
        "0.05",
        *flags,
    ]
    assert cli.main([*argv, "--format", "sonar"]) == 0
    assert decode_envelope(capsys.readouterr().out, expect="sample").data.attributes.node == want
    assert cli.main([*argv, "--format", "lp"]) == 0
    lines = parse_payload(capsys.readouterr().out, now=0).lines
    assert lines and {ln.tags.get("hostname") for ln in lines} == {want}


@pytest.mark.services
def test_sonar_bridge_names_nodes_in_the_form_both_ways(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """Sonar's FQDN sample -> lines tagged with the short name; lines of an FQDN node -> a short-named
    sample envelope: one name whichever side a record came from."""
    start = functools.partial(sonar_worker, workers, tmp_path, nats_server.url, cluster)
    start("--to", "both", "--grace", "1", "--hostname-form", "short")
    raw = (CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_bytes()
    env = decode_envelope(raw, expect="sample")
    assert env.data.attributes.node == "c1-10.fox"
    js_publish(nats_server.url, [(f"{cluster}.sonar.sample", msgspec.json.encode(env))])

    def metrics() -> list[str]:
        return [
            ln.tags["hostname"]
            for m in bus_messages(nats_server.url, cluster)
            if m.subject == f"{cluster}.metrics"
            for ln in parse_payload(m.data or b"", now=0).lines
        ]

    hosts = wait_for(metrics, 20, "the translated lines on .metrics")
    assert set(hosts) == {"c1-10"}
    # the other way: those lines (short already) and an FQDN node's own lines come back as envelopes
    from hpcbus.schemas.translate import batch, envelope_to_lines, route

    other = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            env.data,
            attributes=msgspec.structs.replace(
                env.data.attributes, node="c2-3.fox", time="2026-01-28T09:23:48+01:00"
            ),
        ),
    )
    lines = envelope_to_lines(other)
    for ln in lines:
        ln.tags["cluster"] = cluster
    js_publish(
        nats_server.url,
        [
            (s.replace("fox.educloud.no", cluster), p)
            for s, g in route(lines, cluster).items()
            for p in batch(g)
        ],
    )

    def samples() -> list[str]:
        return [
            decode_envelope(m.data or b"", expect="sample").data.attributes.node
            for m in bus_messages(nats_server.url, cluster)
            if m.subject == f"{cluster}.sonar.sample" and m.headers and m.headers.get("Hpcbus-Origin")
        ]

    assert "c2-3" in wait_for(lambda: "c2-3" in samples() and samples(), 30, "the assembled c2-3 sample")
    assert "c2-3.fox" not in samples()


# --- the batch-system producers: every node name they publish, in the form ----------------------------------


def _slurm_fqdn(text: str) -> str:
    """The corpus sacct text with every NodeList (`gpu-2`, `c1-[5-6]`, ...) written with a domain."""
    rows = []
    for row in text.splitlines():
        cols = row.split("|")
        if len(cols) > 27 and cols[27] and " " not in cols[27]:  # not `None assigned`
            cols[27] = ",".join(f"{part}.fox.example.org" for part in split_nodelist(cols[27]))
        rows.append("|".join(cols))
    return "\n".join(rows) + "\n"


def _slurm_cluster(names: str) -> ClusterAttributes:
    return ClusterAttributes(
        time="2025-09-12T15:00:00+02:00",
        cluster="fox",
        slurm=True,
        partitions=[ClusterPartition(name="normal", nodes=[names])],
        nodes=[ClusterNodes(names=[names], states=["IDLE"])],
    )


def _slurm_out(text: str, names: str, **settings: Any) -> Outgoing:
    squeue = msgspec.json.encode(
        {"jobs": [{"job_id": 42, "job_state": "RUNNING", "submit_time": 1757700000, "nodes": names}]}
    )
    producer = SlurmProducer(
        SlurmSettings(**settings),
        "fox",
        SlurmState("fox"),
        relay=CcBackendRelay(CcBackendSettings(cc_job_subject="cc.job", cc_node_state_subject="cc.node")),
    )
    return producer.build(corpus_poll(text, cluster=_slurm_cluster(names), squeue=squeue))


def _decoded(out: Outgoing) -> dict[str, list[Any]]:
    """What the hpcbus subjects carry (cc-backend's own subjects are `out.cc`)."""
    return decode(msgspec.structs.replace(out, cc=[]), "fox")


def _slurm_hosts(out: Outgoing) -> set[str]:
    """Every node name in what a poll publishes (hpcbus subjects and cc-backend's), host lists expanded."""
    seen = _decoded(out)
    hosts = {h for r in seen["records"] for n in r.nodes for h in expand(n)}
    hosts |= {r["hostname"] for e in seen["start_job"] for r in e["resources"]}
    for env in seen["cluster"]:
        a = env["data"]["attributes"]
        hosts |= {h for p in a["partitions"] for n in p["nodes"] for h in expand(n)}
        hosts |= {h for g in a["nodes"] for n in g["names"] for h in expand(n)}
    hosts |= {n["hostname"] for e in seen["nodestate"] for n in e["nodes"]}
    for _, line in out.cc:
        event = json.loads(str(line.payload))
        hosts |= {r["hostname"] for r in event.get("resources", ())}
        hosts |= {n["hostname"] for n in event.get("nodes", ())}
    return hosts


def test_slurm_producer_names_every_node_in_the_form() -> None:
    """Records (sacct and squeue), start_job resources, the cluster envelope and node states, on the hpcbus
    subjects and cc-backend's: short names become FQDNs with `domain`, FQDNs short names with `short`."""
    text = RUNNING_PENDING.read_text()
    as_is = _slurm_out(text, "c5-[1-2]")
    plain = _slurm_hosts(as_is)
    assert "c5-1" in plain and "gpu-2" in plain and all("." not in h for h in plain)
    domain = _slurm_out(text, "c5-[1-2]", hostname_form="domain", hostname_domain="x.org")
    assert _slurm_hosts(domain) == {f"{h}.x.org" for h in plain}
    assert len(_decoded(domain)["start_job"]) == len(_decoded(as_is)["start_job"]) > 0
    assert {s for s, _ in domain.cc} == {"cc.job", "cc.node"}
    # FQDNs from Slurm, short on the bus: exactly what the short-named cluster publishes
    short = _slurm_out(_slurm_fqdn(text), "c5-[1-2].fox.example.org", hostname_form="short")
    assert _decoded(short) == _decoded(as_is) and short.cc == as_is.cc
    assert (
        _slurm_hosts(_slurm_out(_slurm_fqdn(text), "c5-[1-2].fox.example.org")) != plain
    )  # the input differs


def test_ocs_pipeline_names_every_node_in_the_form(tmp_path: Path) -> None:
    """Job records' `nodes`, start_job `resources` and the log lines' `hostname`, with `domain` and `short`."""
    acct = tmp_path / "accounting.jsonl"
    acct.write_text(
        "\n".join(
            [
                ocs_record(5, host="c1.fox", pe_taskid="1.c1", granted_pe="mpi"),
                ocs_record(5, host="c2", granted_pe="mpi", slots=8),
                "{oops",
                "",
            ]
        )
    )

    def run(form: str, domain: str = "") -> tuple[list[str], list[str], set[str]]:
        follower = Follower(str(acct))
        (chunk,) = follower.read()
        follower.close()
        pipeline = Pipeline("fox", hostname="m.site.org", hostname_form=form, hostname_domain=domain)  # type: ignore[arg-type]
        by = ocs_by_subject(pipeline.process(chunk, now=1_700_010_000))
        (env_line,) = by["fox.events.slurm"]
        env = decode_envelope(str(env_line.payload))
        assert isinstance(env, JobsEnvelope) and env.data is not None
        (job,) = env.data.attributes.slurm_jobs
        start = msgspec.json.decode(str(by["fox.events.job"][0].payload), type=StartJob)
        return (
            job.nodes,
            [r.hostname for r in start.resources],
            {ln.tags["hostname"] for ln in by["fox.log.hpcbus"]},
        )

    assert run("as-is") == (["c1.fox", "c2"], ["c1.fox", "c2"], {"m.site.org"})
    assert run("short") == (["c[1-2]"], ["c1", "c2"], {"m"})
    assert run("domain", "x.org") == (["c[1-2].x.org"], ["c1.x.org", "c2.x.org"], {"m.x.org"})
