"""How bus lines are shaped for InfluxDB: stable field types and the process-cardinality policy.

Field types: InfluxDB fixes a field's type with its first point and drops later points of another type
("field type conflict"). Producers disagree (cc-lib sends `value=400000i`, collectors `value=4.0e5`), so the
writer decides: a measurement in the registry gets its declared type, any other metric's `value` is a float.

Cardinality: per-process lines carry `pid`, `cmd`, `stype-id=<job>/<pid>` tags — one series per process,
the classic way to kill InfluxDB. By default (`aggregate`) `process_*` lines are folded into one series per
(cluster, host, job, epoch, user[, GPU]) with the registry's aggregation (sum/avg/max), tagged
`stype=job,stype-id=<jobkey>`; `full` keeps every process series. The bus itself always keeps full fidelity.
Aggregation happens over what the writer holds at once (one delivery batch): a node's sample arrives in one
message or a few consecutive ones, which land in the same batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.lineprotocol.format import plain_measurement
from hpcbus.schemas.translate.registry import BY_NAME

_DROP_FOR_AGGREGATE = ("pid", "ppid", "cmd")


def value_type(measurement: str) -> type:
    """The one type a metric's `value` has in InfluxDB: the registry's, else float."""
    declared = BY_NAME.get(measurement)
    return declared.kind if declared is not None else float


def stable_types(line: Line) -> Line:
    """The metric's `value` in the one type its measurement has on every write (in place, returned)."""
    fields = line.fields
    value = fields.get("value")
    if value is None or type(value) is bool or type(value) is str:
        return line
    want = value_type(line.measurement)
    if type(value) is not want:
        fields["value"] = want(value)
    return line


def tag_splice(measurement: str, tag: str) -> tuple[str, str] | None:
    """(`measurement,`, `measurement` + `tag` + `,`): a line of this measurement that starts with the first
    gets `tag` (`,key=value`, escaped) right after its measurement by swapping the prefix for the second. None
    when the measurement needs escapes in text (its text then differs from the name: format the line)."""
    if not plain_measurement(measurement):
        return None
    return measurement + ",", measurement + tag + ","


def _job_key(stype_id: str) -> str:
    # `<jobkey>/<pid>[#n]` -> `<jobkey>`
    return stype_id.rsplit("/", 1)[0]


def aggregate_processes(lines: Iterable[Line]) -> list[Line]:
    """Process lines folded per job (see module doc); all other lines pass through in order."""
    out: list[Line] = []
    groups: dict[tuple, tuple[Line, list[float | int]]] = {}
    for line in lines:
        tags = line.tags
        if tags.get("stype") != "process":
            out.append(line)
            continue
        new_tags = {k: v for k, v in tags.items() if k not in _DROP_FOR_AGGREGATE}
        new_tags["stype"] = "job"
        new_tags["stype-id"] = _job_key(tags.get("stype-id", ""))
        key = (line.measurement, line.time, tuple(sorted(new_tags.items())))
        value = line.fields.get("value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            out.append(line)
            continue
        if key in groups:
            groups[key][1].append(value)
        else:
            agg_line = Line(line.measurement, new_tags, {"value": value}, line.time)
            groups[key] = (agg_line, [value])
            out.append(agg_line)
    for agg_line, values in groups.values():
        if len(values) == 1:
            continue
        metric = BY_NAME.get(agg_line.measurement)
        how = metric.agg if metric is not None else "sum"
        if how == "max":
            result: float | int = max(values)
        elif how == "avg":
            result = sum(values) / len(values)
        else:
            result = sum(values)
        agg_line.fields["value"] = result
    return out
