"""`hpcbus deploy grafana`: write the Grafana provisioning files and the hpcbus dashboards.

The data source takes InfluxDB's address, database and user from `[influx]` (the settings `consume influx`
writes with), the dashboards the raw retention policy from there too. Output (default `deploy/grafana/`):

    provisioning/datasources/hpcbus.yaml   -> Grafana's provisioning/datasources/
    provisioning/dashboards/hpcbus.yaml    -> Grafana's provisioning/dashboards/ (loads `dashboards_path`)
    dashboards/*.json                      -> `dashboards_path`

The committed copy under deploy/grafana/ is what this command writes with the defaults (a test checks it).
See docs/dashboards.md.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from hpcbus.commands.deploy.dashboards.settings import GRAFANA
from hpcbus.influx.settings import INFLUX
from hpcbus.options import add_section_arguments, read_section

HELP = "write the Grafana dashboards and data source provisioning files"
SECTIONS = (INFLUX, GRAFANA)

log = logging.getLogger("hpcbus.grafana")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, INFLUX)
    add_section_arguments(p, GRAFANA)


def run(args: argparse.Namespace) -> int:
    from hpcbus.commands.deploy.dashboards.provisioning import files

    influx = read_section(args, INFLUX)
    grafana = read_section(args, GRAFANA)
    out = Path(grafana.output)
    try:
        for name, text in files(influx, grafana).items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path)
    except OSError as exc:
        log.error("cannot write %s: %s", exc.filename or out, exc.strerror or exc)
        return 1
    return 0
