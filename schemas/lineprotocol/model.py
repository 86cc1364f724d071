"""The in-memory form of one line: what every producer builds and every consumer reads."""

from __future__ import annotations

import msgspec

FieldValue = float | int | bool | str

# Field key -> message kind. Exactly one of these keys is present in a ClusterCockpit line.
KINDS: dict[str, str] = {"value": "metric", "event": "event", "log": "log", "control": "control"}

# The hardware levels of the `type` tag (cc-specifications); `type=node` is the node level.
TYPES: frozenset[str] = frozenset(
    {"node", "socket", "die", "memoryDomain", "llc", "core", "hwthread", "accelerator"}
)

STYPE_DISK = "disk"
"""`stype` of a block device below the node (`stype-id` = its name: `sda`, `nvme0n1`)."""
STYPE_NETWORK = "network"
"""`stype` of a network interface below the node (`stype-id` = its name: `eth0`, `ib0`)."""
STYPE_INFINIBAND = "infiniband"
"""`stype` of an InfiniBand port below the node (`stype-id` = `<hca>:<port>`)."""
STYPE_FILESYSTEM = "filesystem"
"""`stype` of a mounted file system below the node (`stype-id` = its name or mount point)."""
STYPE_TASK = "task"
"""`stype` of a Slurm task below the node (`stype-id` = `<job>.<step>.<task>`: Slurm's profile plugin)."""
# Every writer of a device below the node names its kind with these (the node agent, the Sonar translation,
# the gateway's Telegraf and Slurm mapping), so one interface or disk is one series whoever measured it.

INFLUX_NODE_ID = "0"
"""The `type-id` every node-level series has in InfluxDB (the InfluxDB writer writes it; never on the bus)."""


def node_level_tags(tags: dict[str, str]) -> bool:
    """Put the tags of a node-level metric line (`type=node`) in the form it has on the bus, in place; True
    when they changed. The node itself has no `type-id`; a device, job or process below it (`stype`) has its
    sub-type's name as `type-id`.

    Why: the metric store (cc-backend `pkg/metricstore/lineprotocol.go`, what cc-metric-store runs) builds
    the selector below the host from `type`+`type-id`, skipping the word `node` but appending any `type-id`,
    and reads `stype`+`stype-id` only below such a selector. So `type=node,type-id=0` is stored under a
    child `0` of the host, and a node-level query (the host, no type) then averages it with the host's
    `hwthread<i>` children. Without a `type-id` a node value is stored at the host itself (what
    cc-metric-collector sends); with `type-id=<stype>` a device lands at `<stype>` / `<stype><stype-id>`
    below the host, so two disks or processes never overwrite each other at the host.
    """
    stype = tags.get("stype")
    if stype:
        if tags.get("type-id") == stype:
            return False
        tags["type-id"] = stype
        return True
    return tags.pop("type-id", None) is not None


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
    type_id: str = "",
    **tags: str,
) -> Line:
    """A CC metric line with the mandatory tags first (extra tags: `stype`, `stype-id` via `stype_id`...).
    A node-level line gets its bus form (`node_level_tags`), whatever `type_id` says."""
    all_tags = {"hostname": hostname, "type": type}
    if type_id:
        all_tags["type-id"] = type_id
    for key, val in tags.items():
        all_tags[key.replace("_", "-")] = val
    if type == "node":
        node_level_tags(all_tags)
    return Line(name, all_tags, {"value": value}, time)


def event(cls: str, payload: str, *, time: int, function: str | None = None, **tags: str) -> Line:
    """A CC event line (`job,function=start_job event="{...}"`); tags given as keyword arguments."""
    all_tags = {key.replace("_", "-"): val for key, val in tags.items()}
    if function is not None:
        all_tags["function"] = function
    return Line(cls, all_tags, {"event": payload}, time)
