"""JetStream streams as data: what hpcbus' streams are (`StreamSpec`, the telemetry, ingest and dead-letter
streams of a cluster), how large and how replicated (`for_bus`, `hour_bytes`), and making sure they exist
as wanted (`ensure_stream`: created when missing, a difference from what exists reported, never changed).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Placement, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from hpcbus.schemas import subjects
from hpcbus.settings import BusSettings

log = logging.getLogger("hpcbus.bus")  # as the log has always named the bus


def discards_bucket(stream: str) -> str:
    """The JetStream key-value bucket where the workers of `stream`'s durables record the discards they
    reported, one key per durable (hpcbus.discards; deploy's permissions name it: nats_auth)."""
    return f"{stream}_discards"


def roles_bucket(cluster: str) -> str:
    """The JetStream key-value bucket of a cluster's active/standby roles: their leases and the state their
    holders keep there (hpcbus.lease; deploy's permissions name it: nats_auth)."""
    return stream_name("HPCBUS_ROLES", cluster)


class StreamSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A JetStream stream as configuration data."""

    name: str
    subjects: list[str]
    max_age: float = 7 * 86400.0
    """Seconds a message is kept (default one week)."""
    max_bytes: int = 2**30
    """Bytes the stream may hold; the oldest go first beyond that (default 1 GiB: servers refuse a stream
    larger than their `max_file_store`; raise it on a broker sized for it)."""
    duplicate_window: float = 120.0
    """Seconds within which a re-sent `Nats-Msg-Id` is dropped by the server."""
    storage: Literal["file", "memory"] = "file"
    """`file` (survives a broker restart) or `memory`."""
    replicas: int = 0
    """Servers holding a copy; 0 = auto (`auto_replicas`: 1 on a single server, 3 on a cluster)."""
    placement_tags: list[str] = msgspec.field(default_factory=list)
    """Server tags the stream must be placed on ([] = anywhere)."""
    discard: Literal["old", "new"] = "old"
    """Full: `old` drops the oldest messages (`limits` retention); `new` refuses new ones and keeps each
    message until every durable reading its subject has acknowledged it (`interest` retention)."""
    archive: bool = False
    """A stream kept for people, not for durables (dead letters): always `old`, whatever `[bus]` says
    (`interest` retention would drop what no durable reads at once)."""
    node_data: bool = False
    """The nodes' samples go into it (telemetry, ingest): its size is checked against `expected_nodes`."""
    expected_nodes: int = 0
    """Nodes publishing into it (`[bus] expected_nodes`; 0 = not said): created smaller than an hour of
    them is a WARNING."""


NODE_BYTES_PER_SECOND = 4_500
"""What one compute node sends at the default 30 s interval (128 cores, 4 GPUs, 4 jobs: 134 kB per sample;
docs/scaling.md, measured with `hpcbus simulate`)."""


def hour_bytes(nodes: int) -> int:
    """Stream bytes that hold one hour of `nodes` nodes' samples (what a worker or InfluxDB outage of an
    hour fills)."""
    return nodes * NODE_BYTES_PER_SECOND * 3600


CLUSTER_REPLICAS = 3
"""Replicas `auto` asks for on a cluster: JetStream's Raft needs a majority, so 3 copies keep a stream
writable with one server down (2 would not: one of two is no majority) at a third of 5's write cost."""


def auto_replicas(server_info: Mapping[str, Any]) -> int:
    """The replica count `auto` means on the server that sent this INFO: 1 on a server without a `cluster`
    (a standalone nats-server refuses more), else `CLUSTER_REPLICAS`, or the number of servers the cluster
    advertises (`connect_urls`) when that is fewer. A cluster that does not advertise (`no_advertise`) gets
    `CLUSTER_REPLICAS`; if it has fewer JetStream servers the server's refusal names the stream and
    `--stream-replicas` says what to set."""
    if not server_info.get("cluster"):
        return 1
    advertised = len(set(server_info.get("connect_urls") or ()))
    return min(CLUSTER_REPLICAS, advertised) if advertised >= 2 else CLUSTER_REPLICAS


def server_info(nc: NATS) -> Mapping[str, Any]:
    """The INFO the server sent when this connection was made (nats-py keeps it, without a public name)."""
    info: Mapping[str, Any] = getattr(nc, "_server_info", None) or {}
    return info


def for_bus(spec: StreamSpec, bus: BusSettings) -> StreamSpec:
    """`spec` with the stream settings of `[bus]` (replicas, storage, placement tags): every stream a
    command creates follows them, whichever command creates it first."""
    return msgspec.structs.replace(
        spec,
        replicas=bus.stream_replicas,
        storage=bus.stream_storage,
        placement_tags=list(bus.stream_placement_tags),
        discard="old" if spec.archive else bus.stream_discard,
        expected_nodes=bus.expected_nodes,
    )


def stream_name(prefix: str, cluster: str) -> str:
    """Stream names may not contain dots: `fox.educloud.no` -> `HPCBUS_fox_educloud_no`."""
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_-]', '_', cluster)}"


def telemetry_stream(cluster: str, *, prefix: str = "", **overrides: object) -> StreamSpec:
    """Everything a cluster publishes that consumers must not lose (control is request/reply, not stored).

    The subjects follow the subject prefix (`cc.fox.metrics`, ...); the name is the cluster's alone
    (`HPCBUS_fox`), so turning a prefix on adds its subjects to the stream a cluster already has
    (`ensure_stream` never removes any) instead of starting a second one."""
    return msgspec.convert(
        {
            "name": stream_name("HPCBUS", cluster),
            "subjects": subjects.stored(cluster, prefix=prefix),
            "node_data": True,
            **overrides,
        },
        StreamSpec,
    )


