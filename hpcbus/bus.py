"""NATS for long-running hpcbus processes: connect and reconnect forever, JetStream streams as data.

Every process here must survive a broker restart. nats-py reconnects an established connection by itself
(with `max_reconnect_attempts=-1`), but a *first* connect that fails raises; `connect` retries that too.
Each connection event is one log line.
"""

from __future__ import annotations

import logging
import re

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from hpcbus.settings import BusSettings, nats_connect_options

log = logging.getLogger("hpcbus.bus")


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


def telemetry_stream(cluster: str, **overrides: object) -> StreamSpec:
    """Everything a cluster publishes that consumers must not lose (control is request/reply, not stored)."""
    subjects = [f"{cluster}.metrics", f"{cluster}.events.>", f"{cluster}.log.>", f"{cluster}.sonar.>"]
    return msgspec.convert(
        {"name": stream_name("HPCBUS", cluster), "subjects": subjects, **overrides}, StreamSpec
    )


def deadletter_subject(cluster: str, category: str) -> str:
    return f"{cluster}.deadletter.{category}"


def deadletter_stream(cluster: str) -> StreamSpec:
    """Rejected input with its original payload, kept for `hpcbus deadletter list|replay` (30 days)."""
    return StreamSpec(
        name=stream_name("HPCBUS_DLQ", cluster), subjects=[f"{cluster}.deadletter.>"], max_age=30 * 86400.0
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


async def connect(settings: BusSettings, name: str) -> NATS:
    """A connection that reconnects forever. With `max_reconnect_attempts=-1` nats-py also retries a first
    connect that fails (every `reconnect_time_wait`) instead of raising, so this returns once connected and
    waits as long as it takes; each distinct failure is logged once."""

    last_reported = [""]

    async def on_error(exc: Exception) -> None:
        # nats-py retries a failing (re)connect every second and reports each try: say it once per cause.
        text = str(exc) or type(exc).__name__
        if text != last_reported[0]:
            log.warning("nats: %s (%s); retrying", text, ",".join(settings.nats))
            last_reported[0] = text

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # a clean close is not news
            log.warning("nats: disconnected; reconnecting")

    async def on_reconnected() -> None:
        last_reported[0] = ""
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
    log.info("nats: connected to %s as %s", nc.connected_url.netloc if nc.connected_url else "?", name)
    return nc


async def close(nc: NATS) -> None:
    """Drain (finish what is in flight, then close); a connection that cannot drain is just closed."""
    try:
        await nc.drain()
    except Exception:
        await nc.close()
