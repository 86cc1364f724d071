"""How bus lines are shaped for InfluxDB: stable field types and the process-cardinality policy.

Field types: InfluxDB fixes a field's type with its first point (per shard) and drops later points of another
type ("field type conflict"). Producers disagree (cc-lib sends `value=400000i`, collectors `value=4.0e5`), so
the writer decides: a measurement in the metric registry (`schemas.metrics`, both parts) gets its declared
type, any other metric's `value` is a float. Where InfluxDB holds a declared integer as float (hpcbus before
the registry was one wrote the node agent's counters as floats; the type is per shard), the write's conflict
names it, and the writer writes those lines again in the type named (`values_as`) and follows it from then
on (`FieldTypes`), in either direction: see `consumers.influx.sink` for a batch that spans both kinds of
shard.

Cardinality: per-process lines carry `pid`, `cmd`, `stype-id=<job>/<pid>` tags — one series per process,
the classic way to kill InfluxDB. By default (`aggregate`) `process_*` lines are folded into one series per
(cluster, host, job, epoch, user[, GPU]) with the registry's aggregation (sum/avg/max), tagged
`stype=job,stype-id=<jobkey>`; `full` keeps every process series. The bus itself always keeps full fidelity.
Aggregation happens over what the writer holds at once (one delivery batch): a node's sample arrives in one
message or a few consecutive ones, which land in the same batch.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Mapping

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.lineprotocol.format import plain_measurement, plain_value
from hpcbus.schemas.metrics import BY_NAME, REGISTRY
from hpcbus.schemas.native import extension

_native = extension("hpcbus.schemas._influxdb")

Splice = Callable[
    [list[str | Line], str, dict[str, type], bool, list[str], Callable[[str | Line], None], list], None
]
SPLICE: Splice | None = _native.splice if _native is not None else None
"""The compiled splice of the InfluxDB sink's usual line (`_influxdb.c`), None where it is not built or
`HPCBUS_PURE=1`: `splice(items, tag, types, aggregate, out, other)` appends each canonical text of `items`
to `out` as the sink writes it (with `tag`, `,cluster=<c>`, spliced in after its measurement; as it came when
it carries that cluster already; a node-level line written again with InfluxDB's `type-id=0`), and hands
every other item to `other` (the sink's Python way, `schemas.influxbody.Bodies.body`: the
reference), in order; byte-equal output on both paths (tests/test_compiled_influxdb.py). With `aggregate`,
each process line it is sure of goes to `processes` as `(text, tag)`, for `FOLD`."""

Fold = Callable[[list, dict[str, type], dict[str, str]], list[str] | None]
FOLD: Fold | None = _native.fold if _native is not None else None
"""The compiled `aggregate_processes` of the process lines `SPLICE` kept (`_influxdb.c`), None where it is not
built: `fold(processes, types, AGGS)` is the lines `format_line(stable_types(line, types))` writes for
`aggregate_processes` of them, in order (a `Line` the Python way placed among them too, where its tags need no
escapes but in `pid`/`ppid`/`cmd`, which are dropped); None when it is unsure of even one of them (an int sum
beyond int64, ints and floats in one group, ...): the pure path then folds them all
(`schemas.influxbody.Bodies.body`)."""

_DROP_FOR_AGGREGATE = ("pid", "ppid", "cmd")


KINDS: dict[str, type] = {m.name: m.kind for m in REGISTRY}
"""Measurement -> the type the registry declares for its `value`."""

AGGS: dict[str, str] = {m.name: m.agg for m in REGISTRY}
"""Measurement -> how `aggregate_processes` folds its values (`FOLD`'s copy of the registry's `agg`)."""


def stable_types(line: Line, kinds: Mapping[str, type] = KINDS) -> Line:
    """The metric's `value` in the one type its measurement has on every write: `kinds`' (the registry's,
    or a writer's `FieldTypes`), else float (in place, returned)."""
    fields = line.fields
    value = fields.get("value")
    if value is None or type(value) is bool or type(value) is str:
        return line
    want = kinds.get(line.measurement, float)
    if type(value) is not want:
        # inf (a sum of process lines) as an int stays inf: `format_line` refuses it, the sink counts it
        with contextlib.suppress(OverflowError, ValueError):
            fields["value"] = want(value)
    return line


_CONFLICT = re.compile(
    r'field type conflict: input field \\?"value\\?" on measurement \\?"([^"\\]+)\\?" is type (\w+), '
    r"already exists as type (\w+)"
)


def type_conflict(message: str) -> tuple[str, str, str] | None:
    """(measurement, type sent, type stored) of the field type conflict InfluxDB's error `message` names (1.x
    names the first one of a write), None when it names none."""
    found = _CONFLICT.search(message)
    return (found.group(1), found.group(2), found.group(3)) if found is not None else None


INFLUX_TYPES: dict[str, type] = {"float": float, "integer": int}
"""InfluxDB's name of a numeric field type (as its conflict errors say it) -> the Python type written so."""


class FieldTypes(dict[str, type]):
    """`KINDS`, except for the measurements InfluxDB has told this writer it holds in the other numeric type
    (measurement -> type; a plain dict, so a lookup costs what the registry's does).

    Why: InfluxDB fixes a field's type per shard. A site upgrading from an hpcbus that wrote the node agent's
    integer counters (`net_bytes_in`, ...) as floats has float fields in its older shards, while a new shard
    (or a second worker on the same database) may already hold them as integers: a point of the other type
    is refused ("partial write: field type conflict") and would be lost. InfluxDB 1.x names the first
    conflicting measurement of a write and the type it holds; `learn` takes that type for the measurement,
    in either direction, so the writer follows the shard it wrote last (the current one, as time goes on):
    float always (exact below 2^53), integer only for a measurement the registry declares int (any other
    metric may carry fractions). Learned per process: after a restart the writer tries the registry's type
    again."""

    def __init__(self) -> None:
        super().__init__(KINDS)

    @staticmethod
    def writable(measurement: str, stored: str) -> type | None:
        """The type `measurement`'s `value` is written as where InfluxDB holds it as `stored` (its name of a
        type); None when hpcbus never writes it so (a string, or integer for a metric not declared int)."""
        kind = INFLUX_TYPES.get(stored)
        if kind is int and KINDS.get(measurement) is not int:
            return None
        return kind

    def learn(self, message: str) -> str:
        """The measurement whose `value` InfluxDB holds in another numeric type we may write, per the error
        `message` (written in that type from now on); "" when the message says no such thing."""
        conflict = type_conflict(message)
        if conflict is None:
            return ""
        kind = self.writable(conflict[0], conflict[2])
        if kind is None:
            return ""
        self[conflict[0]] = kind
        return conflict[0]


def lines_of(measurement: str) -> tuple[str, str]:
    """The prefixes of a line of `measurement` as written (a plain name; one that needs escapes: none)."""
    if not plain_measurement(measurement):
        return ("\n", "\n")  # never starts a line
    return (measurement + ",", measurement + " ")


def values_as(texts: list[str], kind: type) -> list[str] | None:
    """`texts` (lines as written, each with a lone numeric field `value`) with that value written as `kind`
    (`value=5i` <-> `value=5.0`); None when one of them cannot be: another field set, or for int a fraction
    or a number beyond int64 (InfluxDB would refuse it in both types: it is not sent again)."""
    out = []
    for text in texts:
        head, _, tail = text.rpartition(" value=")
        number, _, time = tail.partition(" ")
        # the last " value=" starts the field set when a timestamp alone follows the number and the space
        # before it is no escaped one (a tag value holding " value=" is never misread)
        if not head or not time.isdigit() or head.endswith("\\"):
            return None
        try:
            integer = int(number[:-1]) if number.endswith("i") else None
            value = float(number) if integer is None else float(integer)
        except ValueError:
            return None
        if kind is int:
            if integer is None and value.is_integer() and -(2.0**63) <= value < 2.0**63:
                integer = int(value)
            if integer is None:
                return None
            written = f"{integer}i"
        else:
            written = plain_value(value) or ("0.0" if value == 0.0 else "")
            if not written:
                return None
        out.append(f"{head} value={written} {time}")
    return out


HOUR_IN = {"s": 3600, "ns": 3_600_000_000_000}
"""One hour in a write's timestamp precision."""


def one_shard(texts: list[str], precision: str) -> bool:
    """All `texts` (lines as written, timestamps in `precision`) fall in one UTC hour, so in one shard group
    whatever the retention policy's shard duration (1 h at least, a whole number of hours as every default
    is, groups aligned to it). Why: InfluxDB 1.x answers a write that spans shards with the first shard's
    error and count of dropped points only; for a write inside one shard that count is all of them."""
    hour = HOUR_IN[precision]
    first = None
    for text in texts:
        stamp = text[text.rfind(" ") + 1 :]
        if not stamp.isdigit():
            return False
        if first is None:
            first = int(stamp) // hour
        elif int(stamp) // hour != first:
            return False
    return True


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
