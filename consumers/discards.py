"""Which stream sequences were already reported as discarded unread, shared by every worker of a durable.

Workers bound to one durable all see the same discard (the stream's first sequence past the durable's last
delivered one); counted by each, a loss of 238 messages read as 476. The reported ranges therefore live in a
JetStream key-value entry (bucket `<stream>_discards`, key: the durable) that every worker updates with
compare-and-set on its revision: of two workers claiming the same range, exactly one gets it. The entry
also holds the latest runs of deliveries of each worker (consecutive consumer sequences), so that a discard
between one worker's delivery and the next worker's is found (`between_runs`). Where the
bucket cannot be used (an identity without its permissions, a server without JetStream KV) the ranges are
kept in this process only, said once as a WARNING: each worker of the durable then counts a shared discard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from hpcbus.bus import discards_bucket

log = logging.getLogger("hpcbus.runner")

KEPT_RANGES = 32
"""Ranges kept per durable: a discard is reported within seconds, so only the latest can be claimed again."""

Range = tuple[int, int]


def subtract(ranges: list[Range], lo: int, hi: int) -> list[Range]:
    """The parts of `lo..hi` (inclusive) that no range of `ranges` (sorted, disjoint) covers."""
    out: list[Range] = []
    at = lo
    for a, b in ranges:
        if b < at:
            continue
        if a > hi:
            break
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
        if at > hi:
            return out
    if at <= hi:
        out.append((at, hi))
    return out


def merge(ranges: list[Range], new: list[Range]) -> list[Range]:
    """`ranges` with `new` added, sorted, adjacent ones joined, only the latest `KEPT_RANGES`."""
    out: list[Range] = []
    for a, b in sorted([*ranges, *new]):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out[-KEPT_RANGES:]


Run = tuple[int, int, int, int]
"""Deliveries of consecutive consumer sequences, all new (not redeliveries), to one worker: (first consumer
sequence, its stream sequence, last consumer sequence, its stream sequence)."""

KEPT_RUNS = 64
"""Runs kept per durable: enough for the fetches of every worker over the last seconds."""


class State(msgspec.Struct, forbid_unknown_fields=True):
    """The shared entry: ranges reported, and the latest runs of deliveries of the durable's workers."""

    ranges: list[Range] = msgspec.field(default_factory=list)
    runs: list[Run] = msgspec.field(default_factory=list)


def between_runs(runs: list[Run], new: Run) -> list[Range]:
    """Stream sequences skipped between `new` and a run of another worker next to it in consumer sequence:
    no delivery came between the two, so the sequences between their stream sequences were never
    delivered to this durable (the durable reads every subject)."""
    gaps: list[Range] = []
    c1, s1, c2, s2 = new
    for p1, q1, p2, q2 in runs:
        if p2 + 1 == c1 and s1 > q2 + 1:
            gaps.append((q2 + 1, s1 - 1))
        if c2 + 1 == p1 and q1 > s2 + 1:
            gaps.append((s2 + 1, q1 - 1))
    return gaps


class Ledger:
    """The ranges of stream `stream` reported for durable `durable` (see the module docstring)."""

    def __init__(self, js: JetStreamContext, stream: str, durable: str, replicas: int = 1) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.replicas = replicas
        self._kv: KeyValue | None = None
        self._local = State()
        self._shared = True

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            name = discards_bucket(self.stream)
            try:
                self._kv = await self.js.key_value(name)
            except BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=name, history=1, replicas=self.replicas, storage=StorageType.FILE
                )
                try:
                    self._kv = await self.js.create_key_value(config)
                except Exception:  # another worker created it meanwhile (with other settings)
                    self._kv = await self.js.key_value(name)
        return self._kv

    async def claim(self, lo: int, hi: int, last_seq: int | None = None) -> list[Range]:
        """Mark `lo..hi` as reported and return the parts no worker of the durable had reported before.
        `last_seq`: the stream's last sequence now; a kept range beyond it means the stream was recreated
        (its sequences restarted), and what was kept is dropped."""
        return await self._change(lambda state: claim_ranges(state, [(lo, hi)], last_seq))

    async def follow(self, runs: list[Run]) -> list[Range]:
        """Record this worker's `runs` of deliveries; return the sequences skipped between them and the
        runs of the durable's other workers next to them, not reported before (they are marked reported)."""

        def change(state: State) -> tuple[State, list[Range]]:
            gaps: list[Range] = []
            for run in runs:
                gaps += between_runs(state.runs, run)
            state = State(state.ranges, sorted([*state.runs, *runs])[-KEPT_RUNS:])
            return claim_ranges(state, gaps, None)

        return await self._change(change, always=True)

    async def _change(
        self, change: Callable[[State], tuple[State, list[Range]]], *, always: bool = False
    ) -> list[Range]:
        if self._shared:
            try:
                return await self._change_shared(change, always)
            except Exception as exc:
                self._shared = False
                log.warning(
                    "stream %s, durable %s: the key-value bucket %s that lets workers of one durable report a "
                    "discard once cannot be used (%s); this worker keeps its own record, so each worker of "
                    "the durable counts a discard they share",
                    self.stream,
                    self.durable,
                    discards_bucket(self.stream),
                    exc,
                )
        self._local, new = change(self._local)
        return new

    async def _change_shared(
        self, change: Callable[[State], tuple[State, list[Range]]], always: bool
    ) -> list[Range]:
        kv = await self._bucket()
        for _ in range(50):
            try:
                entry = await kv.get(self.durable)
                revision = entry.revision or 0
                try:
                    state = msgspec.json.decode(entry.value or b"{}", type=State)
                except msgspec.DecodeError:  # written by another version: start afresh
                    state = State()
            except KeyDeletedError as exc:
                state, revision = State(), exc.entry.revision if exc.entry else 0
            except KeyNotFoundError:
                state, revision = State(), 0
            state, new = change(state)
            if not new and not always:
                return []
            try:
                await kv.update(self.durable, msgspec.json.encode(state), last=revision)
            except KeyWrongLastSequenceError:
                continue  # another worker changed it meanwhile: read again
            return new
        raise RuntimeError("the entry kept changing under 50 attempts")


def claim_ranges(state: State, claims: list[Range], last_seq: int | None) -> tuple[State, list[Range]]:
    """`state` with `claims` marked reported, and the parts of them not reported before. A kept range past
    `last_seq` (the stream's last sequence now) means the stream was recreated: what was kept is dropped."""
    ranges = state.ranges
    if last_seq is not None and ranges and ranges[-1][1] > last_seq:
        ranges, state = [], State()
    new: list[Range] = []
    for lo, hi in claims:
        fresh = subtract(ranges, lo, hi)
        ranges = merge(ranges, fresh)
        new += fresh
    return State(ranges, state.runs), new
