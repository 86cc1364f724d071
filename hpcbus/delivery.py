"""A consumer worker's `[delivery]` table (`RunnerSettings`): how it pulls from its durable, batches and
reports; the runner (`hpcbus.runner`) runs on it, each consumer command names it with its own durable
(`delivery_section`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from hpcbus.keys import STATS_SECONDS, StatsSeconds
from hpcbus.options import Section

__all__ = ["PEERS_ELSEWHERE", "DurableName", "RunnerSettings", "delivery_section"]

DurableName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
"""A durable consumer's name as nats-server takes it in an API subject: letters, digits, `-`, `_` (no `.`,
`*`, `>` or space, which would change the subject), at most 128 characters."""

PEERS_ELSEWHERE = "Not used by this command (the table is shared with `consume influx`, whose second worker group it names)."
"""The settings note of `peers` for a command that shares `[delivery]` but has no peer groups."""


class RunnerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: Literal["jetstream", "core"] = "jetstream"
    """`jetstream` (durable, at-least-once) or `core` (plain subscription, at-most-once)."""
    durable: str = ""
    """Durable consumer name; workers with the same name share the work."""
    peers: list[DurableName] = msgspec.field(default_factory=list)
    """Durables of other worker groups that read the same subjects for a copy of their own (a second
    `consume influx` writing a second InfluxDB, docs/scaling.md "Two InfluxDBs"): each worker creates
    those still missing, with its own subjects, when it binds its durable, so whichever group starts first,
    a stream with `stream_discard = "new"` keeps every message until each group has it. A peer is only ever
    created, never changed: one that exists is left as its own workers set it. Best effort: a peer that
    cannot be created is warned about and never keeps this group from its own durable. `consume influx`
    alone uses it (`consume jobs` and `consume sonar` share the table and ignore it)."""
    fetch_batch: int = 200
    """Messages asked for per pull."""
    ack_wait: float = 30.0
    """Seconds JetStream waits for an ack before redelivering: how long a killed worker's messages wait
    before another worker gets them. A worker that is slow but alive extends it with `+WPI`."""
    max_ack_pending: int = 1000
    """Unacked messages allowed across all workers of the durable."""
    in_flight: int = 3
    """Batches being delivered at once while the next one fills (InfluxDB works on one while it receives
    the next); memory holds at most `in_flight + 1` batches, and a slow sink stops the fetching."""
    flush_lines: int = 5000
    """Deliver when this many items are waiting ..."""
    flush_seconds: float = 1.0
    """... or when the oldest waiting item is this old."""
    stats_seconds: StatsSeconds = STATS_SECONDS


def delivery_section(
    durable: str,
    table: str = "delivery",
    *,
    notes: dict[str, str] | None = None,
    defaults: dict[str, object] | None = None,
) -> Section[RunnerSettings]:
    """The `[delivery]` table of a consumer command (its `RunnerSettings`), with the command's own durable
    name as the default (and `defaults`, for a command that changes others); `table` for a command whose
    table has another name (shown as "delivery")."""
    return Section(
        table,
        RunnerSettings,
        title="delivery",
        defaults={"durable": durable, **(defaults or {})},
        metavars={"durable": "NAME", "ack_wait": "S", "flush_seconds": "S"},
        notes=notes or {},
    )
