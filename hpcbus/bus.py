"""NATS for long-running hpcbus processes: connect and reconnect forever, JetStream streams as data.

Every process here must survive a broker restart. nats-py reconnects an established connection by itself
(with `max_reconnect_attempts=-1`), but a *first* connect that fails raises; `connect` retries that too.
Each connection event is one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, PubAck, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from hpcbus.retry import Trouble, describe
from hpcbus.settings import BusSettings, nats_connect_options
from schemas import subjects

log = logging.getLogger("hpcbus.bus")

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default `max_payload`, assumed until a server announced its own."""


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
    storage: str = "file"
    """`file` (survives a broker restart) or `memory`."""
    replicas: int = 1


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
    )


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> None:
    """Create the stream if missing; add our subjects to an existing one (never remove an operator's)."""
    config = StreamConfig(
        name=spec.name,
        subjects=spec.subjects,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_age=spec.max_age,
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window,
        storage=StorageType.FILE if spec.storage == "file" else StorageType.MEMORY,
        num_replicas=spec.replicas,
    )
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(config)
        log.info("created stream %s over %s", spec.name, ", ".join(spec.subjects))
        return
    have = list(info.config.subjects or [])
    missing = [s for s in spec.subjects if s not in have]
    if missing:
        info.config.subjects = have + missing
        await js.update_stream(info.config)
        log.info("stream %s: added subjects %s", spec.name, ", ".join(missing))


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """Bytes the headers take on the wire (`NATS/1.0` block): the server counts them into `max_payload`."""
    if not headers:
        return 0
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


ID_HEADER_BYTES = 12 + len("Nats-Msg-Id") + 64 + 4
"""What a `Nats-Msg-Id` header of up to 64 characters adds to a message (`header_bytes`): the room producers
keep free below `max_payload`."""


class TooLarge(ValueError):
    """A message the server would refuse (and close the connection for): never sent."""


def check_size(nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str] | None) -> None:
    """Refuse here what the server would refuse there: nats-py checks the payload alone, but the server
    counts headers too and answers an oversized message by closing the connection."""
    limit = int(nc.max_payload or DEFAULT_MAX_PAYLOAD)
    size = len(payload) + header_bytes(headers)
    if size > limit:
        raise TooLarge(f"{subject}: {size} bytes with headers, over the server's max_payload of {limit}")


async def js_publish(
    nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float
) -> PubAck:
    """JetStream publish that waits for the stream's ack; refuses at once while disconnected (a retry must
    not pile copies into the client's reconnect buffer) and never sends what the server would refuse."""
    if not nc.is_connected:
        raise ConnectionError("not connected to NATS")
    check_size(nc, subject, payload, headers)
    return await nc.jetstream().publish(subject, payload, timeout=timeout, headers=headers)


async def core_publish(nc: NATS, subject: str, payload: bytes, timeout: float) -> None:
    """Core NATS publish for subjects no stream captures (cc-backend's `cc.job.event`), made as sure as core
    NATS allows: refused at once while disconnected (never parked in the client's reconnect buffer, where a
    second connection loss would drop it unseen) and followed by a PING/PONG round trip, so an error here
    means the server may not have it and the caller keeps it to try again."""
    if not nc.is_connected:
        raise ConnectionError("not connected to NATS")
    check_size(nc, subject, payload, None)
    await nc.publish(subject, payload)
    await nc.flush(timeout=max(1, int(timeout)))


async def connect(settings: BusSettings, name: str, trouble: Trouble | None = None) -> NATS:
    """A connection that reconnects forever. With `max_reconnect_attempts=-1` nats-py also retries a first
    connect that fails (every `reconnect_time_wait`) instead of raising, so this returns once connected and
    waits as long as it takes (cancel it to give up). Connection trouble is one episode of `trouble`: a
    WARNING when the connection goes, summaries while it is away, one line when it is back."""
    trouble = trouble or Trouble(log, f"nats ({','.join(settings.nats)})")

    async def on_error(exc: Exception) -> None:
        trouble.failed(exc)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # a clean close is not news
            trouble.failed("disconnected")

    async def on_reconnected() -> None:
        trouble.ok()
        log.info("nats: reconnected to %s", nc.connected_url.netloc if nc.connected_url else "?")

    nc = NATS()
    await nc.connect(
        name=name,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        connect_timeout=2,
        allow_reconnect=True,
        **nats_connect_options(settings),  # type: ignore[arg-type]
    )
    trouble.ok()
    log.info("nats: connected to %s as %s", nc.connected_url.netloc if nc.connected_url else "?", name)
    return nc


async def close(nc: NATS, timeout: float = 1.0) -> None:
    """Drain when connected (finish what is in flight), else just close; bounded by `timeout` and quiet: a
    stop must be clean whatever state the connection is in (reconnecting, closed by the server, ...)."""
    if nc.is_closed:
        return
    if nc.is_connected:
        try:
            await asyncio.wait_for(nc.drain(), timeout)
            return
        except Exception as exc:
            log.debug("nats: drain failed (%s); closing", describe(exc))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), timeout)
