"""A producer as one side of an active/standby pair (`[slurm] state = "jetstream"`, `[ocs] state = ...`): the
source polls only while this process holds its role's lease (`hpcbus.lease`), and its state lives in fenced
entries of the cluster's roles bucket, where the standby that takes over finds it.

**Written ahead, with the messages.** A producer's state says what it has sent (the fields per Slurm job,
the accounting file offset). Kept in a local file it is saved after JetStream acknowledged a poll, and a
crash in between costs a re-send that the stream's duplicate window drops, because the restarted process
re-cuts the same messages. A standby cannot re-cut them: it polls later (another sacct window, another
envelope time), so its messages differ from what the dead holder had in flight. So here a poll's messages
are written, together with the state entries that changed, in one fenced atomic batch *before* they are
published (`out.<n>` entries), and removed once JetStream has acknowledged them. The standby that takes
over publishes the `out` entries it finds first, byte for byte with their `Nats-Msg-Id`: what the old
holder had stored already is dropped by the stream's duplicate window (`duplicate_window`, 120 s: a
takeover takes the lease TTL plus a few seconds), what it had not is stored now. Then it polls from the
state those entries came with, so nothing is sent twice and nothing is lost. (Subjects published with core
NATS, cc-backend's own `[ccbackend]` subjects, have no duplicate window: cc-backend may see a start_job or
stop_job twice at a takeover, which it ignores for a job it knows.)

**Incremental.** The source gives its whole state as entries (key -> bytes, one per job, one for the rest);
only the entries whose bytes changed since the last write are written, and those gone are removed. A batch
of up to `hpcbus.lease.BATCH` writes is atomic; a larger poll (the first one after a long outage) is written
in several, the messages first, so a crash between them costs re-sent records, never lost ones.

Every write is fenced by the lease: a holder that lost its role (paused past the TTL, cut off) writes
nothing, and drops what it had queued instead of publishing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from hpcbus.bus import DEFAULT_MAX_PAYLOAD
from hpcbus.lease import FencedStore, Lease, NotHeld, hold
from hpcbus.outbox import OutboxSettings
from hpcbus.permanent import Transient
from hpcbus.retry import Stopped, Stopping, Trouble, describe, retry
from hpcbus.schemas.message import Message
from hpcbus.service import STOP_GRACE, Service
from hpcbus.settings import BusSettings
from hpcbus.sinks import UNREACHABLE
from hpcbus.sources import Backlog, Poll, Source, SourceLoop, Telemetry, follow, serve
from hpcbus.streams import StreamSpec, auto_replicas, roles_bucket, server_info

__all__ = ["OUT", "HeldSource", "serve_held", "serve_source"]

log = logging.getLogger("hpcbus.sources")

OUT = "out."
"""Key prefix (under `state.<role>.`) of a poll's messages, written before they are published."""

ENTRY_HEADROOM = 4096
"""Bytes of an entry's message left for its subject and headers (the batch and fence headers)."""

_message = msgspec.msgpack.Decoder(Message)
_encode = msgspec.msgpack.Encoder().encode


class HeldSource(Source, Protocol):
    """A `hpcbus.sources.Source` whose state can be given as entries and taken back from them."""

    def entries(self) -> dict[str, bytes]:
        """The whole state as entries (key -> bytes; keys never start with `OUT`), as it is now."""
        ...

    def restore(self, found: dict[str, bytes]) -> None:
        """Replace the state by the one `found` holds (empty: none saved yet, start as a fresh install)."""
        ...