def deadletter_stream(cluster: str, *, prefix: str = "") -> StreamSpec:
    """Rejected input with its original payload, kept for `hpcbus deadletter list|replay` (30 days); named
    like the telemetry stream, by the cluster alone."""
    return StreamSpec(
        name=stream_name("HPCBUS_DLQ", cluster),
        subjects=[subjects.deadletter_wildcard(cluster, prefix=prefix)],
        max_age=30 * 86400.0,
        archive=True,
    )


def ingest_stream(cluster: str, *, prefix: str = "", **overrides: object) -> StreamSpec:
    """What nodes publish on their own ingest subjects (`<cluster>.ingest.<host>.>`) until `hpcbus consume
    ingest` has checked and forwarded it; a day is plenty for a worker outage."""
    return msgspec.convert(
        {
            "name": stream_name("HPCBUS_INGEST", cluster),
            "subjects": [subjects.ingest_wildcard(cluster, prefix=prefix)],
            "max_age": 86400.0,
            "node_data": True,
            **overrides,
        },
        StreamSpec,
    )


async def ensure_stream(
    js: JetStreamContext, spec: StreamSpec, info: Mapping[str, Any] | None = None
) -> None:
    """Create the stream if missing; add our subjects to an existing one (never remove an operator's).

    Any other difference between the stream and `spec` (replicas, storage, limits, placement) is reported
    as one WARNING per setting and left alone: the stream may have been sized by hand, and changing
    replicas or storage under running publishers is an operator's decision (`nats stream edit`).
    `info`: the server's INFO, for `auto` replicas (default: the INFO of `js`'s connection)."""
    replicas = spec.replicas or auto_replicas(info if info is not None else server_info(js._nc))
    config = StreamConfig(
        name=spec.name,
        subjects=spec.subjects,
        retention=RetentionPolicy.INTEREST if spec.discard == "new" else RetentionPolicy.LIMITS,
        discard=DiscardPolicy.NEW if spec.discard == "new" else DiscardPolicy.OLD,
        max_age=spec.max_age,
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window,
        storage=StorageType.FILE if spec.storage == "file" else StorageType.MEMORY,
        num_replicas=replicas,
        placement=Placement(tags=list(spec.placement_tags)) if spec.placement_tags else None,
    )
    try:
        existing = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(config)
        log.info(
            "created stream %s over %s (%d replica%s, %s storage%s)",
            spec.name,
            ", ".join(spec.subjects),
            replicas,
            "" if replicas == 1 else "s",
            spec.storage,
            f", placement tags {','.join(spec.placement_tags)}" if spec.placement_tags else "",
        )
        warn_if_small(spec)
        return
    for setting, have, want in stream_differences(existing.config, config):
        log.warning(
            "stream %s: %s is %s, this command wants %s; not changed (`nats stream edit %s` or recreate it "
            "to apply)",
            spec.name,
            setting,
            have,
            want,
            spec.name,
        )
    have_subjects = list(existing.config.subjects or [])
    missing = [s for s in spec.subjects if s not in have_subjects]
    if missing:
        existing.config.subjects = have_subjects + missing
        await js.update_stream(existing.config)
        log.info("stream %s: added subjects %s", spec.name, ", ".join(missing))


def interest_retention(config: StreamConfig) -> bool:
    """Does a stream keep a message only for its durables (`interest` retention, what `stream_discard =
    "new"` creates)? `config` as the server answered it (a string) or as built here (an enum)."""
    return str(getattr(config.retention, "value", config.retention)) == "interest"


def warn_if_small(spec: StreamSpec) -> None:
    """A WARNING when a stream of the nodes' samples holds less than an hour of `expected_nodes` nodes:
    a worker or InfluxDB outage longer than that loses the oldest samples (discard=old)."""
    if not (spec.node_data and spec.expected_nodes):
        return
    need = hour_bytes(spec.expected_nodes)
    if spec.max_bytes < need:
        minutes = spec.max_bytes / (spec.expected_nodes * NODE_BYTES_PER_SECOND) / 60
        log.warning(
            "stream %s: created with max_bytes %d, about %.0f minutes of %d nodes; an hour needs %d "
            "(--stream-max-bytes; docs/deploy.md, docs/scaling.md)",
            spec.name,
            spec.max_bytes,
            minutes,
            spec.expected_nodes,
            need,
        )


SETTING_NAMES = {
    "num_replicas": "replicas (--stream-replicas)",
    "storage": "storage (--stream-storage)",
    "max_age": "max_age in seconds (--stream-max-age)",
    "max_bytes": "max_bytes (--stream-max-bytes)",
    "placement": "placement tags (--stream-placement-tags)",
    "discard": "discard (--stream-discard)",
    "retention": "retention (--stream-discard)",
}
"""StreamConfig field -> how a warning names it (the setting that asks for it)."""


def stream_differences(have: StreamConfig, want: StreamConfig) -> list[tuple[str, object, object]]:
    """(setting, existing value, wanted value) for each setting hpcbus chooses in which the two differ."""

    def value(config: StreamConfig, name: str) -> object:
        v = getattr(config, name)
        if name == "storage":  # an enum in what we build, a string in what the server answered
            return str(getattr(v, "value", v) or "file")
        if name in ("discard", "retention"):
            return str(getattr(v, "value", v) or ("old" if name == "discard" else "limits"))
        if name == "placement":
            tags = v.get("tags") if isinstance(v, dict) else getattr(v, "tags", None)
            return sorted(tags or [])
        if name == "num_replicas":
            return v or 1
        if isinstance(v, float):
            return round(v, 3)
        return v

    found = []
    for name, label in SETTING_NAMES.items():
        a, b = value(have, name), value(want, name)
        if a != b:
            found.append((label, a, b))
    return found
