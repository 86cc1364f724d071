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
from typing import Any, Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Placement, PubAck, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from hpcbus.retry import Trouble, describe
from hpcbus.schemas import subjects
from hpcbus.settings import BusSettings, nats_connect_options

log = logging.getLogger("hpcbus.bus")

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default `max_payload`, assumed until a server announced its own."""


def discards_bucket(stream: str) -> str:
    """The JetStream key-value bucket where the workers of `stream`'s durables record the discards they
    reported, one key per durable (hpcbus.discards; deploy's permissions name it: nats_auth)."""
    return f"{stream}_discards"


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
    storage: Literal["file", "memory"] = "file"
    """`file` (survives a broker restart) or `memory`."""
    replicas: int = 0
    """Servers holding a copy; 0 = auto (`auto_replicas`: 1 on a single server, 3 on a cluster)."""
    placement_tags: list[str] = msgspec.field(default_factory=list)
    """Server tags the stream must be placed on ([] = anywhere)."""
    discard: Literal["old", "new"] = "old"
    """Full: `old` drops the oldest messages (`limits` retention); `new` refuses new ones and keeps each
    message until every durable reading its subject has acknowledged it (`interest` retention)."""
    archive: bool = False
    """A stream kept for people, not for durables (dead letters): always `old`, whatever `[bus]` says
    (`interest` retention would drop what no durable reads at once)."""
    node_data: bool = False
    """The nodes' samples go into it (telemetry, ingest): its size is checked against `expected_nodes`."""
    expected_nodes: int = 0
    """Nodes publishing into it (`[bus] expected_nodes`; 0 = not said): created smaller than an hour of
    them is a WARNING."""


NODE_BYTES_PER_SECOND = 4_500
"""What one compute node sends at the default 30 s interval (128 cores, 4 GPUs, 4 jobs: 134 kB per sample;
docs/scaling.md, measured with `hpcbus simulate`)."""


def hour_bytes(nodes: int) -> int:
    """Stream bytes that hold one hour of `nodes` nodes' samples (what a worker or InfluxDB outage of an
    hour fills)."""
    return nodes * NODE_BYTES_PER_SECOND * 3600


CLUSTER_REPLICAS = 3
"""Replicas `auto` asks for on a cluster: JetStream's Raft needs a majority, so 3 copies keep a stream
writable with one server down (2 would not: one of two is no majority) at a third of 5's write cost."""


def auto_replicas(server_info: Mapping[str, Any]) -> int:
    """The replica count `auto` means on the server that sent this INFO: 1 on a server without a `cluster`
    (a standalone nats-server refuses more), else `CLUSTER_REPLICAS`, or the number of servers the cluster
    advertises (`connect_urls`) when that is fewer. A cluster that does not advertise (`no_advertise`) gets
    `CLUSTER_REPLICAS`; if it has fewer JetStream servers the server's refusal names the stream and
    `--stream-replicas` says what to set."""
    if not server_info.get("cluster"):
        return 1
    advertised = len(set(server_info.get("connect_urls") or ()))
    return min(CLUSTER_REPLICAS, advertised) if advertised >= 2 else CLUSTER_REPLICAS


def server_info(nc: NATS) -> Mapping[str, Any]:
    """The INFO the server sent when this connection was made (nats-py keeps it, without a public name)."""
    info: Mapping[str, Any] = getattr(nc, "_server_info", None) or {}
    return info


def for_bus(spec: StreamSpec, bus: BusSettings) -> StreamSpec:
    """`spec` with the stream settings of `[bus]` (replicas, storage, placement tags): every stream a
    command creates follows them, whichever command creates it first."""
    return msgspec.structs.replace(
        spec,
        replicas=bus.stream_replicas,
        storage=bus.stream_storage,
        placement_tags=list(bus.stream_placement_tags),
        discard="old" if spec.archive else bus.stream_discard,
        expected_nodes=bus.expected_nodes,
    )


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
            "node_data": True,
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
        archive=True,
    )