class Fenced:
    """The source as its holder polls it: each poll's messages and changed entries written before they go
    out, and the messages' entries removed once acknowledged (see the module docstring)."""

    def __init__(self, source: HeldSource, store: FencedStore, found: dict[str, bytes]) -> None:
        self.source = source
        self.name = source.name
        self.max_pending = source.max_pending
        self.wake = source.wake
        self.store = store
        self.saved = {k: v for k, v in found.items() if not k.startswith(OUT)}
        self.redo = sorted(k for k in found if k.startswith(OUT))
        self.found = found
        self.counter = max((int(k[len(OUT) :]) for k in self.redo), default=0)
        self.acked: list[str] = []
        """`out` entries whose messages are acknowledged, to remove."""
        self.unsaved: tuple[list[tuple[str, bytes]], list[str], Poll] | None = None
        """A poll whose write failed: written again before anything else (its state is in memory already)."""

    def due_in(self) -> float:
        return 0.0 if self.redo or self.acked or self.unsaved else self.source.due_in()

    async def attach(self, nc: NATS) -> None:
        await self.source.attach(nc)

    def close(self, unsent: int, kept: bool) -> None:
        self.source.close(unsent, kept)

    def _acked(self, keys: list[str], commit: Callable[[], None] | None) -> Callable[[], None]:
        def done() -> None:
            self.acked.extend(keys)
            if commit is not None:
                commit()
            self.wake.set()

        return done

    async def poll(self, backlog: Backlog) -> Poll:
        if self.redo:  # the previous holder's messages, first and as they were
            keys, self.redo = self.redo, []
            messages = [_message.decode(self.found[k]) for k in keys]
            log.info("%s: publishing the %d messages the previous holder had written", self.name, len(keys))
            return Poll(messages, commit=self._acked(keys, None))
        if self.unsaved is None:
            removes, self.acked = self.acked, []
            poll = await self.source.poll(backlog) if self.source.due_in() <= 0 else Poll()
            want = self.source.entries()
            puts = []
            keys = []
            limit = int(self.store.lease.nc.max_payload or DEFAULT_MAX_PAYLOAD) - ENTRY_HEADROOM
            for message in poll.messages:
                entry = _encode(message)
                if len(entry) > limit:  # one line beyond the server's limit: the outbox splits or drops it
                    log.warning(
                        "%s: a %d-byte message for %s is not written ahead (max_payload)",
                        self.name,
                        len(entry),
                        message.subject,
                    )
                    continue
                self.counter += 1
                keys.append(f"{OUT}{self.counter:012d}")
                puts.append((keys[-1], entry))
            puts += [(k, v) for k, v in want.items() if self.saved.get(k) != v]
            removes += [k for k in self.saved if k not in want]
            self.unsaved = (puts, removes, Poll(poll.messages, commit=self._acked(keys, poll.commit)))
        puts, removes, poll = self.unsaved
        done: list[str] = []
        try:
            await self.store.apply(puts, removes, done)
        except (NotHeld, NatsError, APIError, TimeoutError, OSError) as exc:
            written = set(done)  # what went through is not written again
            self.unsaved = (
                [p for p in puts if p[0] not in written],
                [r for r in removes if r not in written],
                poll,
            )
            self._note(puts, removes, written)
            raise Transient(
                f"{self.name}: writing the state to {self.store.lease.bucket}: {describe(exc)}"
            ) from exc
        self._note(puts, removes, set(done))
        self.unsaved = None
        return poll

    def _note(self, puts: list[tuple[str, bytes]], removes: list[str], written: set[str]) -> None:
        for key, value in puts:
            if key in written and not key.startswith(OUT):
                self.saved[key] = value
        for key in removes:
            if key in written:
                self.saved.pop(key, None)

    async def flush(self) -> None:
        """At a clean stop: remove the entries of the messages acknowledged since the last poll."""
        removes, self.acked = self.acked, []
        if removes and self.store.lease.held:
            with contextlib.suppress(NotHeld, NatsError, APIError, TimeoutError, OSError):
                await self.store.apply((), removes, [])


