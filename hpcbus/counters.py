"""The one vocabulary of a worker's self-telemetry: what every sink counts, under one name each.

Every consumer worker publishes its counters as `hpcbus_<name>` lines (`hpcbus.outlet.Outlet.telemetry`) and
logs them as one summary line; both are written here and in `hpcbus.runner` (every `stats_seconds`, and once
at the end by `hpcbus.sinks`, after the sinks' `close`), never by a sink. The six standard counters mean the
same in every worker, so a dashboard or `hpcbus status` reads any worker alike; what only one sink knows
(lines written to InfluxDB, envelopes assembled, open jobs) is a sink's extra: a subclass of `Counters` adds
fields, which are published and logged after the standard ones.

Who counts: the runner, alone, counts `received`, `delivered` (acknowledged; for a sink that holds its
input, once the sink settles it: `hpcbus.runner.Settled`), `retried` (each retry of a `deliver`, `tick`,
`close` or `start`: `hpcbus.runner.Runner.attempt`), `rejected` (what `take` refuses: `BadInput`),
`deadlettered` (what it dead-letters, once stored) and `pending`, and the runtime's extras below; a sink
counts only its extras (and `rejected` for lines InfluxDB drops after `take`, and for the lines of a host
Sonar refuses that the LP -> Sonar sink drops after the first of its episode). For every sink, at any
report: received = delivered + deadlettered + returned_messages + pending (`tests/test_sink_compliance.py`
holds every sink to it). A message a sink takes again (delivered message by message after a permanent
failure) counts once: the runner undoes the counts of the second `take`.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

STANDARD = ("received", "delivered", "retried", "rejected", "deadlettered", "pending")
"""The standard counters, in the order the summary line says them."""

LABELS = {"deadlettered": "dead-lettered"}
"""How a standard counter reads in the summary line when its name is not a word."""


RUNTIME_EXTRAS = (
    "undeliverable_messages",
    "returned_messages",
    "deadlettered_merged",
    "deadletter_stream_dropped",
    "discarded_unread",
)
"""The runtime's counters beyond the standard ones: said in the summary line only when not zero."""


class Counters(msgspec.Struct):
    """A worker's counters; a sink with extras subclasses it (and adds its gauges to `GAUGES`)."""

    GAUGES: ClassVar[frozenset[str]] = frozenset({"pending", "deadletter_stream_dropped", "running"})
    """The fields that say a level now, not a count since start: `hpcbus status` shows them as they are,
    never as a rate (their lines carry `kind=gauge`: `hpcbus.outlet.Outlet.telemetry`)."""

    received: int = 0
    """Messages taken from the bus."""
    delivered: int = 0
    """Messages acknowledged after their delivery (written, forwarded, published, saved) without a problem:
    a message dead-lettered (refused wholly or in part, undeliverable) is counted in `deadlettered`, never
    here too."""
    retried: int = 0
    """Delivery attempts retried because the far end did not take them (InfluxDB away, a publish without
    acknowledgement, a file that could not be written yet)."""
    rejected: int = 0
    """Items refused as invalid (lines or envelopes: each problem of severity error once)."""
    deadlettered: int = 0
    """Messages stored in the dead-letter stream (`hpcbus.outlet.Outlet.store_deadletter`: retried until
    stored; the message is acknowledged only then)."""
    pending: int = 0
    """Gauge: messages taken and not yet acknowledged."""
    undeliverable_messages: int = 0
    """Messages that failed with an error no retry cures (`hpcbus.permanent`): dead-lettered with the reason
    (counted in `deadlettered` too), acknowledged."""
    returned_messages: int = 0
    """Messages a sink held (see `hpcbus.runner.Settled`) and handed back unacknowledged (`-NAK`) at the
    stop: redelivered at once to the next worker. received = delivered + deadlettered + returned_messages +
    pending."""
    deadlettered_merged: int = 0
    """Merged output (an assembled envelope) a sink rejected, stored in the dead-letter stream: not a
    message, so outside the identity above."""
    deadletter_stream_dropped: int = 0
    """Gauge: dead letters the cluster's dead-letter stream no longer holds from its oldest end (past its 30
    days or its `max_bytes`, or replayed: `hpcbus.outlet.Outlet.deadletter_dropped`)."""
    discarded_unread: int = 0
    """Messages the stream discarded before this durable delivered them (an upper bound when the stream also
    holds subjects the durable does not read: see `hpcbus.discards`)."""
    running: int = 1
    """Gauge: 1 while the process runs, 0 in the report it makes as it stops (`hpcbus status` then says it
    stopped at once, instead of calling it alive until three intervals have passed)."""


def summary(name: str, counters: Counters) -> str:
    """The one-line summary: the standard counters, then the runtime's and the sink's extras (non-zero ones
    of the runtime's, all of the sink's), each as `words value`."""
    values = msgspec.structs.asdict(counters)
    head = ", ".join(f"{LABELS.get(key, key)} {values.pop(key)}" for key in STANDARD)
    del values["running"]  # for `status`: the summary line is written by a running process
    for key in RUNTIME_EXTRAS:
        if not values[key]:
            del values[key]
    extras = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in values.items())
    return f"{name}: {head}" + (f"; {extras}" if extras else "")
