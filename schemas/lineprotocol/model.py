"""The in-memory form of one line: what every producer builds and every consumer reads."""

from __future__ import annotations

import msgspec

FieldValue = float | int | bool | str

# Field key -> message kind. Exactly one of these keys is present in a ClusterCockpit line.
KINDS: dict[str, str] = {"value": "metric", "event": "event", "log": "log", "control": "control"}

# The hardware levels of the `type` tag (cc-specifications); `type=node,type-id=0` is the node level.
TYPES: frozenset[str] = frozenset(
    {"node", "socket", "die", "memoryDomain", "llc", "core", "hwthread", "accelerator"}
)

LOG_LEVELS: frozenset[str] = frozenset({"debug", "info", "warn", "error"})
CONTROL_METHODS: frozenset[str] = frozenset({"GET", "PUT"})


class Line(msgspec.Struct, gc=False):
    """One line-protocol point. `time` is whole epoch seconds, the only precision every CC consumer reads."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    time: int

    @property
    def kind(self) -> str:
        """`metric`, `event`, `log` or `control` (by field key); `metric` for a foreign multi-field line."""
        fields = self.fields
        for key, kind in KINDS.items():
            if key in fields:
                return kind
        return "metric"

    @property
    def payload(self) -> FieldValue:
        """The one CC field's value: the number of a metric, the string of an event/log/control."""
        fields = self.fields
        for key in KINDS:
            if key in fields:
                return fields[key]
        raise KeyError("no value/event/log/control field")


def metric(
    name: str,
    value: float | int,
    *,
    hostname: str,
    time: int,
    type: str = "node",
    type_id: str = "0",
    **tags: str,
) -> Line:
    """A CC metric line with the mandatory tags first (extra tags: `stype`, `stype-id` via `stype_id`...)."""
    all_tags = {"hostname": hostname, "type": type, "type-id": type_id}
    for key, val in tags.items():
        all_tags[key.replace("_", "-")] = val
    return Line(name, all_tags, {"value": value}, time)


def event(cls: str, payload: str, *, time: int, function: str | None = None, **tags: str) -> Line:
    """A CC event line (`job,function=start_job event="{...}"`); tags given as keyword arguments."""
    all_tags = {key.replace("_", "-"): val for key, val in tags.items()}
    if function is not None:
        all_tags["function"] = function
    return Line(cls, all_tags, {"event": payload}, time)
