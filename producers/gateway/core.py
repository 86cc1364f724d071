"""What every gateway request shares, whatever its API: the NATS connection of the moment, the credentials
check, the admission slots, the body within its limits, and publishing to JetStream with the answer only
after every message is stored (`server.py` says why). The API handlers (`influx_api.py`, `sonar_api.py`)
are built on one `Core`."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from nats.aio.client import Client as NATS

from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES, js_publish, sonar_limit, stream_full
from hpcbus.interest import Interest, NoDurable
from hpcbus.producers.gateway.answers import Refusal, SourceCounters
from hpcbus.producers.gateway.auth import Authenticator, Busy, Identity
from hpcbus.producers.gateway.intake import Slots, credentials, peer, read_body
from hpcbus.producers.gateway.settings import GatewaySettings
from hpcbus.producers.gateway.stats import Stats
from hpcbus.retry import Stopping, Trouble, describe
from hpcbus.schemas.message import Message
from hpcbus.schemas.translate import MAX_PAYLOAD

log = logging.getLogger("hpcbus.gateway")


class Core:
    """The shared state of the handlers. `nc` is set by the service body while connected, None otherwise."""

    def __init__(
        self, settings: GatewaySettings, auth: Authenticator, stopping: Stopping, *, prefix: str = ""
    ) -> None:
        self.settings = settings
        self.auth = auth
        self.stopping = stopping
        self.prefix = prefix
        self.nc: NATS | None = None
        self.slots = Slots(settings, stopping, lambda: len(auth.clusters))
        self.stats = Stats(prefix)
        self.trouble = Trouble(log, "gateway: publish to JetStream")
        self.interest = Interest()
        """Asked before publishing whether the stream would keep it; the command sets it to the clusters'
        streams (`Interest()` asks about none)."""

    def unavailable(self, message: str) -> Refusal:
        """503 with the `Retry-After` clients are told to wait."""
        return Refusal(503, message, code="unavailable", retry_after=self.settings.retry_after)

    async def authenticate(self, request: web.Request) -> Identity:
        """Who this request is (the cluster it publishes for, its role and hosts: `roles.py`), or 401."""
        given = credentials(request)
        if self.auth.open:
            given = given or ("", "")
        try:
            who = await self.auth.identity_of(*given, peer=peer(request)) if given else None
        except Busy as exc:
            self.stats.busy_checks += 1
            raise self.unavailable(f"hpcbus gateway busy ({exc}); retry") from None
        if who is None:
            self.stats.unauthorized += 1
            user = f"user {given[0]!r}" if given else "no or unreadable credentials"
            self.stats.refused_logins.note(f"{request.method} {request.path} from {peer(request)} ({user})")
            raise Refusal(401, "authorization failed", code="unauthorized")
        return who

    async def body(self, request: web.Request, counters: SourceCounters) -> bytes:
        """The body within the limits (`intake.read_body`)."""
        return await read_body(request, counters, self.settings, self.stats.gone)

    def sonar_limit(self) -> int:
        """Bytes a Sonar envelope's message may have (`hpcbus.bus.sonar_limit`; not capped like `limit`)."""
        return sonar_limit(self.nc.max_payload if self.nc is not None else None)

    def limit(self) -> int:
        """Bytes a message may have: what the server takes beside the `Nats-Msg-Id` header, and at most
        `MAX_PAYLOAD` (without a connection the answer is 503 anyway)."""
        nc = self.nc
        if nc is None:
            return MAX_PAYLOAD
        return min(MAX_PAYLOAD, int(nc.max_payload or DEFAULT_MAX_PAYLOAD) - ID_HEADER_BYTES)

    async def publish(self, messages: list[Message], counters: SourceCounters) -> None:
        """Every message stored by JetStream, or 503 (some may be stored: a retry drops them by id). Nothing
        is published while a stream would acknowledge it and keep nothing (`hpcbus.interest`: `stream_discard
        = "new"` before any worker created its durable): 503, so the client keeps its data."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            counters.refused_unavailable += 1
            self.trouble.failed("not connected to NATS")
            raise self.unavailable("NATS is unreachable; nothing was stored, retry")
        try:
            for subject in dict.fromkeys(m.subject for m in messages):
                await self.interest.check(nc.jetstream(), subject)
        except NoDurable as exc:
            counters.refused_no_durable += 1
            self.trouble.failed(exc)
            raise self.unavailable(f"{exc}; nothing was stored, retry") from None
        timeout = self.settings.publish_timeout
        results = await asyncio.gather(
            *(js_publish(nc, m.subject, m.payload, {"Nats-Msg-Id": m.msg_id}, timeout) for m in messages),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            full = next((f for f in failures if stream_full(f)), None)
            if full is not None:
                counters.refused_full += 1
                reason = (
                    f"the stream is full ({describe(full)}): {len(failures)} of {len(messages)} messages not "
                    "stored until its workers catch up"
                )
            else:
                counters.refused_unavailable += 1
                reason = (
                    f"JetStream did not store {len(failures)} of {len(messages)} messages "
                    f"({describe(failures[0])})"
                )
            self.trouble.failed(full if full is not None else failures[0])
            raise self.unavailable(f"{reason}; retry (what was stored is not stored twice)")
        if messages:
            self.trouble.ok()
        counters.messages_published += len(messages)
        counters.duplicate_messages += sum(1 for r in results if getattr(r, "duplicate", False))
