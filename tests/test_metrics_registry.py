"""The one metric registry (`hpcbus.schemas.metrics`): every name declared once, everything the node agent
writes declared (name, level, type), its readers reading it, and docs/mapping.md's tables generated from it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbus.commands.deploy.dashboards.boards import measurements
from hpcbus.commands.deploy.dashboards.units import unit_of
from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.schemas.influxdb import FieldTypes, stable_types
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.metrics import (
    AGGREGATIONS,
    BY_NAME,
    LEVELS,
    NODE,
    REGISTRY,
    SONAR,
    ZERO_OMITTED,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
)
from hpcbus.schemas.metrics.node import CPU_FIELDS
from hpcbus.schemas.translate import REGISTRY as TRANSLATED
from tests.test_node_gpu_nvml import Card, FakeNvml

FIX = Path(__file__).parent / "fixtures" / "node"
DOC = Path(__file__).resolve().parents[1] / "docs" / "mapping.md"


def level_of(tags: dict[str, str]) -> str:
    """The registry level a line's tags say (docs/mapping.md section 3, `LEVELS`)."""
    kind, stype = tags["type"], tags.get("stype", "")
    if kind == "node":
        return stype or "node"
    if kind == "socket":
        return "socket_rapl" if stype == "rapl" else "socket"
    if kind == "accelerator":
        return "process_gpu" if stype == "process" else "accelerator"
    return kind


@pytest.fixture(scope="module")
def agent_lines(tmp_path_factory: pytest.TempPathFactory) -> list[Line]:
    """Every metric line the node agent writes for the `hpc` fixture node (second reading: rates too), with
    a GPU, every `cpu_*` field and its backlog lines."""
    root = tmp_path_factory.mktemp("registry") / "hpc"
    shutil.copytree(FIX / "hpc", root)
    c = NodeCollector(NodeCollectorConfig(root=str(root)), nvml=FakeNvml([Card(0)]))
    c.collect(now=1768400000.0)
    shutil.copytree(FIX / "hpc-later", root, dirs_exist_ok=True)
    s = c.collect(now=1768400010.0)
    c.close()
    config = AgentConfig(cpu_fields=list(CPU_FIELDS))
    lines, _ = Pipeline("fox.educloud.no", "c1-10", config).sample_lines(s, queued=2, dropped=0)
    return [ln for ln in lines if "value" in ln.fields]


def test_every_name_is_declared_once_with_known_words() -> None:
    names = [m.name for m in REGISTRY]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert not {m.name for m in SONAR} & {m.name for m in NODE}
    for m in REGISTRY:
        assert m.levels and set(m.levels) <= LEVELS.keys(), m.name
        assert m.kind in (int, float) and m.unit and m.source, m.name
        assert m.agg in AGGREGATIONS, m.name
        assert m.zero in (ZERO_WRITTEN, ZERO_WITH_BOOT, ZERO_OMITTED), m.name
    assert TRANSLATED == SONAR  # the translator's table is the registry's Sonar part


def test_everything_the_node_agent_writes_is_declared_at_its_level_with_its_type(
    agent_lines: list[Line],
) -> None:
    for line in agent_lines:
        m = BY_NAME.get(line.measurement)
        assert m is not None, f"{line.measurement} is not in the registry"
        assert level_of(line.tags) in m.levels, (line.measurement, line.tags)
        assert type(line.fields["value"]) is m.kind, line.measurement
    written = {ln.measurement for ln in agent_lines}
    assert {m.name for m in NODE} <= written  # the fixture node exercises every declared node-agent line


def test_the_node_agent_refuses_to_start_when_a_reading_and_the_registry_disagree_on_a_type() -> None:
    """Counters are written as the reading holds them (no per-line conversion), so their type is checked
    against the registry once, at import."""
    from hpcbus.producers.node.cc_lines import _as_read
    from hpcbus.producers.node.net import NetDevice

    assert _as_read(NetDevice, [("net_bytes_in", "rx_bytes")]) == (("net_bytes_in", "rx_bytes"),)
    with pytest.raises(
        TypeError, match=r"net_bytes_in_bw: the registry says float, NetDevice\.rx_bytes holds"
    ):
        _as_read(NetDevice, [("net_bytes_in_bw", "rx_bytes")])


def test_the_influxdb_writer_types_are_the_registrys() -> None:
    types = FieldTypes()  # what a new InfluxDB sink writes with

    def value_type(name: str) -> type:
        return type(stable_types(Line(name, {}, {"value": 1}, 1), types).fields["value"])

    assert value_type("net_bytes_in") is int and value_type("nv_energy_abs") is int  # node agent part
    assert value_type("process_rss") is int and value_type("mem_used") is float  # Sonar part
    assert value_type("net_bytes_in_bw") is float and value_type("not_declared") is float
    assert all(value_type(m.name) is m.kind for m in REGISTRY)
    counters = sorted(m.name for m in NODE if m.kind is int)
    assert len(counters) == 24 and "net_bytes_in" in counters


def test_dashboards_read_declared_measurements() -> None:
    """Every measurement a dashboard queries is declared, but for what is not a node metric: `job_summary`
    (`consume jobs`) and the workers' own `hpcbus_*` counters."""
    undeclared = {
        n for n in measurements() if n not in BY_NAME and n != "job_summary" and not n.startswith("hpcbus_")
    }
    assert undeclared == set()


def test_dashboard_units_are_the_registrys() -> None:
    """The node dashboard's panels take their unit from the registry; one axis never mixes two units."""
    assert unit_of(["net_bytes_in_bw", "ib_recv_bw", "lustre_read_bw"]) == "Bps"
    assert unit_of(["mem_total", "mem_used"]) == "kbytes"  # the node agent's and the Sonar part
    assert unit_of(["acc_temp"]) == "celsius" and unit_of(["proc_run", "cpu_load"]) == "none"
    with pytest.raises(ValueError, match="more than one unit"):
        unit_of(["mem_hugepages_total", "mem_hugepages_size"])
    with pytest.raises(ValueError, match="not in the metric registry: job_summary"):
        unit_of(["job_summary"])


def test_the_doc_tables_come_from_the_registry() -> None:
    """`python -m hpcbus.schemas.metrics < docs/mapping.md` changes nothing: both tables are current."""
    doc = DOC.read_text()
    out = subprocess.run(
        [sys.executable, "-m", "hpcbus.schemas.metrics"],
        input=doc,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == doc, (
        "run: python -m hpcbus.schemas.metrics < docs/mapping.md > new && mv new docs/mapping.md"
    )
    for m in REGISTRY:
        assert f"| `{m.name}` |" in doc