def ingest_stream(cluster: str, *, prefix: str = "", **overrides: object) -> StreamSpec:
    """What nodes publish on their own ingest subjects (`<cluster>.ingest.<host>.>`) until `hpcbus consume
    ingest` has checked and forwarded it; a day is plenty for a worker outage."""
    return msgspec.convert(
        {
            "name": stream_name("HPCBUS_INGEST", cluster),
            "subjects": [subjects.ingest_wildcard(cluster, prefix=prefix)],
            "max_age": 86400.0,
            "node_data": True,
            **overrides,
        },
        StreamSpec,
    )


async def ensure_stream(
    js: JetStreamContext, spec: StreamSpec, info: Mapping[str, Any] | None = None
) -> None:
    """Create the stream if missing; add our subjects to an existing one (never remove an operator's).

    Any other difference between the stream and `spec` (replicas, storage, limits, placement) is reported
    as one WARNING per setting and left alone: the stream may have been sized by hand, and changing
    replicas or storage under running publishers is an operator's decision (`nats stream edit`).
    `info`: the server's INFO, for `auto` replicas (default: the INFO of `js`'s connection)."""
    replicas = spec.replicas or auto_replicas(info if info is not None else server_info(js._nc))
    config = StreamConfig(
        name=spec.name,
        subjects=spec.subjects,
        retention=RetentionPolicy.INTEREST if spec.discard == "new" else RetentionPolicy.LIMITS,
        discard=DiscardPolicy.NEW if spec.discard == "new" else DiscardPolicy.OLD,
        max_age=spec.max_age,
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window,
        storage=StorageType.FILE if spec.storage == "file" else StorageType.MEMORY,
        num_replicas=replicas,
        placement=Placement(tags=list(spec.placement_tags)) if spec.placement_tags else None,
    )
    try:
        existing = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(config)
        log.info(
            "created stream %s over %s (%d replica%s, %s storage%s)",
            spec.name,
            ", ".join(spec.subjects),
            replicas,
            "" if replicas == 1 else "s",
            spec.storage,
            f", placement tags {','.join(spec.placement_tags)}" if spec.placement_tags else "",
        )
        warn_if_small(spec)
        return
    for setting, have, want in stream_differences(existing.config, config):
        log.warning(
            "stream %s: %s is %s, this command wants %s; not changed (`nats stream edit %s` or recreate it "
            "to apply)",
            spec.name,
            setting,
            have,
            want,
            spec.name,
        )
    have_subjects = list(existing.config.subjects or [])
    missing = [s for s in spec.subjects if s not in have_subjects]
    if missing:
        existing.config.subjects = have_subjects + missing
        await js.update_stream(existing.config)
        log.info("stream %s: added subjects %s", spec.name, ", ".join(missing))


def interest_retention(config: StreamConfig) -> bool:
    """Does a stream keep a message only for its durables (`interest` retention, what `stream_discard =
    "new"` creates)? `config` as the server answered it (a string) or as built here (an enum)."""
    return str(getattr(config.retention, "value", config.retention)) == "interest"


def warn_if_small(spec: StreamSpec) -> None:
    """A WARNING when a stream of the nodes' samples holds less than an hour of `expected_nodes` nodes:
    a worker or InfluxDB outage longer than that loses the oldest samples (discard=old)."""
    if not (spec.node_data and spec.expected_nodes):
        return
    need = hour_bytes(spec.expected_nodes)
    if spec.max_bytes < need:
        minutes = spec.max_bytes / (spec.expected_nodes * NODE_BYTES_PER_SECOND) / 60
        log.warning(
            "stream %s: created with max_bytes %d, about %.0f minutes of %d nodes; an hour needs %d "
            "(--stream-max-bytes; docs/deploy.md, docs/scaling.md)",
            spec.name,
            spec.max_bytes,
            minutes,
            spec.expected_nodes,
            need,
        )


