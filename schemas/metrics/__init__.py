"""The metric registry: every measurement hpcbus writes on the bus, declared once with its unit, type, levels
and aggregation.

Two parts, one per kind of producer: `SONAR` (every numeric field of a Sonar sample: what the translator writes
and reads back) and `NODE` (the ClusterCockpit lines the node agent adds for what Sonar has no field for). A
name is declared once, in one of them. Readers: the translator (`schemas.translate.registry`), the node agent
(`producers.node.cc_lines`), the InfluxDB writer (`schemas.influxdb.KINDS` and `FieldTypes`: the field type
it writes), the Grafana dashboards and docs/mapping.md, whose two tables are generated (`tables.py`;
`python -m hpcbus.schemas.metrics < docs/mapping.md` prints the document updated) and checked by a test.
"""

from __future__ import annotations

from hpcbus.schemas.metrics.model import (
    AGGREGATIONS,
    CONV_IDENTITY,
    CONV_KIB_TO_MIB,
    CONV_PSTATE,
    LEVELS,
    ZERO_OMITTED,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
    Metric,
)
from hpcbus.schemas.metrics.node import NODE
from hpcbus.schemas.metrics.sonar import SONAR

__all__ = [
    "AGGREGATIONS",
    "BY_NAME",
    "CONV_IDENTITY",
    "CONV_KIB_TO_MIB",
    "CONV_PSTATE",
    "LEVELS",
    "NODE",
    "REGISTRY",
    "SONAR",
    "ZERO_OMITTED",
    "ZERO_WITH_BOOT",
    "ZERO_WRITTEN",
    "Metric",
]

REGISTRY: tuple[Metric, ...] = SONAR + NODE
"""Every declared measurement."""

BY_NAME: dict[str, Metric] = {m.name: m for m in REGISTRY}
"""Measurement name -> Metric, over both parts (a test checks that no name is declared twice)."""