async def serve_source(
    bus: BusSettings,
    name: str,
    source: HeldSource,
    outbox: OutboxSettings,
    streams: Sequence[StreamSpec],
    *,
    state: str,
    role: str,
    lease_ttl: int,
    core_subjects: Sequence[str] = (),
    telemetry: Telemetry | None = None,
) -> int:
    """A producer with a `state` setting: `jetstream` runs it as one side of a pair (`serve_held`), `file`
    alone (`hpcbus.sources.serve`)."""
    if state != "jetstream":
        return await serve(
            bus, name, [source], outbox, streams, core_subjects=core_subjects, telemetry=telemetry
        )
    return await serve_held(
        bus,
        name,
        source,
        outbox,
        streams,
        role=role,
        lease_ttl=lease_ttl,
        core_subjects=core_subjects,
        telemetry=telemetry,
    )


async def serve_held(
    bus: BusSettings,
    name: str,
    source: HeldSource,
    outbox: OutboxSettings,
    streams: Sequence[StreamSpec],
    *,
    role: str,
    lease_ttl: int,
    stopping: asyncio.Event | None = None,
    core_subjects: Sequence[str] = (),
    telemetry: Telemetry | None = None,
) -> int:
    """`hpcbus.sources.serve` for one side of a pair: on every connection, stand by until the cluster's
    `role` lease is held, load the state the last holder wrote, publish its unacknowledged messages, then poll
    until the stop (then release the role) or until the role is lost (then drop what is queued and stand by
    again)."""
    if outbox.spill_dir:  # this host's disk would send them again after another took over
        log.warning(
            "%s: spill_dir %s is not used by a pair: the messages wait in the roles bucket",
            name,
            outbox.spill_dir,
        )
        outbox = msgspec.structs.replace(outbox, spill_dir="")
    service = Service(bus, name, streams=streams, stopping=Stopping(STOP_GRACE))
    bridge = None if stopping is None else asyncio.create_task(follow(stopping, service.stopping))

    async def body(nc: NATS) -> None:
        replicas = bus.stream_replicas or auto_replicas(server_info(nc))
        lease = Lease(nc, roles_bucket(bus.cluster), role, ttl=lease_ttl, replicas=replicas)

        async def act() -> bool:
            return await _hold(nc, lease, source, outbox, service.stopping, core_subjects, streams, telemetry)

        await hold(lease, service.stopping, act)

    try:
        return await service.run(body, signals=stopping is None)
    finally:
        if bridge is not None:
            bridge.cancel()


async def _hold(
    nc: NATS,
    lease: Lease,
    source: HeldSource,
    outbox: OutboxSettings,
    stopping: Stopping,
    core_subjects: Sequence[str],
    streams: Sequence[StreamSpec],
    telemetry: Telemetry | None,
) -> bool:
    """Poll while the role is held; True at the stop (or when the connection went), False when it was lost."""
    store = FencedStore(lease)

    async def load() -> dict[str, bytes]:
        if not lease.held:
            raise Stopped("the role was lost while the state was loaded")
        return await store.load()

    try:
        found = await retry(
            load,
            trouble=Trouble(log, f"{lease.role}: loading the state"),
            stopping=stopping,
            base=1.0,
            cap=5.0,
            retry_on=UNREACHABLE,
        )
    except Stopped:
        return stopping.is_set()
    source.restore({k: v for k, v in found.items() if not k.startswith(OUT)})
    fenced = Fenced(source, store, found)
    term = Stopping(stopping.grace)
    bridge = asyncio.create_task(follow(stopping, term))
    loop = SourceLoop(
        [fenced], outbox, term, core_subjects=core_subjects, streams=streams, telemetry=telemetry
    )
    loop.start()
    work = asyncio.create_task(loop.publish(nc))
    lost = asyncio.ensure_future(lease.lost.wait())
    try:
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            await loop.finish()
            await fenced.flush()
            return True
        log.warning("%s: the role was lost; dropping what this process had queued, standing by", lease.role)
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        await loop.drop()
        return False
    finally:
        lost.cancel()
        bridge.cancel()