SETTING_NAMES = {
    "num_replicas": "replicas (--stream-replicas)",
    "storage": "storage (--stream-storage)",
    "max_age": "max_age in seconds (--stream-max-age)",
    "max_bytes": "max_bytes (--stream-max-bytes)",
    "placement": "placement tags (--stream-placement-tags)",
    "discard": "discard (--stream-discard)",
    "retention": "retention (--stream-discard)",
}
"""StreamConfig field -> how a warning names it (the setting that asks for it)."""


def stream_differences(have: StreamConfig, want: StreamConfig) -> list[tuple[str, object, object]]:
    """(setting, existing value, wanted value) for each setting hpcbus chooses in which the two differ."""

    def value(config: StreamConfig, name: str) -> object:
        v = getattr(config, name)
        if name == "storage":  # an enum in what we build, a string in what the server answered
            return str(getattr(v, "value", v) or "file")
        if name in ("discard", "retention"):
            return str(getattr(v, "value", v) or ("old" if name == "discard" else "limits"))
        if name == "placement":
            tags = v.get("tags") if isinstance(v, dict) else getattr(v, "tags", None)
            return sorted(tags or [])
        if name == "num_replicas":
            return v or 1
        if isinstance(v, float):
            return round(v, 3)
        return v

    found = []
    for name, label in SETTING_NAMES.items():
        a, b = value(have, name), value(want, name)
        if a != b:
            found.append((label, a, b))
    return found


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """Bytes the headers take on the wire (`NATS/1.0` block): the server counts them into `max_payload`."""
    if not headers:
        return 0
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


ID_HEADER_BYTES = 12 + len("Nats-Msg-Id") + 64 + 4
"""What a `Nats-Msg-Id` header of up to 64 characters adds to a message (`header_bytes`): the room producers
keep free below `max_payload`."""


def sonar_limit(max_payload: int | None, headers: Mapping[str, str] | None = None) -> int:
    """Bytes a Sonar envelope's message may have: the server's `max_payload` (the default until it said)
    less the headers the server counts too (`headers`, and a `Nats-Msg-Id` of up to 64 characters). Not
    capped at `MAX_PAYLOAD`: an envelope goes as one message where the server takes it (a sample can only go
    whole). The one calculation for the gateway and `hpcbus pub`."""
    server = int(max_payload or DEFAULT_MAX_PAYLOAD)
    return server - header_bytes({**(headers or {}), "Nats-Msg-Id": "0" * 64})


class TooLarge(ValueError):
    """A message the server would refuse (and close the connection for): never sent."""


def check_size(nc: NATS, subject: str, payload: bytes, headers: Mapping[str, str] | None) -> None:
    """Refuse here what the server would refuse there: nats-py checks the payload alone, but the server
    counts headers too and answers an oversized message by closing the connection."""
    limit = int(nc.max_payload or DEFAULT_MAX_PAYLOAD)
    size = len(payload) + header_bytes(headers)
    if size > limit:
        raise TooLarge(f"{subject}: {size} bytes with headers, over the server's max_payload of {limit}")


STREAM_STORE_FAILED = 10077
"""nats-server's `JSStreamStoreFailedF`: a publish the stream did not store; with "maximum bytes exceeded" or
"maximum messages exceeded" it is a `discard: new` stream at its limit."""


def stream_full(exc: BaseException) -> bool:
    """Is `exc` the stream refusing a publish because it is full (`discard: new` at `max_bytes`/`max_msgs`):
    the client should hold its data and retry later, not drop it as refused."""
    if not isinstance(exc, APIError) or exc.err_code != STREAM_STORE_FAILED:
        return False
    return "maximum" in (exc.description or "").lower()


async def js_publish(
    nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float
) -> PubAck:
    """JetStream publish that waits for the stream's ack; refuses at once while disconnected (a retry must
    not pile copies into the client's reconnect buffer) and never sends what the server would refuse."""
    if not nc.is_connected:
        raise ConnectionError("not connected to NATS")
    check_size(nc, subject, payload, headers)
    return await nc.jetstream().publish(subject, payload, timeout=timeout, headers=headers)


