"""ClusterCockpit's flavour of InfluxDB line protocol: one field per line, the field key tells the kind
(`value` metric, `event`, `log`, `control`), seconds timestamps, `hostname`/`type`/`type-id` tags
(none for the node level itself: `node_level_tags`).

Lenient on input (the spec's own unquoted examples, cc-lib's `start_job` measurement, ns timestamps),
strict on output (always valid line protocol in the form cc-backend and cc-metric-store read).
"""

from hpcbus.schemas.lineprotocol.format import FormatError, escape_tag, format_line, format_lines
from hpcbus.schemas.lineprotocol.model import (
    INFLUX_NODE_ID,
    KINDS,
    STYPE_DISK,
    STYPE_FILESYSTEM,
    STYPE_INFINIBAND,
    STYPE_NETWORK,
    STYPE_TASK,
    TYPES,
    FieldValue,
    Line,
    event,
    metric,
    node_level_tags,
)
from hpcbus.schemas.lineprotocol.parse import Parsed, parse_payload
from hpcbus.schemas.lineprotocol.timestamps import to_seconds

__all__ = [
    "INFLUX_NODE_ID",
    "KINDS",
    "STYPE_DISK",
    "STYPE_FILESYSTEM",
    "STYPE_INFINIBAND",
    "STYPE_NETWORK",
    "STYPE_TASK",
    "TYPES",
    "FieldValue",
    "FormatError",
    "Line",
    "Parsed",
    "escape_tag",
    "event",
    "format_line",
    "format_lines",
    "metric",
    "node_level_tags",
    "parse_payload",
    "to_seconds",
]
