"""The shipped deploy files stay in step with the code: the sample config loads, the units call real commands."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import msgspec
import pytest

from consumers.influx.settings import InfluxSettings
from consumers.runner import RunnerSettings
from consumers.sonar.settings import SonarSettings
from hpcbus import cli
from hpcbus.settings import BusSettings
from producers.ocs.settings import OcsSettings
from producers.slurm.settings import SlurmSettings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_sample_config_tables_are_valid_settings() -> None:
    data = tomllib.loads((DEPLOY / "hpcbus.toml").read_text())
    assert msgspec.convert(data["bus"], BusSettings).cluster == "fox.educloud.no"
    assert msgspec.convert(data["influx"], InfluxSettings).processes == "aggregate"
    assert msgspec.convert(data["delivery"], RunnerSettings).mode == "jetstream"
    assert msgspec.convert(data["sonar"], SonarSettings) == SonarSettings()
    assert msgspec.convert(data["slurm"], SlurmSettings) == SlurmSettings()
    assert msgspec.convert(data["ocs"], OcsSettings) == OcsSettings()
    uncommented = re.sub(r"(?m)^# (\w+ = )", r"\1", (DEPLOY / "hpcbus.toml").read_text())
    commented = tomllib.loads(uncommented)
    assert msgspec.convert(commented["influx"], InfluxSettings).url == "http://influx.example.org:8086"
    for table, struct in (("delivery", RunnerSettings), ("sonar", SonarSettings), ("slurm", SlurmSettings)):
        assert msgspec.convert(commented[table], struct) == struct()  # the commented keys are the defaults


@pytest.mark.parametrize("unit", sorted((DEPLOY / "systemd").glob("*.service")), ids=lambda p: p.name)
def test_systemd_units_run_existing_commands(unit: Path) -> None:
    (line,) = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0].endswith("/hpcbus")
    parser = cli.build_parser()
    args = parser.parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag
    assert args.config == "/etc/hpcbus/hpcbus.toml"
    args.config = str(DEPLOY / "hpcbus.toml")  # the shared sample: every unit's command accepts it
    cli.check_settings(args)
