"""One node, one name (issue 19, section 3): the host-name form shared by `produce node` and `consume sonar`.

The rule (`schemas.hostnames`) on its own, then the node agent's `--once` output (Sonar envelope and line
protocol) and the Sonar bridge in both directions as real worker processes, all with the same setting.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import pytest

from hpcbus import cli
from hpcbus.settings import HostnameSettings
from producers.node.pipeline import AgentConfig
from schemas.hostnames import host_list, host_name, rename_hosts
from schemas.lineprotocol import parse_payload
from schemas.sonar import decode_envelope, iter_envelopes
from schemas.sonar.types import JobsEnvelope
from tests.consumer_helpers import Process, bus_messages, js_publish, sonar_worker, wait_for
from tests.corpus import CORPUS
from tests.services import NatsServer
from tests.test_node_producer import CLUSTER, tree


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
        monkeypatch.setitem(cli.COMMANDS, ("produce", "node"), "producers.node.command")


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
    from schemas.translate import batch, envelope_to_lines, route

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
