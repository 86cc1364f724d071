"""What `hpcbus status` found, as data: the screen, `--json` and the verdict are all made from one
`Report`, so the JSON carries exactly the facts the screen shows."""

from __future__ import annotations

import msgspec


class Server(msgspec.Struct, kw_only=True):
    url: str
    reachable: bool
    name: str = ""
    version: str = ""
    cluster: str = ""
    """The NATS cluster (route) name the server belongs to, "" when it runs alone."""
    jetstream: bool = False
    error: str = ""


class Replica(msgspec.Struct, kw_only=True):
    name: str
    current: bool
    offline: bool = False
    lag: int = 0
    active_s: float = 0.0


class Stream(msgspec.Struct, kw_only=True):
    name: str
    subjects: list[str]
    messages: int
    bytes: int
    max_bytes: int
    """-1: no byte limit."""
    max_age_s: float
    first_time: float
    last_time: float
    ingest_bytes_per_s: float
    """Bytes stored per second, averaged over what the stream holds."""
    headroom_minutes: float | None
    """Minutes of ingest at that rate before `max_bytes` is reached (None: no limit or no ingest)."""
    replicas: int
    leader: str = ""
    followers: list[Replica] = msgspec.field(default_factory=list)
    messages_per_subject: dict[str, int] = msgspec.field(default_factory=dict)


class Durable(msgspec.Struct, kw_only=True):
    stream: str
    name: str
    filter: list[str]
    pending: int
    """Messages stored and not yet delivered to it."""
    ack_pending: int
    """Delivered, not yet acknowledged."""
    redelivered: int
    waiting: int
    """Pull requests waiting: a live worker keeps at least one open."""
    last_ack_s: float | None
    """Seconds since the last acknowledgement (None: never)."""
    last_delivery_s: float | None = None
    """Seconds since JetStream last delivered a message to it (None: never)."""
    acks_per_s: float | None
    """Messages acknowledged per second while status looked (None: not measured)."""
    drain_s: float | None
    """Seconds to work off what is waiting at that rate (None: not draining)."""
    growing: int | None = None
    """Change of `pending + ack_pending` while status looked (None: not measured)."""


class DeadLetters(msgspec.Struct, kw_only=True):
    stream: str
    count: int
    newest_time: float | None = None
    newest_subject: str = ""
    newest_reason: str = ""


class Worker(msgspec.Struct, kw_only=True):
    """A process that reports `hpcbus_*` counters on `<cluster>.telemetry` (workers, the gateway)."""

    host: str
    name: str
    last_report: float
    interval_s: float
    alive: bool
    counters: dict[str, float]
    rates: dict[str, float]
    """Counters per second, between its last two reports (gauges are in `counters` only)."""
    backlog: float | None = None
    last_error: str = ""
    stopped: bool = False
    """Its last report was the one it made as it stopped (`running 0`)."""


class Role(msgspec.Struct, kw_only=True):
    """An active/standby role of the cluster (`hpcbus.lease`): who holds its lease, since when."""

    role: str
    holder: str = ""
    """`<host>:<pid>` of the holder; "" when nobody holds it (a takeover is under way, or no pair runs)."""
    since: float | None = None
    renewed_s: float | None = None
    """Seconds since its holder last renewed it."""
    ttl_s: float | None = None
    standby: str = ""
    """`<host>:<pid>` of the instance standing by (it says so every fifth of the TTL); "" when none does."""
    standby_seen_s: float | None = None
    saved: bool = False
    """Its holders keep state in the roles bucket (a pair ran it): nobody holding it then is a problem."""


class Node(msgspec.Struct, kw_only=True):
    host: str
    last_sample: float
    interval_s: float
    silent: bool
    exact: bool = True
    """False: seen only by a probe further back: its last sample is this one or a later one, older than the
    window read in full (`Nodes.window_s`)."""


class Nodes(msgspec.Struct, kw_only=True):
    source: str
    """Where the last samples came from: the skeletons on the stream (`bus`), InfluxDB, or nothing."""
    seen: int
    interval_s: float | None
    silent: list[Node]
    newest: float | None = None
    window_s: float = 0.0
    """Seconds back from now in which every sample was read."""
    influx_error: str = ""
    """Why InfluxDB could not be asked (with `--influx`): unhealthy, the nodes are then the bus' view."""
    hosts: list[Node] = msgspec.field(default_factory=list)


class Cluster(msgspec.Struct, kw_only=True):
    name: str
    streams: list[Stream]
    durables: list[Durable]
    deadletters: DeadLetters | None
    workers: list[Worker]
    nodes: Nodes
    errors: list[str] = msgspec.field(default_factory=list)
    """Latest error lines on `<cluster>.log.>`, newest last."""
    roles: list[Role] = msgspec.field(default_factory=list)
    """Its active/standby roles that a pair runs or ran (held, stood by, or with saved state; empty when no
    pair runs)."""


class TagValues(msgspec.Struct, kw_only=True):
    """The most distinct values of one tag key in any measurement."""

    tag: str
    measurement: str
    values: int
    limit: int
    """`max_values_per_tag` status was given (0: no limit)."""


class Problem(msgspec.Struct, kw_only=True):
    where: str
    what: str


class Report(msgspec.Struct, kw_only=True):
    time: float
    took_s: float
    servers: list[Server]
    clusters: list[Cluster]
    jetstream_error: str = ""
    """Why the JetStream API could not be asked although a server answered ("" when it could)."""
    tag_values: list[TagValues] = msgspec.field(default_factory=list)
    """With `--influx`: per tag key, the most distinct values one measurement holds (docs/status.md)."""
    tag_values_error: str = ""
    """Why they could not be counted ("" when they were, or without `--influx`)."""
    problems: list[Problem] = msgspec.field(default_factory=list)
    warnings: list[Problem] = msgspec.field(default_factory=list)
    """Said, not judged (exit 0): a tag nearing InfluxDB's `max-values-per-tag`."""
    healthy: bool = True
