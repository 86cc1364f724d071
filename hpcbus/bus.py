"""Publishing on NATS within its limits: message sizes as the server counts them (headers included), a
JetStream publish and a core one, and what the server's refusals mean (a full stream, a permissions
violation). Streams are `hpcbus.streams`, connections `hpcbus.connection`.
"""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.client import Client as NATS
from nats.js import errors as js_errors
from nats.js.api import PubAck
from nats.js.errors import APIError

from hpcbus.retry import describe

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default `max_payload`, assumed until a server announced its own."""


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
    try:
        return await nc.jetstream().publish(subject, payload, timeout=timeout, headers=headers)
    except js_errors.NoStreamResponseError as exc:
        unanswered = exc
    why = ""
    try:
        captured = await stored_by(nc, subject)
    except Unasked as exc:
        captured, why = None, str(exc)
    if why:
        raise StreamUnavailable(f"no stream answered for {subject}, and the server could not say why: {why}")
    if captured is None:
        raise unanswered  # the server says no stream captures the subject: no retry cures that
    raise StreamUnavailable(f"stream {captured} did not answer for {subject} (its leader being elected?)")


class StreamUnavailable(ConnectionError):
    """A JetStream publish nobody answered (nats-py's `NoStreamResponseError`, "no responders") although a
    stream captures the subject, or the server could not say whether one does: transient. In a cluster a
    stream has no responder for a moment while its leader is elected (seen when a member restarts); taken
    for "no stream captures the subject", that moment dead-lettered good messages. Raised outside the
    original's `except`, so `hpcbus.permanent.outcome`, which follows causes, does not see the refusal."""


class Unasked(Exception):
    """The server could not say which stream stores a subject (no JetStream answered, no `$JS.API` rights,
    a timeout): not the same as "none does", and said differently."""


async def stored_by(nc: NATS, subject: str, timeout: float = 2) -> str | None:
    """The stream that stores `subject`, asked of the server (`$JS.API.STREAM.NAMES` with a subject filter,
    answered by the meta leader); None when the server says none does; `Unasked` (with why) when it cannot
    say (no JetStream, an identity without `$JS.API` rights, no answer in time)."""
    try:
        name: str = await nc.jetstream(timeout=timeout).find_stream_name_by_subject(subject)
    except js_errors.NotFoundError:
        return None
    except js_errors.ServiceUnavailableError:  # what nats-py makes of "no responders" on $JS.API
        raise Unasked("no JetStream answered on this server ($JS.API has no responders)") from None
    except TimeoutError:
        raise Unasked(
            f"$JS.API did not answer within {timeout:g} s (JetStream down, or no permission for $JS.API?)"
        ) from None
    except Exception as exc:  # a permissions error, an API error, the connection lost
        raise Unasked(describe(exc)) from None
    return name


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
    await round_trip(nc, timeout)


async def round_trip(nc: NATS, timeout: float) -> None:
    """Wait until the server has read everything this client sent so far (and answered: a refusal's -ERR
    comes before the PONG that follows the refused message).

    One `flush` is not that: nats-py 2.16 writes a flush's PING straight to the socket, ahead of publishes
    and subscriptions still in its pending buffer, so the PONG can come before the server read them (seen:
    a refused publish's -ERR arriving after the PONG, and `pub` saying "sent"). The first flush makes the
    client's flusher write what was pending; the second PING follows it on the socket."""
    for _ in range(2):
        await nc.flush(timeout=max(1, int(timeout)))
