"""The shipped sample config loads as the settings structs (the units: tests/test_units.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec

from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.delivery import RunnerSettings
from hpcbus.influx.settings import InfluxSettings
from hpcbus.producers.node.pipeline import AgentConfig
from hpcbus.producers.ocs.settings import OcsSettings
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.settings import BusSettings
from hpcbus.streams import hour_bytes

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_sample_config_tables_are_valid_settings() -> None:
    data = tomllib.loads((DEPLOY / "hpcbus.toml").read_text())
    assert msgspec.convert(data["bus"], BusSettings).cluster == "fox.educloud.no"
    assert msgspec.convert(data["influx"], InfluxSettings).processes == "aggregate"
    assert msgspec.convert(data["delivery"], RunnerSettings).mode == "jetstream"
    assert msgspec.convert(data["sonar"], SonarSettings) == SonarSettings()
    # the state in StateDirectory=, the stream sized for an hour of 500 nodes (docs/scaling.md)
    slurm = SlurmSettings(state_file="/var/lib/hpcbus/slurm.state", stream_max_bytes=hour_bytes(500))
    assert msgspec.convert(data["slurm"], SlurmSettings) == slurm
    ocs = msgspec.convert(data["ocs"], OcsSettings)
    assert (ocs.state_file, ocs.stream_max_bytes) == ("/var/lib/hpcbus/ocs.state", hour_bytes(500))
    assert msgspec.convert(data["node_agent"], AgentConfig).stream_max_bytes == hour_bytes(500)
    assert msgspec.convert(data["bus"], BusSettings).expected_nodes == 500
    # one file for every command of a host: the node agent's tables too, the same as deploy/node.toml's
    node = tomllib.loads((DEPLOY / "node.toml").read_text())
    assert {"node", "node_agent", "outbox"} <= set(data)
    assert data["node_agent"] == {"stream_max_bytes": node["node_agent"]["stream_max_bytes"]}
    uncommented = re.sub(r"(?m)^# (\w+ = )", r"\1", (DEPLOY / "hpcbus.toml").read_text())
    commented = tomllib.loads(uncommented)
    assert msgspec.convert(commented["influx"], InfluxSettings).url == "http://influx.example.org:8086"
    assert commented["node"] == node["node"] and commented["outbox"] == node["outbox"]
    for table, struct in (("delivery", RunnerSettings), ("sonar", SonarSettings)):
        assert msgspec.convert(commented[table], struct) == struct()  # the commented keys are the defaults
