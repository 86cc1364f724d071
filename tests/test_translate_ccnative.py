"""A ClusterCockpit site's own collector stream becomes valid Sonar sample envelopes.

The stream below is what cc-metric-collector sends with the corpus example configs (cpustat without
`cpu_idle`, memstat, loadavg without `proc_total`, netstat, nvidia with `use_pci_info_as_type_id`, the router
adding `cluster=testcluster`), written out for two 10 s intervals of one node.
"""

from __future__ import annotations

from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import validate_envelope
from hpcbus.schemas.translate import Assembler, LpToSonar
from tests.corpus import CORPUS

T0 = 1_700_000_000
PCI = ["00000000:49:00.0", "00000000:4F:00.0"]


def collector_payload(t: int, user: float, system: float) -> str:
    lines = []
    for cpu in range(4):
        for name, v in (("cpu_user", user), ("cpu_system", system), ("cpu_iowait", 1.0), ("cpu_used", 99.0)):
            lines.append(
                f"{name},cluster=testcluster,hostname=node01,type=hwthread,type-id={cpu},unit=Percent "
                f"value={v} {t}"
            )
    lines += [
        f"cpu_user,cluster=testcluster,hostname=node01,type=node,unit=Percent value={user} {t}",
        f"num_cpus,cluster=testcluster,hostname=node01,type=node value=4i {t}",
        f"mem_used,cluster=testcluster,hostname=node01,type=node value=12345678.0 {t}",
        f"mem_total,cluster=testcluster,hostname=node01,type=node value=263842388.0 {t}",
        f"load_one,cluster=testcluster,hostname=node01,type=node value=3.25 {t}",
        f"load_five,cluster=testcluster,hostname=node01,type=node value=2.5 {t}",
        f"load_fifteen,cluster=testcluster,hostname=node01,type=node value=1.75 {t}",
        f"proc_run,cluster=testcluster,hostname=node01,type=node value=7 {t}",
        f"net_bytes_in,cluster=testcluster,hostname=node01,type=node,device=enp5s0 value=1024.5 {t}",
    ]
    for i, pci in enumerate(PCI):
        lines += [
            f"nv_util,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value={40.4 + i} {t}",
            f"nv_mem_util,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=12 {t}",
            f"nv_fb_mem_used,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=1024.5 {t}",
            f"nv_temp,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=61 {t}",
            f"nv_fan,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=30 {t}",
            f"nv_power_usage,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=250.7 {t}",
            f"nv_power_max_limit,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=300 {t}",
            f"nv_perf_state,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=0 {t}",
            f"nv_sm_clock,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=1410 {t}",
            f"nv_mem_clock,cluster=testcluster,hostname=node01,type=accelerator,type-id={pci} value=1215 {t}",
        ]
    return "\n".join(lines) + "\n"


def test_collector_stream_gives_valid_samples() -> None:
    asm = Assembler(grace=5)
    out = []
    for k, (user, system) in enumerate([(50.0, 10.0), (25.0, 5.0)]):
        parsed = parse_payload(collector_payload(T0 + 10 * k, user, system), now=T0 + 10 * k)
        assert [p for p in parsed.problems if p.severity == "error"] == []
        out += asm.add_lines(parsed.lines, cluster="ignored-tag-wins", now=T0 + 10 * k)
    out += asm.flush(now=T0 + 100)
    assert len(out) == 2
    for result in out:
        assert validate_envelope(result.envelope) == [], result.envelope
        assert not result.complete  # no skeleton: a ClusterCockpit stream is always "partial"
    first, second = (r.envelope.data.attributes for r in out)
    assert first.cluster == "testcluster" and first.node == "node01"
    assert first.time == "2023-11-14T22:13:20+00:00"
    assert first.system.used_memory == 12345678  # mem_used: kB on both sides
    assert first.system.load1 == 3.25 and first.system.load5 == 2.5 and first.system.load15 == 1.75
    assert first.system.runnable_entities == 7
    # busy seconds per hwthread, integrated: user+system (iowait is not busy in Sonar), cpu_used ignored
    assert first.system.cpus == [0, 0, 0, 0]
    assert second.system.cpus == [3, 3, 3, 3]  # (25 + 5) % of 10 s
    gpus = second.system.gpus
    assert [g.uuid for g in gpus] == PCI and [g.index for g in gpus] == [0, 1]
    g = gpus[0]
    assert (g.ce_util, g.memory_util, g.temperature, g.fan) == (40, 12, 61, 30)
    assert g.memory == 1049088  # 1024.5 MiB in KiB
    assert g.power == 251 and g.power_limit == 300
    assert g.performance_state == 1  # P0, in Sonar's encoding
    assert (g.ce_clock, g.memory_clock) == (1410, 1215)
    assert gpus[1].ce_util == 41
    assert second.jobs == []


def test_cpu_integration_accumulates_across_samples() -> None:
    asm = Assembler(grace=0)
    cpus = []
    for k in range(4):
        t = T0 + 10 * k
        asm.add_lines(parse_payload(collector_payload(t, 50.0, 10.0), now=t).lines, now=t)
        [result] = asm.flush(now=t)
        cpus.append(result.envelope.data.attributes.system.cpus[0])
    assert cpus == [0, 6, 12, 18]  # monotonic: differences give the true busy time, as Sonar's do


def test_cc_lib_examples() -> None:
    """cc-lib's own examples: ns timestamps, no cluster tag (taken from the subject), integer values."""
    text = (CORPUS / "clustercockpit" / "lineprotocol" / "cc-lib-examples.lp").read_text()
    parsed = parse_payload(text, now=0)
    translator = LpToSonar(grace=0)
    unmade: list[Problem] = []
    out = translator.add_lines(parsed.lines, cluster="alex", now=0, problems=unmade) + translator.flush_all()
    [result] = out
    assert unmade == []
    attrs = result.envelope.data.attributes
    assert (attrs.cluster, attrs.node, attrs.system.used_memory) == ("alex", "node001", 8192)
    assert attrs.time == "2009-02-13T23:31:30+00:00"
    assert validate_envelope(result.envelope) == []


def test_unknown_metrics_are_counted_not_kept() -> None:
    asm = Assembler()
    lines = parse_payload(collector_payload(T0, 1.0, 1.0), now=T0).lines
    asm.add_lines(lines, now=0)
    ignored = {"num_cpus", "mem_total", "net_bytes_in", "cpu_iowait"}
    assert asm.ignored == sum(1 for ln in lines if ln.measurement in ignored) + 1  # + node-level cpu_user
