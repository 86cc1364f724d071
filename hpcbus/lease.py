"""Active/standby roles on JetStream: a lease that says which process of a pair acts, and state that only
the lease's holder can write.

**The lease** (`Lease`) is one key-value entry, `lease.<role>` in the cluster's roles bucket
(`hpcbus.streams.roles_bucket`), created with a per-message TTL (NATS 2.11 `Nats-TTL`; the bucket allows
it) by whoever finds the key gone (`kv.create`: the server lets one creator win). The holder renews it every
`ttl / RENEWALS` seconds by compare-and-set on its revision (`Nats-Expected-Last-Subject-Sequence`), each
renewal a new message with the TTL again (nats-py's `kv.update` sends no TTL, and an entry without one would
never expire: the renewal is published here with both headers). A standby polls the key and creates it once
the server has removed the expired entry (or the holder released it at a clean stop), so a takeover takes
at most `ttl` plus one poll after the holder's last renewal.

**The holder stops before its lease can have expired.** `held` is False from `ttl - margin` seconds after
the send time of the last renewal that worked, on this process' monotonic clock: the server starts the TTL
when it stores the renewal, which is later, so while `held` is True no standby can hold the role. A
process paused (SIGSTOP, a VM frozen, a long GC) finds `held` False when it resumes, before it has done
anything; `lost` is set then, and its owner stops acting (`hpcbus.sinks.run_held` drops the work and
stands by again).

**Fenced state** (`FencedStore`): every write of the holder's state is a message in the same bucket with
`Nats-Expected-Last-Subject-Sequence-Subject: $KV.<bucket>.lease.<role>` and the lease's revision, so the
server stores it only while the lease entry is still the one this holder wrote. A holder that was paused
past its TTL, or cut off while a standby took over, can never overwrite the new holder's state: its write
is refused with "wrong last sequence" (JetStream error 10071). A renewal of its own that lands between two
writes changes the revision too: such a write is sent again with the new one.

No consensus of our own: the server's compare-and-set on one key picks the holder, and its per-subject
sequence check fences the writes. `hpcbus status` reads the lease entries (who holds which role, since
when) with the `monitor` identity (`deploy nats-auth`).

How a pair uses it (`hold` runs the lease and acts each time the role is taken): `consume jobs` with
`[jobs] state = "jetstream"` (consumers/jobs/kvstate.py, `hpcbus.sinks.run_held`), and `produce slurm` and
`produce ocs` with `state = "jetstream"` (`hpcbus.heldsources`: the state and each poll's messages written
ahead as fenced entries, published only while `held`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import APIError, BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hpcbus.retry import Stopping, Trouble, describe

log = logging.getLogger("hpcbus.lease")

__all__ = [
    "DEFAULT_TTL",
    "FencedStore",
    "Holder",
    "Lease",
    "NotHeld",
    "hold",
    "key_token",
    "lease_key",
    "open_bucket",
    "read_entries",
    "read_holders",
    "standby_key",
]

DEFAULT_TTL = 15
"""Seconds a lease lives without a renewal (a whole number: `Nats-TTL` takes seconds)."""

RENEWALS = 5
"""Renewals per TTL: a renewal every `ttl / 5` s, so several may fail before the holder lets go."""

MARGIN = 1 / 3
"""Part of the TTL the holder gives up early: it stops acting `ttl * (1 - MARGIN)` s after its last
renewal's send time (10 s of a 15 s lease), well before the server can expire the entry."""

POLLS = 5
"""Looks per TTL a standby takes at the lease (every `ttl / 5` s)."""

WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
"""JetStream's "wrong last sequence": a compare-and-set or a fence that did not hold."""

MARKER_TTL = 3600
"""Seconds a delete marker (`KV-Operation: PURGE`) of a state entry or a released lease is kept: long enough
for a watcher to see it, then gone, so removed entries leave nothing behind."""

