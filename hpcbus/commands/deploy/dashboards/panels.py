"""What the dashboards are made of: the template variables, the three panel kinds and the dashboard frame,
all through grafana-foundation-sdk builders, plus the filters every query shares."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import common as c
from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from hpcbus.commands.deploy.dashboards.influxql import DATASOURCE_UID, Influx, Measures, as_json, match

DOWNSAMPLED_RP = "5m"
"""The retention policy of the 5-minute means (`downsampling.py` creates it)."""

DS = dm.DataSourceRef(type_val="influxdb", uid=DATASOURCE_UID)
NODE = "\"type\" = 'node'"
HWTHREAD = "\"type\" = 'hwthread'"
GPU = "\"type\" = 'accelerator'"
IN_CLUSTER = match("cluster", "cluster")
ON_HOST = match("hostname", "host")
OF_JOB = match("stype-id", "job")

Panel = Any
"""A panel builder of the SDK (timeseries, stat, table: they share no base class)."""


# ---- variables --------------------------------------------------------------------------------------------


def rp_variable(raw_rp: str) -> d.CustomVariable:
    """Raw data (the database's writing policy) or the 5-minute means."""
    values = [raw_rp, DOWNSAMPLED_RP]
    return (
        d.CustomVariable("rp")
        .label("data")
        .values(",".join(values))
        .current(dm.VariableOption(text=raw_rp, value=raw_rp, selected=True))
        .options([dm.VariableOption(text=v, value=v, selected=v == raw_rp) for v in values])
    )


def tag_variable(
    name: str, label: str, measurement: str, key: str, where: str, m: Measures
) -> d.QueryVariable:
    """A multi-value variable listing the values of tag `key` of `measurement` (refreshed with the time
    range, so a new node or job appears without editing the dashboard)."""
    cond = f" WHERE {where}" if where else ""
    query = f'SHOW TAG VALUES FROM {m.src(measurement)} WITH KEY = "{key}"{cond}'
    return (
        d.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DS)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
    )


def cluster_variable(m: Measures) -> d.QueryVariable:
    return tag_variable("cluster", "cluster", "mem_used", "cluster", "", m)


def host_variable(m: Measures) -> d.QueryVariable:
    return tag_variable("host", "node", "mem_used", "hostname", IN_CLUSTER, m)


# ---- panels -----------------------------------------------------------------------------------------------


def graph(title: str, unit: str, *queries: str, width: int = 12, legend: str = "") -> timeseries.Panel:
    """A time-series panel with one target per query (refIds A, B, ...)."""
    p = timeseries.Panel().title(title).unit(unit).datasource(DS).height(8).span(width)
    p.fill_opacity(10).line_width(1).show_points(cm.VisibilityMode.NEVER)
    for i, q in enumerate(queries):
        target = Influx(q).ref_id(chr(ord("A") + i))
        if legend:
            target.alias(legend)
        p.with_target(target)
    return p


def single(title: str, unit: str, query: str, width: int = 6) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(DS)
        .height(4)
        .span(width)
        .reduce_options(c.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(Influx(query).ref_id("A"))
    )


def grid(title: str, query: str, width: int = 24, height: int = 8) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .datasource(DS)
        .height(height)
        .span(width)
        .with_target(Influx(query).ref_id("A").table())
    )


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[d.QueryVariable | d.CustomVariable],
    rows: list[tuple[str, list[Panel]]],
) -> dict[str, Any]:
    """A dashboard of titled rows; panels get ids in order."""
    b = (
        d.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["hpcbus"])
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
        .editable()
    )
    for v in variables:
        b.with_variable(v)
    ident = 0
    for row_title, panels in rows:
        ident += 1
        b.with_row(d.Row(row_title).id(ident))
        for p in panels:
            ident += 1
            b.with_panel(p.id(ident))
    board: dict[str, Any] = as_json(b.build())
    return board


# ---- the dashboards ----------------------------------------------------------------------------------------


def count_series(m: Measures, measurement: str, by: list[str], name: str, agg: str) -> str:
    """How many series of `measurement` (one per `by` tag set) have a point, per `$__interval`: nodes,
    cards or jobs reporting. A subquery, because InfluxQL cannot count distinct tag values."""
    group = ", ".join(["time($__interval)", *(f'"{t}"' for t in by)])
    return (
        f'SELECT count("value") AS "{name}" FROM (SELECT {agg}("value") AS "value" FROM {m.src(measurement)} '
        f"WHERE {IN_CLUSTER} AND $timeFilter GROUP BY {group}) "
        "WHERE $timeFilter GROUP BY time($__interval) fill(none)"
    )
