"""The translator's view of the metric registry (`hpcbus.schemas.metrics`): the Sonar sample's measurements.

The measurements themselves (name, level, Sonar field, unit, type, conversion, aggregation, zero rule) are
declared in `schemas/metrics/sonar.py`, beside the node agent's; this module gives the translator its part
under the names it dispatches by, plus what only the translator needs: which tags grow with jobs and
processes, and which Sonar fields are identity rather than measurements.
"""

from __future__ import annotations

from hpcbus.schemas.metrics import (
    CONV_IDENTITY,
    CONV_KIB_TO_MIB,
    CONV_PSTATE,
    SONAR,
    ZERO_OMITTED,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
    Metric,
)
from hpcbus.schemas.metrics.sonar import DISK_STAT_NAMES, disk_stat_name

__all__ = [
    "BY_NAME",
    "CONV_IDENTITY",
    "CONV_KIB_TO_MIB",
    "CONV_PSTATE",
    "DISK_STAT_NAMES",
    "HIGH_CARDINALITY_TAGS",
    "IDENTITY_FIELDS",
    "REGISTRY",
    "ZERO_OMITTED",
    "ZERO_WITH_BOOT",
    "ZERO_WRITTEN",
    "Metric",
    "disk_stat_name",
]

REGISTRY: tuple[Metric, ...] = SONAR
"""The measurements the translator writes and reads back, in the order of docs/mapping.md section 4."""

BY_NAME: dict[str, Metric] = {m.name: m for m in REGISTRY}
"""Measurement name -> Metric (the reassembler's dispatch table: Sonar measurements only)."""

HIGH_CARDINALITY_TAGS = frozenset({"stype-id", "job", "epoch", "pid", "ppid", "cmd"})
"""Tags whose number of values grows with jobs and processes: the InfluxDB writer drops or aggregates them
(for `stype=job|process` lines) by default. `user` is moderate and kept."""

IDENTITY_FIELDS: dict[str, frozenset[str]] = {
    "SampleGpu": frozenset({"index", "uuid", "compute_mode"}),
    "SampleDisk": frozenset({"name", "major", "minor"}),
    "SampleJob": frozenset({"job", "user", "epoch", "processes"}),
    "SampleProcess": frozenset({"cmd", "pid", "ppid", "in_container", "gpus"}),
    "SampleProcessGpu": frozenset({"index", "uuid"}),
    "SampleSystem": frozenset({"boot", "gpus", "disks"}),
}
"""Fields that are *not* metric lines (identity, strings, containers): they travel as tags and/or in the
skeleton. A test checks that every field of the sample structs is either here or in REGISTRY, so a field
added to `schemas.sonar.types` cannot be forgotten silently (it would still survive, in the skeleton)."""
