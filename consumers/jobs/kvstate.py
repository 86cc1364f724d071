"""Where `consume jobs` keeps its running aggregates: a local file (`[jobs] state = "file"`, one worker per
cluster) or, for an active/standby pair (`state = "jetstream"`), entries of the cluster's roles bucket that
only the holder of the `jobs` lease can write (`hpcbus.lease`), so the standby that takes over finds them
even when the active worker's host is gone.

**Incremental.** The whole state of 20,000 open jobs is about 11 MB: more than one NATS message may be, and
rewriting it at every save (each second) would cost tens of MB/s on every replica. So the state is split
into entries, one per piece that changes on its own, and a save writes only the entries whose bytes changed
since the last save that worked (and removes those gone):

| key (under `state.jobs.`) | value (msgpack) | written when |
| --- | --- | --- |
| `meta` | cluster, durable, late lines | a late line came |
| `job.<job>` | the job without its nodes | its record or activity changed |
| `node.<job>.<host>` | the job on one node | the node sent a sample of it |
| `energy.<card>` | a card's recent energy readings | a sample with energy came |
| `closed.<job>` | when it was summarised | once (removed after `remember`) |
| `outbox.<job>` | the summary until sent | once (removed once sent) |

(`<job>`, `<host>`, `<card>`: URL-safe base64 of the state's keys, which hold tabs and `@`.) A running job
costs one `node` write per node and sample, a closing one three writes; docs/jobs.md gives the sizes.

**Consistent after a crash between two writes.** A save is acknowledged (its input acked) only once every
write worked; a crash part-way leaves some entries new and some old, and the input is redelivered and
applied again (the aggregates take a sample's lines by key: a repeat changes nothing). What must not tear
is a closing job: its `closed` and `outbox` entries are written before its `job` and `node` entries are
removed, and a job found both open and closed at load is dropped as closed (its summary is in the outbox).

Every write is fenced by the lease (`FencedStore`): a holder that lost the role writes nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from hpcbus.lease import FencedStore, NotHeld, key_token
from hpcbus.lease import token_text as _text
from hpcbus.permanent import Transient
from hpcbus.retry import describe
from hpcbus.schemas.jobsummary import JobState, Node, State, Summary, encode_state
from hpcbus.settings import SettingsError
from hpcbus.statefile import write_atomically

__all__ = ["FileStore", "KvStore", "StateStore", "decode_entries", "entries"]


class StateStore(Protocol):
    """Where the sink saves its state: `save` raises `Transient` when it could not (the runtime retries)."""

    @property
    def where(self) -> str: ...

    @property
    def size(self) -> int:
        """Bytes of the saved state."""
        ...

    async def save(self, state: State) -> None: ...


class FileStore:
    """The whole state in one file, replaced atomically at each save (`hpcbus.statefile`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0

    @property
    def where(self) -> str:
        return str(self.path)

    async def save(self, state: State) -> None:
        data = encode_state(state)  # before any await: the state as it is now
        try:
            await asyncio.to_thread(write_atomically, self.path, data)
        except OSError as exc:
            raise Transient(f"saving {self.path}: {describe(exc)}") from exc
        self.size = len(data)


class Meta(msgspec.Struct, kw_only=True):
    cluster: str
    durable: str
    late_lines: int = 0


_encode = msgspec.msgpack.Encoder().encode


def entries(state: State) -> dict[str, bytes]:
    """The state as its entries (see the module docstring): key -> value."""
    out = {"meta": _encode(Meta(cluster=state.cluster, durable=state.durable, late_lines=state.late_lines))}
    for key, job in state.jobs.items():
        token = key_token(key)
        nodes, job.nodes = job.nodes, {}
        try:
            out[f"job.{token}"] = _encode(job)
        finally:
            job.nodes = nodes
        for host, node in nodes.items():
            out[f"node.{token}.{key_token(host)}"] = _encode(node)
    for key, readings in state.energy.items():
        out[f"energy.{key_token(key)}"] = _encode(readings)
    for key, at in state.closed.items():
        out[f"closed.{key_token(key)}"] = _encode(at)
    for key, summary in state.outbox.items():
        out[f"outbox.{key_token(key)}"] = _encode(summary)
    return out


def decode_entries(found: dict[str, bytes], cluster: str, durable: str) -> State:
    """The state the entries hold; a job also closed is dropped (a save that stopped between writing its
    summary and removing it), a node without its job too. `SettingsError` when they are another durable's."""
    state = State(cluster=cluster, durable=durable)
    dec = msgspec.msgpack.decode
    meta = found.get("meta")
    if meta is not None:
        owner = dec(meta, type=Meta)
        if (owner.cluster, owner.durable) != (cluster, durable):
            raise SettingsError(
                f"[jobs] state: the jetstream state of cluster {cluster!r} belongs to durable "
                f"{owner.durable!r}, not {durable!r}: one jobs worker pair per cluster"
            )
        state.late_lines = owner.late_lines
    nodes: list[tuple[str, str, bytes]] = []
    for name, value in found.items():
        kind, _, rest = name.partition(".")
        if kind == "job":
            state.jobs[_text(rest)] = dec(value, type=JobState)
        elif kind == "node":
            job, _, host = rest.partition(".")
            nodes.append((_text(job), _text(host), value))
        elif kind == "energy":
            state.energy[_text(rest)] = dec(value, type=dict[int, float])
        elif kind == "closed":
            state.closed[_text(rest)] = dec(value, type=float)
        elif kind == "outbox":
            state.outbox[_text(rest)] = dec(value, type=Summary)
    for key in [k for k in state.jobs if k in state.closed]:
        del state.jobs[key]
    for job, host, value in nodes:
        found_job = state.jobs.get(job)
        if found_job is not None:
            found_job.nodes[host] = dec(value, type=Node)
    return state


PHASES: tuple[tuple[str, frozenset[str]], ...] = (
    ("put", frozenset({"outbox", "closed"})),
    ("remove", frozenset({"job", "node"})),
    ("remove", frozenset({"closed"})),
    ("put", frozenset({"job", "node", "energy", "meta"})),
    ("remove", frozenset({"outbox", "energy", "meta"})),
)
"""The order of a save's writes: a closing job's summary is stored before the job is removed."""


class KvStore:
    """The state as fenced entries of the roles bucket, written incrementally (see the module docstring)."""

    def __init__(self, store: FencedStore, saved: dict[str, bytes] | None = None) -> None:
        self.store = store
        self.saved: dict[str, bytes] = dict(saved or {})
        """What the bucket holds, as far as this process wrote or loaded it."""
        self.last_writes = 0
        self.last_bytes = 0

    @property
    def where(self) -> str:
        return f"{self.store.lease.bucket} ({self.store.prefix}*)"

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.saved.values())

    @classmethod
    async def load(cls, store: FencedStore, cluster: str, durable: str) -> tuple[KvStore, State]:
        """The state the last holder saved, and a store that knows what the bucket holds (entries dropped
        at load are removed at the first save)."""
        found = await store.load()
        return cls(store, found), decode_entries(found, cluster, durable)

    async def save(self, state: State) -> None:
        """Write the entries that changed, in `PHASES` order; what failed is written at the next save."""
        want = entries(state)  # before any await: the state as it is now
        saved = self.saved
        changed = {k: v for k, v in want.items() if saved.get(k) != v}
        gone = [k for k in saved if k not in want]
        self.last_writes = len(changed) + len(gone)
        self.last_bytes = sum(len(v) for v in changed.values())
        try:
            for op, kinds in PHASES:
                done: list[str] = []
                try:
                    if op == "put":
                        todo = [(k, v) for k, v in changed.items() if k.partition(".")[0] in kinds]
                        await self.store.apply(todo, (), done)
                    else:
                        await self.store.apply((), [k for k in gone if k.partition(".")[0] in kinds], done)
                finally:  # what was written is known written, also when a write after it failed
                    for k in done:
                        if op == "put":
                            saved[k] = changed[k]
                        else:
                            saved.pop(k, None)
        except (NotHeld, NatsError, APIError, TimeoutError, OSError) as exc:
            raise Transient(f"saving the state to {self.where}: {describe(exc)}") from exc