LEASE_HEADER = "Hpcbus-Lease"
"""On every state entry: the lease revision its writer held (which holder wrote it, for `nats kv` readers and
the fault suite)."""

BATCH = 500
"""Fenced writes per atomic batch (ADR-50, nats-server 2.12: at most 1,000): the fence is checked once, at the
commit, for all of them, and they are stored all or none."""


class NotHeld(Exception):
    """A fenced write was refused: this process does not hold the role (any more)."""


class Holder(msgspec.Struct, kw_only=True):
    """What a lease entry says (JSON): who holds the role, since when (epoch s), its TTL."""

    holder: str
    since: float
    ttl: int
    renewed: float = 0.0


def key_token(text: str) -> str:
    """`text` as one key-value key token (URL-safe base64, no padding): job keys hold tabs and `@`."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def token_text(token: str) -> str:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()


def lease_key(role: str) -> str:
    return f"lease.{role}"


def standby_key(role: str) -> str:
    return f"standby.{role}"


def default_holder() -> str:
    """This process, as the lease entry names it: `<host>:<pid>`."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def open_bucket(js: JetStreamContext, bucket: str, replicas: int) -> KeyValue:
    """The roles bucket, created when missing: one value per key (history 1), per-message TTLs allowed (nats-py
    sets `allow_msg_ttl`), atomic batches allowed (`allow_atomic`: the fenced writes), direct gets (so a read
    names its key in the API subject and permissions can allow reading the leases alone), `replicas` copies
    (the streams' replicas: it must survive what they survive)."""
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        config = KeyValueConfig(
            bucket=bucket, history=1, replicas=replicas, storage=StorageType.FILE, direct=True
        )
        try:
            kv = await js.create_key_value(config)
        except APIError:  # created by the other process of the pair meanwhile
            kv = await js.key_value(bucket)
    info = await js.stream_info(f"KV_{bucket}")
    if not info.config.allow_atomic:
        info.config.allow_atomic = True
        await js.update_stream(info.config)
    return kv


