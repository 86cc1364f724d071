"""Grafana provisioning files: the InfluxDB 1.x data source and the dashboard provider, plus the dashboards.

Grafana reads YAML; the few values here are written as JSON strings, which YAML reads as the same strings,
so no YAML library is needed and nothing can be mis-quoted. A password is never written: with a user set,
the file names `$INFLUX_PASSWORD`, which Grafana expands from its environment when it loads the file.
"""

from __future__ import annotations

import json
from typing import Any

from hpcbus.commands.deploy.dashboards.boards import dashboards
from hpcbus.commands.deploy.dashboards.influxql import DATASOURCE_UID
from hpcbus.commands.deploy.dashboards.settings import GrafanaSettings
from hpcbus.influx.settings import InfluxSettings

FOLDER = "hpcbus"


def _q(value: object) -> str:
    return json.dumps(value)


def datasource_yaml(influx: InfluxSettings, grafana: GrafanaSettings) -> str:
    lines = [
        "# Written by `hpcbus deploy grafana`: the InfluxDB 1.x data source the hpcbus dashboards use.",
        "apiVersion: 1",
        "datasources:",
        f"  - name: {_q('hpcbus InfluxDB')}",
        f"    uid: {_q(DATASOURCE_UID)}",
        "    type: influxdb",
        "    access: proxy",
        f"    url: {_q(influx.url)}",
        "    jsonData:",
        f"      dbName: {_q(influx.db)}",
        "      httpMode: POST",
        f"      timeInterval: {_q(grafana.min_interval)}",
    ]
    if influx.username:
        lines += [
            f"    user: {_q(influx.username)}",
            "    secureJsonData:",
            '      password: "$INFLUX_PASSWORD"',
        ]
    return "\n".join(lines) + "\n"


def provider_yaml(grafana: GrafanaSettings) -> str:
    return "\n".join(
        [
            "# Written by `hpcbus deploy grafana`: load the hpcbus dashboards from `path` into the folder hpcbus.",
            "apiVersion: 1",
            "providers:",
            f"  - name: {_q('hpcbus')}",
            f"    folder: {_q(FOLDER)}",
            "    type: file",
            "    disableDeletion: false",
            "    allowUiUpdates: false",
            "    options:",
            f"      path: {_q(grafana.dashboards_path)}",
            "",
        ]
    )


def files(influx: InfluxSettings, grafana: GrafanaSettings) -> dict[str, str]:
    """Relative path -> content of every file `deploy grafana` writes."""
    raw_rp = influx.rp or "autogen"
    boards, _ = dashboards(raw_rp)
    out = {
        "provisioning/datasources/hpcbus.yaml": datasource_yaml(influx, grafana),
        "provisioning/dashboards/hpcbus.yaml": provider_yaml(grafana),
    }
    for name, board in boards.items():
        out[f"dashboards/{name}"] = dump(board)
    return out


def dump(board: dict[str, Any]) -> str:
    """A dashboard's JSON as committed: indented, keys in the SDK's order, one trailing newline."""
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"
