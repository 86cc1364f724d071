"""Zeros of plotted series are written (an idle node is 0, not a gap); zeros that mean "not reported" and
per-process zeros are not; either way Sonar -> LP -> Sonar gives the envelope back byte for byte.

docs/mapping.md principle 7; the `zero` column of the registry.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.cc_lines import cc_lines
from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.jobs import JobOptions
from hpcbus.producers.node.lustre import parse_llite_stats
from hpcbus.producers.node.memory import MemInfo
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.node.to_sonar import sample_envelope
from hpcbus.schemas.lineprotocol import Line, format_lines, parse_payload
from hpcbus.schemas.sonar.validate import decode_envelope, encode_envelope
from hpcbus.schemas.translate import REGISTRY, Assembler, envelope_to_lines
from hpcbus.schemas.translate.registry import ZERO_OMITTED, ZERO_WITH_BOOT, ZERO_WRITTEN
from tests.node_fixtures import FIX

BTIME = 1795305053


def _envelope(boot: bool) -> bytes:
    system = (
        '"cpus":[0,5],"gpus":[{"uuid":"GPU-1","performance_state":1},{"index":1,"uuid":"GPU-2","ce_util":3}],'
        '"disks":[{"name":"sda","major":8,"stats":[0,0,3]}],"used_memory":100'
    )
    if boot:
        system = '"boot":"2025-11-01T00:00:00+00:00",' + system
    return (
        '{"meta":{"producer":"sonar","version":"0.18.0"},"data":{"type":"sample","attributes":{'
        '"time":"2025-11-23T10:00:00+01:00","cluster":"c","node":"n1","system":{' + system + "},"
        '"jobs":[{"job":7,"user":"u","processes":[{"pid":10,"cmd":"sleep","resident_memory":5}]}]}}}'
    ).encode()


def _values(lines: list[Line]) -> dict[tuple[str, str, str], object]:
    return {
        (ln.measurement, ln.tags.get("type-id", ""), ln.tags.get("stype-id", "")): ln.fields["value"]
        for ln in lines
        if "value" in ln.fields
    }


def test_idle_zeros_of_node_hwthread_gpu_and_disk_are_lines() -> None:
    env = decode_envelope(_envelope(boot=True))
    v = _values(envelope_to_lines(env))
    for name in ("cpu_load", "load_five", "load_fifteen", "proc_run", "proc_total"):
        assert v[(name, "", "")] == 0.0  # Sonar omitted them: /proc/loadavg read 0.00
    assert v[("mem_used", "", "")] == 100.0
    assert v[("cpu_time", "0", "")] == 0 and v[("cpu_time", "1", "")] == 5
    assert [v[(f"diskstat_{n}", "disk", "sda")] for n in ("reads", "reads_merged", "read_sectors")] == [
        0,
        0,
        3,
    ]
    for gpu in ("GPU-1", "GPU-2"):
        for name in ("acc_utilization", "acc_mem_used", "acc_mem_util", "acc_power", "acc_failing"):
            assert (name, gpu, "") in v
        for name in ("acc_temp", "acc_fan", "acc_clock", "acc_mem_clock", "acc_power_limit"):
            assert (name, gpu, "") not in v  # 0 = the card does not report it
    assert v[("acc_utilization", "GPU-1", "")] == 0.0 and v[("acc_utilization", "GPU-2", "")] == 3.0
    assert v[("acc_pstate", "GPU-1", "")] == 0.0  # performance_state 1 = P0
    assert ("acc_pstate", "GPU-2", "") not in v  # performance_state 0 = unknown
    # per-process zeros stay absent (absent = zero, as in Sonar); job_processes is always there
    assert v[("process_rss", "process", "7/10")] == 5
    assert not any(k[0].startswith("process_") and k[0] != "process_rss" for k in v)
    assert v[("job_processes", "job", "7")] == 1


def test_old_sonar_without_boot_gets_no_load_lines() -> None:
    """Sonar < 0.15 has no load1/5/15 nor *_entities (and no boot): a 0 line would claim an idle node."""
    v = _values(envelope_to_lines(decode_envelope(_envelope(boot=False))))
    assert not {"cpu_load", "load_five", "load_fifteen", "proc_run", "proc_total"} & {k[0] for k in v}
    assert v[("mem_used", "", "")] == 100.0


@pytest.mark.parametrize("boot", [True, False])
def test_zero_lines_come_back_as_omitted_fields(boot: bool) -> None:
    raw = _envelope(boot)
    env = decode_envelope(raw)
    lines = parse_payload(format_lines(envelope_to_lines(env)), now=0).lines
    (done,) = Assembler().add_lines(lines, now=0.0)
    assert done.complete and done.envelope == env
    again = encode_envelope(done.envelope)
    assert decode_envelope(again) == env
    assert again == encode_envelope(env)  # byte for byte: a 0 line leaves Sonar's field absent


def test_registry_declares_a_zero_rule_for_every_measurement() -> None:
    rules = {m.name: m.zero for m in REGISTRY}
    assert set(rules.values()) <= {ZERO_WRITTEN, ZERO_WITH_BOOT, ZERO_OMITTED}
    assert rules["cpu_load"] == ZERO_WITH_BOOT and rules["acc_utilization"] == ZERO_WRITTEN
    assert rules["acc_pstate"] == ZERO_OMITTED
    assert all(rules[m.name] == ZERO_OMITTED for m in REGISTRY if m.level in ("process", "process_gpu"))
    assert all(rules[m.name] == ZERO_WRITTEN for m in REGISTRY if m.level in ("hwthread", "disk", "job"))


def test_idle_node_producer_writes_load_zero(tmp_path: Path) -> None:
    """The reported gap: `/proc/loadavg` reads 0.00 and the node producer wrote no cpu_load line."""
    root = tmp_path / "node"
    shutil.copytree(FIX / "slurm-cgroup-v2", root)
    (root / "proc" / "loadavg").write_text("0.00 0.00 0.00 0/312 4242\n")
    c = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    s = c.collect(now=BTIME + 800.0)
    lines, _ = Pipeline("fox", "c1-10", AgentConfig(cc_lines=False)).sample_lines(s)
    v = _values(lines)
    assert [v[(n, "", "")] for n in ("cpu_load", "load_five", "load_fifteen", "proc_run")] == [0.0] * 4
    (done,) = Assembler().add_lines(lines, now=0.0)
    assert done.complete and done.envelope == sample_envelope(s, "fox", node="c1-10")


def test_cc_lines_write_lustre_counters_not_yet_listed_and_zero_hugepages() -> None:
    stats = parse_llite_stats(
        "scratch-ffff8800", b"snapshot_time 1.0 secs.usecs\nread_bytes 2 samples [bytes] 1 4 8\n"
    )
    mem = MemInfo(
        total=1000, free=500, available=600, hugepages_total=0, hugepages_free=0, hugepage_size=2048
    )
    s = NodeSample(hostname="n1", time=1_763_900_000.0, lustre=[stats], memory=mem)
    v = _values(cc_lines(s, "fox"))
    assert (
        v[("lustre_open", "filesystem", "scratch")] == 0
        and v[("lustre_statfs", "filesystem", "scratch")] == 0
    )
    assert v[("lustre_read_requests", "filesystem", "scratch")] == 2
    assert [v[(n, "", "")] for n in ("mem_hugepages_total", "mem_hugepages_free")] == [0.0, 0.0]
    # a kernel without huge pages (no Hugepagesize) gets no huge-page lines
    s.memory = MemInfo(total=1000, free=500, available=600)
    assert not any(k[0].startswith("mem_hugepages") for k in _values(cc_lines(s, "fox")))