class Lease:
    """One role held through a key-value entry with a TTL (see the module docstring); a `hpcbus.contract.Role`.

    `keep(stopping)` runs the lease: it stands by until it can take the role, then renews it, and when a
    renewal has not worked for `ttl - margin` seconds (or another process holds the entry) it sets `lost`
    and stands by again; at the stop it releases a role it holds (`release`)."""

    def __init__(
        self,
        nc: NATS,
        bucket: str,
        role: str,
        *,
        ttl: int = DEFAULT_TTL,
        replicas: int = 1,
        holder: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 1:
            raise ValueError("a lease's TTL is at least 1 s")
        self.nc = nc
        self.js = nc.jetstream()
        self.bucket = bucket
        self.role = role
        self.key = lease_key(role)
        self.subject = f"$KV.{bucket}.{self.key}"
        self.ttl = ttl
        self.replicas = replicas
        self.holder = holder or default_holder()
        self.clock = clock
        self.revision = 0
        """The lease entry's revision while held (0: not held): what fenced writes expect."""
        self.since = 0.0
        """Epoch seconds the role was taken (0: not held)."""
        self._good_until = 0.0
        self._taken = asyncio.Event()
        self.lock = asyncio.Lock()
        """Held by a renewal and by each fenced batch: a clustered stream refuses a message whose expectation
        names a subject that another message in flight also names ("wrong last sequence" although nothing
        changed), so the holder's renewals and writes go one at a time."""
        self.lost = asyncio.Event()
        """Set when a held role is lost (cleared when it is taken again)."""
        self.kv: KeyValue | None = None
        self.trouble = Trouble(log, f"lease {role} in {bucket}")
        self.other = ""
        """Who else holds it, as last seen (for the log and the standby's wait)."""
        self.standby_since = 0.0

    # -- Role ------------------------------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        """True while the role is ours and cannot have expired: before `ttl - margin` s after the send time
        of the last renewal that worked."""
        return self.revision > 0 and self.clock() < self._good_until

    async def taken(self) -> None:
        """Return once the role is held."""
        while not self.held:
            self._taken.clear()
            await self._taken.wait()

    # -- the loop ----------------------------------------------------------------------------------------------
    @property
    def renew_every(self) -> float:
        return self.ttl / RENEWALS

    @property
    def hold_for(self) -> float:
        """Seconds after a renewal's send time this holder acts on it."""
        return self.ttl * (1 - MARGIN)

    def _value(self) -> bytes:
        return msgspec.json.encode(
            Holder(holder=self.holder, since=self.since, ttl=self.ttl, renewed=time.time())
        )

    async def keep(self, stopping: Stopping) -> None:
        """Take the role when it is free and keep it until `stopping`. A role held then stays held until
        its deadline (longer than any stop takes): the owner releases it (`release`) once its last state is
        written, so the standby never starts from a state still being written."""
        while not stopping.is_set():
            if self.revision:
                await self._renew(stopping)
            else:
                await self._try_take(stopping)

    async def _bucket(self) -> KeyValue:
        if self.kv is None:
            self.kv = await open_bucket(self.js, self.bucket, self.replicas)
        return self.kv

    async def _try_take(self, stopping: Stopping) -> None:
        try:
            kv = await self._bucket()
            sent = self.clock()
            self.since = time.time()
            revision = await asyncio.wait_for(
                kv.create(self.key, self._value(), msg_ttl=self.ttl), self.renew_every
            )
        except KeyWrongLastSequenceError:
            self.since = 0.0
            self.trouble.ok()
            await self._note_other()
            await self._standing_by()
            await stopping.sleep(self.ttl / POLLS)
            return
        except (NatsError, APIError, TimeoutError, OSError) as exc:
            self.since = 0.0
            self.trouble.failed(exc)
            await stopping.sleep(self.ttl / POLLS)
            return
        self.trouble.ok()
        self._good_until = sent + self.hold_for
        self.revision = revision
        self.lost.clear()
        self._taken.set()
        log.info("%s: this process (%s) holds the role now (revision %d)", self.role, self.holder, revision)

    async def _standing_by(self) -> None:
        """Say that this process stands by (`standby.<role>`, with the lease's TTL: gone when the standby
        is), so `hpcbus status` shows that the pair has a second half ready."""
        if not self.standby_since:
            self.standby_since = time.time()
        value = msgspec.json.encode(
            Holder(holder=self.holder, since=self.standby_since, ttl=self.ttl, renewed=time.time())
        )
        try:
            await self.js.publish(f"$KV.{self.bucket}.{standby_key(self.role)}", value, msg_ttl=self.ttl)
        except (NatsError, APIError, TimeoutError, OSError) as exc:  # said by the next look, or not at all
            log.debug("%s: standby entry not written: %s", self.role, exc)

    async def _note_other(self) -> None:
        """Log once who holds the role while we stand by."""
        kv = await self._bucket()
        try:
            entry = await kv.get(self.key)
            other = msgspec.json.decode(entry.value or b"{}", type=Holder).holder
        except (KeyNotFoundError, msgspec.DecodeError, NatsError, APIError, TimeoutError):
            return
        if other != self.other:
            self.other = other
            log.info("%s: held by %s; standing by", self.role, other)

    async def _renew(self, stopping: Stopping) -> None:
        """Wait for the next renewal, renew; retried until the role would expire, then lost."""
        wait = self.renew_every
        while not stopping.is_set():
            if await stopping.sleep(min(wait, max(0.0, self._good_until - self.clock()))):
                return
            if not self.held:
                self._lose(f"no renewal worked for {self.hold_for:.1f} s")
                return
            try:
                async with self.lock:  # never beside a fenced write: see `lock`
                    sent = self.clock()
                    headers = {"Nats-Expected-Last-Subject-Sequence": str(self.revision)}
                    ack = await self.js.publish(
                        self.subject,
                        self._value(),
                        headers=headers,
                        msg_ttl=self.ttl,
                        timeout=max(0.1, min(self.renew_every, self._good_until - sent)),
                    )
            except APIError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE:
                    self._lose(f"the lease entry changed under it ({exc.description})")
                    return
                self.trouble.failed(exc)
                wait = 0.5
                continue
            except (NatsError, TimeoutError, OSError) as exc:
                self.trouble.failed(exc)
                wait = 0.5
                continue
            if self.clock() >= self._good_until:  # paused past the deadline while the renewal was out
                self._lose("paused past its deadline while renewing")
                return
            self.trouble.ok()
            self.revision = ack.seq
            self._good_until = sent + self.hold_for
            wait = self.renew_every

    def _lose(self, why: str) -> None:
        log.warning(
            "%s: this process (%s) no longer holds the role: %s; standing by", self.role, self.holder, why
        )
        self.revision = 0
        self.since = 0.0
        self.lost.set()

    async def release(self) -> None:
        """Give the role up at once (a clean stop): the lease entry is removed if it is still ours, so the
        standby takes over at its next look instead of after the TTL."""
        revision, self.revision = self.revision, 0
        self.since = 0.0
        if not revision:
            return
        headers = {
            "Nats-Expected-Last-Subject-Sequence": str(revision),
            "KV-Operation": "PURGE",
            "Nats-Rollup": "sub",
        }
        try:
            await self.js.publish(self.subject, b"", headers=headers, msg_ttl=MARKER_TTL, timeout=1.0)
            log.info("%s: released", self.role)
        except (NatsError, APIError, TimeoutError, OSError) as exc:
            log.info(
                "%s: not released (%s); the standby takes over when it expires", self.role, describe(exc)
            )


async def hold(lease: Lease, stopping: Stopping, act: Callable[[], Awaitable[bool]]) -> None:
    """Keep `lease` until `stopping`; each time the role is taken, `act()`, which returns when it is done
    (True: stop here, the stop or a lost connection) or when the role was lost (False: stand by again). At
    the end a role still held is released: the holder's last state is written by then, so the standby may
    start from it at once."""
    keeper = asyncio.create_task(lease.keep(stopping), name=f"lease {lease.role}")
    try:
        while not stopping.is_set() and not keeper.done():
            waits = {asyncio.ensure_future(lease.taken()), asyncio.ensure_future(stopping.wait())}
            await asyncio.wait({*waits, keeper}, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()
            if stopping.is_set() or keeper.done() or not lease.held:
                continue
            if await act():
                break
    finally:
        if not keeper.done():
            keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await keeper
        if lease.held:
            await lease.release()


class FencedStore:
    """State entries under `state.<role>.` in the lease's bucket that only the lease's holder can write
    (see the module docstring). `put` and `remove` raise `NotHeld` when the fence does not hold; other
    trouble (NATS away, a timeout) raises as nats-py raised it (transient to `hpcbus.permanent`)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.prefix = f"state.{lease.role}."
        self.written_bytes = 0
        self.writes = 0

    def subject(self, key: str) -> str:
        return f"$KV.{self.lease.bucket}.{self.prefix}{key}"

    async def put(self, key: str, value: bytes) -> None:
        done: list[str] = []
        await self.apply([(key, value)], (), done)

    async def remove(self, key: str) -> None:
        """The entry is gone for readers at once; its marker expires after `MARKER_TTL`."""
        done: list[str] = []
        await self.apply((), [key], done)

    async def apply(self, puts: Iterable[tuple[str, bytes]], removes: Iterable[str], done: list[str]) -> None:
        """Write `puts` and remove `removes` in atomic batches of `BATCH`, each fenced by the lease at its
        commit, appending the keys of each stored batch to `done` (so the caller knows them also when a
        later batch fails). `NotHeld` when the fence refused a batch or the role is not held; other trouble
        raises as nats-py raised it."""
        ops = [(k, v, False) for k, v in puts] + [(k, b"", True) for k in removes]
        for start in range(0, len(ops), BATCH):
            chunk = ops[start : start + BATCH]
            await self._batch(chunk)
            done.extend(key for key, _, _ in chunk)

    async def _batch(self, ops: list[tuple[str, bytes, bool]]) -> None:
        lease = self.lease
        nc = lease.nc
        async with lease.lock:
            revision = lease.revision
            if not revision or not lease.held:
                raise NotHeld(f"{lease.role}: the role is not held; state not written")
            batch = uuid.uuid4().hex
            last = len(ops)
            for seq, (key, value, gone) in enumerate(ops, 1):
                headers = {
                    "Nats-Batch-Id": batch,
                    "Nats-Batch-Sequence": str(seq),
                    LEASE_HEADER: str(revision),
                }
                if seq == 1:
                    headers["Nats-Expected-Last-Subject-Sequence"] = str(revision)
                    headers["Nats-Expected-Last-Subject-Sequence-Subject"] = lease.subject
                if gone:
                    headers.update(
                        {"KV-Operation": "PURGE", "Nats-Rollup": "sub", "Nats-TTL": str(MARKER_TTL)}
                    )
                if seq == last:
                    headers["Nats-Batch-Commit"] = "1"
                if seq in (
                    1,
                    last,
                ):  # the first is acknowledged (the batch started), the last with the PubAck
                    reply = await nc.request(self.subject(key), value, headers=headers, timeout=5.0)
                    if reply.data:
                        answer = json.loads(reply.data)
                        error = answer.get("error")
                        if error and error.get("err_code") in WRONG_LAST_SEQUENCE:
                            raise NotHeld(
                                f"{lease.role}: the fence refused the write ({error.get('description')})"
                            )
                        if error:
                            raise APIError.from_error(error)
                else:
                    await nc.publish(self.subject(key), value, headers=headers)
            self.writes += last
            self.written_bytes += sum(len(v) for _, v, _ in ops)

    async def load(self) -> dict[str, bytes]:
        """Every live entry under the role's prefix (key without it -> value), read through an ordered
        consumer (the last message of each key) from the stream's leader: what the last holder wrote before
        it lost the role. Done when the consumer says nothing is pending after the message in hand, or, before
        any message, that it has delivered none and none is pending (nats-py's `kv.watch` decides "nothing
        there" from the messages its callback has seen, which may still be on their way: it then misses
        the whole state)."""
        await self.lease._bucket()
        bucket = self.lease.bucket
        found: dict[str, bytes] = {}
        sub = await self.lease.js.subscribe(
            f"$KV.{bucket}.{self.prefix}>",
            stream=f"KV_{bucket}",
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            inactive_threshold=60.0,
        )
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
                return found
            while True:
                msg = await sub.next_msg(timeout=10.0)
                key = msg.subject.removeprefix(f"$KV.{bucket}.{self.prefix}")
                if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
                    found.pop(key, None)
                else:
                    found[key] = msg.data
                if msg.metadata.num_pending == 0:
                    return found
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def read_holders(js: JetStreamContext, bucket: str, roles: Iterable[str]) -> dict[str, Holder | None]:
    """Who holds each of `roles` (None: nobody), read with direct gets of the lease keys only (what the
    `monitor` identity may read). `BucketNotFoundError` when there is no roles bucket (no pair runs)."""
    return await read_entries(js, bucket, {role: lease_key(role) for role in roles})


async def read_entries(
    js: JetStreamContext, bucket: str, keys: Mapping[str, str]
) -> dict[str, Holder | None]:
    """name -> the `Holder` the bucket's entry `keys[name]` says (None: no such entry): leases
    (`lease_key`) and standbys (`standby_key`)."""
    kv = await js.key_value(bucket)
    out: dict[str, Holder | None] = {}
    for name, key in keys.items():
        try:
            entry = await kv.get(key)
            out[name] = msgspec.json.decode(entry.value or b"{}", type=Holder)
        except (KeyNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
            out[name] = None
    return out
