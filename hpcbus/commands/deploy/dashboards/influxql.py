"""Raw InfluxQL targets for Grafana's Python SDK, and the query text the dashboards share.

grafana-foundation-sdk types panels, variables and dashboards, but ships no InfluxDB query type (its
generated data-source schemas stop at Prometheus, Loki, Tempo, ...). `InfluxQuery` is that missing piece: a
`Dataquery` variant serialised the way Grafana's InfluxDB data source stores a raw query (`query`,
`rawQuery: true`, `resultFormat`), so every target is InfluxQL text that a test can execute as written once
Grafana's placeholders (`$timeFilter`, `$__interval`, `$<variable>`) are substituted.

Every query names its measurement through `Measure`, which records it: the retention command downsamples
exactly the measurements the dashboards read, and a test checks that each one exists in real data.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants

from hpcbus.schemas.metrics import BY_NAME

DATASOURCE_UID = "hpcbus-influxdb"
"""The provisioned data source every panel and variable names (provisioning files and dashboards agree)."""
DATASOURCE = {"type": "influxdb", "uid": DATASOURCE_UID}

RP = "$rp"
"""The retention-policy template variable: raw data or the 5-minute means (`downsampling`)."""

PER_JOB_LEVELS = frozenset({"process", "process_gpu", "job"})
PER_JOB = frozenset(name for name, metric in BY_NAME.items() if PER_JOB_LEVELS.intersection(metric.levels))
"""The measurements whose series are per job (`process_*`, `job_processes`: tags `job`, `stype-id`): kept
raw only, never downsampled. Each job adds about 12 series (docs/scaling.md, "Cardinality"): a year of them
in the `5m` policy would be 146 million series at 2,000 nodes, 12 times what the rest of the year holds.
Queries read them from the raw policy whatever `$rp` says; a job older than the raw retention has its
`job_summary` (kept a year)."""


class InfluxQuery(cogvariants.Dataquery):
    """A raw InfluxQL target of Grafana's InfluxDB data source (InfluxQL mode)."""

    def __init__(
        self,
        query: str,
        result_format: Literal["time_series", "table"] = "time_series",
        alias: str = "",
        ref_id: str = "",
    ) -> None:
        self.query = query
        self.result_format = result_format
        self.alias = alias
        self.ref_id = ref_id

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "refId": self.ref_id,
            "datasource": dict(DATASOURCE),
            "query": self.query,
            "rawQuery": True,
            "resultFormat": self.result_format,
        }
        if self.alias:
            payload["alias"] = self.alias
        return payload


class Influx(cogbuilder.Builder[InfluxQuery]):
    """Builder of an `InfluxQuery`, in the SDK's style: `Influx(text).ref_id("A").table()`."""

    def __init__(self, query: str) -> None:
        self._internal = InfluxQuery(query)

    def build(self) -> InfluxQuery:
        return self._internal

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def table(self) -> Self:
        self._internal.result_format = "table"
        return self

    def alias(self, alias: str) -> Self:
        """Series name pattern (`$tag_hostname`, `$col`), as in Grafana's query editor."""
        self._internal.alias = alias
        return self


def ident(name: str) -> str:
    """A double-quoted InfluxQL identifier (measurement, tag, field, retention policy)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def match(tag: str, variable: str) -> str:
    """`"tag" =~ /^$variable$/`: Grafana puts one value in as is (regex-escaped) and several as `(a|b)`."""
    return f"{ident(tag)} =~ /^${variable}$/"


class Measures:
    """The measurements the dashboards query, collected while they are built."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def src(self, measurement: str, *, rp: bool = True) -> str:
        """`"$rp"."measurement"` (or the bare measurement, the raw data in the database's default policy, for
        data that is never downsampled: events, and the per-job series, `PER_JOB`)."""
        self.names.add(measurement)
        return (
            f"{ident(RP)}.{ident(measurement)}" if rp and measurement not in PER_JOB else ident(measurement)
        )

    def series(
        self,
        measurement: str,
        where: list[str],
        by: list[str],
        agg: str = 'mean("value")',
        fill: str = "none",
        *,
        name: str = "value",
    ) -> str:
        """The time-series query every graph uses: `agg` per `$__interval`, one series per `by` tag set."""
        group = ", ".join(["time($__interval)", *(ident(t) for t in by)])
        conds = " AND ".join([*where, "$timeFilter"])
        return (
            f"SELECT {agg} AS {ident(name)} FROM {self.src(measurement)} WHERE {conds} "
            f"GROUP BY {group} fill({fill})"
        )


def as_json(obj: Any) -> Any:
    """An SDK object tree as plain JSON data (dicts and lists), through each object's `to_json`."""
    if hasattr(obj, "to_json"):
        return as_json(obj.to_json())
    if isinstance(obj, dict):
        return {k: as_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [as_json(v) for v in obj]
    return obj