PERMISSIONS_VIOLATION = "permissions violation"
"""How the server words a refusal for this identity's permissions (lower case, as matched)."""


def refused_publish(nc: NATS, subject: str) -> Exception | None:
    """The server's refusal of a publish to `subject` for this identity's permissions, if it sent one.

    A refused publish is dropped with an -ERR that nats-py keeps as the connection's last error (and hands
    the error callback); a JetStream request then only times out and a plain publish says nothing. After a
    `flush` (the server answers the PING after the PUB), this tells a refusal from a success."""
    refusal = nc.last_error
    if refusal is not None and PERMISSIONS_VIOLATION in str(refusal).lower() and subject in str(refusal):
        return refusal
    return None


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
    refused: set[str] = set()

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if PERMISSIONS_VIOLATION in text.lower():  # the connection stays up: not connection trouble
            if text not in refused and len(refused) < 100:
                refused.add(text)
                log.warning(
                    "%s: this identity may not do that (its permissions: hpcbus deploy nats-auth)", text
                )
            return
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


def check_urls(urls: list[str]) -> None:
    """Refuse a NATS URL nats-py would misread before connecting: `http//bad` (taken as host `http`), a port
    out of range (a traceback from deep inside nats-py), a scheme it cannot speak. `SettingsError` names the
    URL and the reason."""
    from urllib.parse import urlsplit

    from hpcbus.settings import SettingsError

    for url in urls:
        text = url if "://" in url else f"nats://{url}"  # nats-py reads `host:port` so too
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise SettingsError(f"NATS URL {url!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("nats", "tls", "ws", "wss"):
            raise SettingsError(
                f"NATS URL {url!r}: scheme {scheme!r} is not nats://, tls://, ws:// or wss://"
            )
        if not parts.hostname or parts.path not in ("", "/") or (port is not None and port == 0):
            raise SettingsError(f"NATS URL {url!r}: expected nats://HOST[:PORT], e.g. nats://127.0.0.1:4222")


class Unreachable(ConnectionError):
    """No NATS server answered within a one-shot command's connect timeout."""


async def connect_once(
    settings: BusSettings, name: str, timeout: float = 5.0, *, reconnect: bool = False
) -> NATS:
    """A connection for a one-shot command (`pub`, `status`, `tail`): the URLs checked first, then one try
    per server with about `timeout` seconds each; `Unreachable` (with the servers and the last error, in
    words) instead of waiting forever as a long-running process does. `reconnect`: once connected, nats-py
    reconnects by itself after a loss (`status --watch` lives on through a broker restart)."""
    check_urls(settings.nats)
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:  # said below, once, in words
        errors.append(exc)

    nc = NATS()
    try:  # nats-py reads max_reconnect_attempts=0 as "forever": 1 is one more try per server
        await asyncio.wait_for(
            nc.connect(
                name=name,
                error_cb=on_error,
                allow_reconnect=reconnect,
                max_reconnect_attempts=-1 if reconnect else 1,
                reconnect_time_wait=0,
                connect_timeout=max(1, round(timeout)),
                **nats_connect_options(settings),  # type: ignore[arg-type]
            ),
            2 * timeout * len(settings.nats) + 1,
        )
    except Exception as exc:  # nats-py raises its own errors, OSError or a timeout
        with contextlib.suppress(Exception):
            await nc.close()
        cause = (
            errors[-1] if errors else exc
        )  # nats-py's NoServersError hides the why (refused, timeout, auth)
        why = describe(cause) or type(cause).__name__
        if isinstance(cause, TimeoutError) and not str(cause):
            why = f"no answer within {timeout:g} s"
        raise Unreachable(f"NATS {', '.join(settings.nats)}: not reachable ({why})") from None
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
