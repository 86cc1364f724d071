"""`hpcbus deploy influxdb`: the `[data]` settings of influxdb.conf that hpcbus' schema needs, with why.

hpcbus keeps the job id a tag of the per-job measurements (`process_*`, `job_processes`: `job`, `epoch`,
`stype-id`) and of `job_summary`, so the job dashboards and `hpcbus report` select one job through the index
(docs/scaling.md, "Cardinality"). A busy site writes more than 100,000 distinct jobs inside the raw
retention window, and InfluxDB 1.x's defaults were made for few series that live for ever: the in-memory
index holds every series of every shard in RAM, and `max-values-per-tag` (100,000) refuses every new job's
points once a measurement held that many (`partial write: max-values-per-tag limit exceeded`). The output is
plain TOML lines of influxdb.conf's `[data]` table (`tomllib` reads it; `data_settings()` gives the same as
a dict for programs such as the soak harness): copy the keys into the `[data]` table of
/etc/influxdb/influxdb.conf and restart influxd (a changed index applies to new shards; older ones keep theirs until they
expire, docs/scaling.md).
"""

from __future__ import annotations

import argparse

HELP = "print the influxdb.conf [data] settings hpcbus' schema needs (index, limits), with why"
SECTIONS = ()

SETTINGS: tuple[tuple[str, str | int, str], ...] = (
    (
        "index-version",
        "tsi1",
        "the series index on disk, the series in use cached in memory: every job adds series that live\n"
        "until their shard expires; the default in-memory index (inmem) holds all of them in RAM\n"
        "(docs/scaling.md, Cardinality: memory per million series)",
    ),
    (
        "max-values-per-tag",
        0,
        "no limit: Debian's default 100000 refuses every new job's points once a measurement held 100,000\n"
        "job ids (a busy site passes that inside the raw retention window)",
    ),
    (
        "max-series-per-database",
        0,
        "no limit: the default 1000000 is less than 30 days of a 500-node site's per-job series\n"
        "(docs/scaling.md, Cardinality); size memory and disk by that table instead",
    ),
)
"""(key, value, why) of each `[data]` setting, in the order printed."""


def data_settings() -> dict[str, str | int]:
    """The `[data]` keys and values hpcbus needs (what `conf_text` prints)."""
    return {key: value for key, value, _ in SETTINGS}


def toml_value(value: str | int) -> str:
    """A TOML literal of a setting's value (the values are plain: no escapes needed)."""
    return f'"{value}"' if isinstance(value, str) else str(value)


def conf_text() -> str:
    """The command's output: a `[data]` table with one commented key per setting."""
    out = [
        "# hpcbus deploy influxdb: the [data] settings hpcbus' schema needs (docs/scaling.md, Cardinality).",
        "# Put these keys into the [data] table of /etc/influxdb/influxdb.conf and restart influxd.",
        "[data]",
    ]
    for key, value, why in SETTINGS:
        out += [f"  # {line}" for line in why.splitlines()]
        out.append(f"  {key} = {toml_value(value)}")
    return "\n".join(out) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options: the settings follow from the schema, not from a site."""


def run(args: argparse.Namespace) -> int:
    print(conf_text(), end="")
    return 0
