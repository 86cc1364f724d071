"""The sink contract: what a consumer worker's sink is to the runner (`hpcbus.runner`), the mirror of
`hpcbus.sources.Source` on the producer side.

A sink takes messages (`take`, raising `BadInput` for what it refuses), cuts a batch (`cut`) and delivers
it (`deliver`: returns, or raises an outcome of `hpcbus.permanent`); it counts its extras and never retries,
acknowledges or dead-letters: the runner does (`tests/test_sink_compliance.py` reads the sink modules). A
sink that merges messages (`holds_input`) hands each back through `settle` (`Settled`), with the merged
output it rejected (`DeadLetter`). `Role` is the gate the runner fetches and acknowledges behind
(`AlwaysHeld` by default; an active/standby lease is such a role).
"""

from __future__ import annotations

from typing import Protocol

import msgspec
from nats.aio.msg import Msg

from hpcbus.counters import Counters
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.schemas.problems import Problem

__all__ = ["AlwaysHeld", "BadInput", "DeadLetter", "Role", "Settled", "Sink", "SinkBase", "held_key"]


class BadInput(Exception):
    """Raised by a sink's `take` for a message it refuses wholly or in part: the good part stays in the batch
    (`items` of it), and the runner reports the `problems` and dead-letters the message once its batch is
    delivered (`dead_letter`), then acknowledges it with the batch. `count`: the items refused (default:
    the problems of severity error)."""

    def __init__(self, problems: list[Problem], items: int = 0, count: int | None = None) -> None:
        super().__init__(f"{len(problems)} problems")
        self.problems = problems
        self.items = items
        self.count = sum(1 for p in problems if p.severity == "error") if count is None else count


class DeadLetter(msgspec.Struct):
    """Merged output a sink rejects (an assembled envelope that is invalid, too large, or that no stream
    takes), with its problems: the runner stores it before it acknowledges what was settled with it."""

    subject: str
    payload: bytes
    problems: list[Problem]
    dedup_id: str
    reported: bool = False
    """Its problems are on the log subject (its dead letter may still be pending)."""


class Settled(msgspec.Struct):
    """What a sink that holds its input (`Sink.holds_input`: it merges messages, as the Sonar envelope
    assembler does) hands back to the runner (`Sink.settle`): each held message by its key (`held_key`),
    delivered (`done`: its merged output is out) or handed back unacknowledged at the stop (`returned`,
    `-NAK`), and the merged output it rejected (`dead`)."""

    done: list[str] = msgspec.field(default_factory=list)
    dead: list[DeadLetter] = msgspec.field(default_factory=list)
    returned: list[str] = msgspec.field(default_factory=list)
    reports: list[Problem] = msgspec.field(default_factory=list)
    """Problems of the merged output that was delivered (warnings, records left out): said on the log
    subject and the Python log by the runner."""


def held_key(msg: Msg) -> str:
    """How a sink names a message it holds: its JetStream reply subject, unique per delivery ("" in core
    mode, where nothing is acknowledged: such a message counts as delivered with its batch)."""
    return msg.reply or ""


class Role(Protocol):
    """Whether this process may fetch and acknowledge now (an active/standby lease): the runner pauses both
    while `held` is False and goes on once `taken` returns."""

    @property
    def held(self) -> bool: ...

    async def taken(self) -> None:
        """Return once the role is held."""
        ...


class AlwaysHeld:
    """The default role: always held (a process without a standby)."""

    held = True

    async def taken(self) -> None:
        """Held already."""


class Sink(Protocol):
    """What a worker does with messages.

    `take` adds a message to the batch being filled and returns how many items it added (or raises
    `BadInput` for a message it refuses, wholly or in part); `cut` seals that batch and starts a new one;
    `deliver` delivers a sealed batch: it returns when the batch is delivered, or raises; what it raised
    means what `hpcbus.permanent.outcome` says (transient: the runner calls `deliver` again with the same
    batch, so a sink keeps its progress in the batch; too large; partial; permanent). A sink never retries,
    never acknowledges and never dead-letters: the runner does, and counts it.

    The counting, the summary, the self-telemetry and the dead letters are the runtime's: a sink counts only
    its extras (a subclass of `Counters`). The optional rest of the life of a sink (`SinkBase`): `start` on
    every connection, `tick` every `tick_seconds` while it runs, `close` when the process stops (both retried
    by the runtime like `deliver`).
    """

    @property
    def outlet(self) -> Outlet:
        """Where the sink's dead letters and self-telemetry go."""
        ...

    @property
    def counters(self) -> Counters:
        """Its counters: `Counters` or a subclass with its extras (the runner counts the standard ones)."""
        ...

    @property
    def tick_seconds(self) -> float: ...

    @property
    def what(self) -> str:
        """What a delivery is, for the trouble lines ("InfluxDB write", "publish")."""
        ...

    @property
    def retry_cap(self) -> float:
        """The longest wait between two retries (a server's Retry-After may ask more)."""
        ...

    @property
    def holds_input(self) -> bool:
        """True: a delivered batch's messages wait until `settle` hands them back (see `Settled`)."""
        ...

    def settle(self) -> Settled:
        """What the sink holds that is now settled (a sink that does not hold its input: nothing)."""
        ...

    def take(self, msg: Msg) -> int: ...

    def cut(self) -> object: ...

    async def deliver(self, batch: object, stopping: Stopping) -> None: ...

    async def start(self, stopping: Stopping) -> None: ...

    async def tick(self, stopping: Stopping) -> None: ...

    async def close(self, stopping: Stopping) -> None: ...

    def holding(self) -> int: ...

    def gauges(self) -> None: ...


class SinkBase:
    """What a sink need not do: no ticker, nothing at start or stop, no input held past its delivery."""

    tick_seconds = 0.0
    """> 0: `tick` runs this often while the sink runs (`hpcbus.sinks`)."""
    what = "delivery"
    retry_cap = 5.0
    holds_input = False
    """True: a delivered batch's messages are held by the runner until `settle` says (`ToSonarSink`)."""

    def settle(self) -> Settled:
        """Nothing held, nothing to settle."""
        return Settled()

    async def start(self, stopping: Stopping) -> None:
        """On every new connection, before the first message (state to save, a database to create)."""

    async def tick(self, stopping: Stopping) -> None:
        """Time-driven work (closing jobs, flushing the grace window) while no message arrives; raises as
        `deliver` does."""

    async def close(self, stopping: Stopping) -> None:
        """The clean stop, after the last delivery (not when the connection was lost: what the sink held is
        redelivered); raises as `deliver` does."""

    def holding(self) -> int:
        """Messages the sink holds unacknowledged past their delivery, not counted by the runner."""
        return 0

    def gauges(self) -> None:
        """Bring gauge extras up to date before a report."""
