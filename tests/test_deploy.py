"""The shipped deploy files stay in step with the code: the sample config loads, the units call real commands."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import msgspec
import pytest

from consumers.influx.settings import InfluxSettings
from consumers.runner import RunnerSettings
from hpcbus import cli
from hpcbus.settings import BusSettings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_sample_config_tables_are_valid_settings() -> None:
    data = tomllib.loads((DEPLOY / "hpcbus.toml").read_text())
    assert msgspec.convert(data["bus"], BusSettings).cluster == "fox.educloud.no"
    assert msgspec.convert(data["influx"], InfluxSettings).processes == "aggregate"
    assert msgspec.convert(data["delivery"], RunnerSettings).mode == "jetstream"


@pytest.mark.parametrize("unit", sorted((DEPLOY / "systemd").glob("*.service")), ids=lambda p: p.name)
def test_systemd_units_run_existing_commands(unit: Path) -> None:
    (line,) = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0].endswith("/hpcbus")
    parser = cli.build_parser()
    args = parser.parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag
    assert args.config == "/etc/hpcbus/hpcbus.toml"
