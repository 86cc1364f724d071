"""The gateway's HTTP side: InfluxDB's write APIs and Sonar's HTTP sink in front of JetStream.

A request is answered only after JetStream has stored every message made from it: each message carries a
`Nats-Msg-Id` derived from its content (`schemas.translate.msg_id`), so when the answer is lost and the
client sends the same body again, the stream drops the copy. Success is 204 (InfluxDB) or 200 (Sonar); a
request with bad lines is 400 naming every bad line, after its good lines were stored (what InfluxDB 1.x
calls a partial write). While NATS is unreachable, or an acknowledgement does not come in time, the answer
is 503 with `Retry-After`: Slurm's profile plugin then loses that batch (it never retries, FACTS.md), but
InfluxDB clients, Telegraf and Sonar's curl retry, and nothing they were told is stored is lost.

At most `max_requests` requests are handled at once, of them at most `max_requests_per_client` from one
peer address and `max_requests_per_cluster` for one cluster; beyond that the answer is 503 at once
(back-pressure goes to the clients, which hold their data, instead of into this process' memory, and clients
that stall cannot take every place). A request's head must come within `header_timeout`, its body within
`body_timeout` (408).

Nothing is decompressed for a request that is refused: aiohttp's own decompression is off (it would inflate
a body as it arrives, and inflate the unread rest of a refused one while discarding it), credentials are
checked before the body is read, and the body is inflated in steps of `intake.INFLATE_STEP` bytes with the
event loop run between them, stopping at `max_body`. So a gzip bomb costs at most `max_body` bytes of
inflating, in small steps, and only with valid credentials.

Status codes and bodies follow InfluxDB: v1 `{"error": "..."}`, v2 `{"code": "...", "message": "..."}`.

This module routes requests and publishes; the rest is beside it: `intake.py` (credentials, slots, body),
`influx.py` and `sonar.py` (what a body becomes), `answers.py` (refusals and counters).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from nats.aio.client import Client as NATS

from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES, js_publish, sonar_limit, stream_full
from hpcbus.producers.gateway.answers import Refusal, SourceCounters, problems_text, refusal_response
from hpcbus.producers.gateway.auth import Authenticator, Busy
from hpcbus.producers.gateway.influx import (
    INFLUX_VERSION,
    MAX_DATABASES,
    V1_PRECISIONS,
    V2_PRECISIONS,
    line_messages,
    normalise_in_steps,
    query_results,
)
from hpcbus.producers.gateway.intake import HttpLog, Slots, credentials, peer, read_body
from hpcbus.producers.gateway.settings import GatewaySettings
from hpcbus.producers.gateway.sonar import refusal_status, sonar_messages
from hpcbus.producers.gateway.tally import Tally
from hpcbus.retry import Stopping, Trouble, describe
from hpcbus.schemas import subjects
from hpcbus.schemas.foreign import read_envelopes, topic_kind
from hpcbus.schemas.message import Message
from hpcbus.schemas.translate import MAX_PAYLOAD

__all__ = ["Gateway", "Refusal", "SourceCounters", "listen_address", "normalise_in_steps"]

log = logging.getLogger("hpcbus.gateway")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """The HTTP handlers and what they share: the NATS connection of the moment, the admission count, the
    counters. `nc` is set by the service body while connected and None otherwise."""

    def __init__(
        self, settings: GatewaySettings, auth: Authenticator, stopping: Stopping, *, prefix: str = ""
    ) -> None:
        self.settings = settings
        self.auth = auth
        self.stopping = stopping
        self.prefix = prefix
        self.nc: NATS | None = None
        self.slots = Slots(settings, stopping, lambda: len(auth.clusters))
        self.counters: dict[tuple[str, str], SourceCounters] = {}
        self.unauthorized = 0
        self.busy_checks = 0
        """Requests answered 503 because `Authenticator.max_checks` secrets were being checked already."""
        self.trouble = Trouble(log, "gateway: publish to JetStream")
        self.refused_logins = Tally(log, "gateway: 401 (credentials refused)")
        self.malformed = Tally(log, "gateway: malformed HTTP request refused")
        self.gone = Tally(log, "gateway: client gone before its answer", level=logging.INFO)
        self.http_log = HttpLog(log, self.malformed, self.gone)
        self.databases: set[str] = set()
        self.host = socket.gethostname()

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        return self.slots.in_flight

    # --- the application ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._answer_refusals])
        app.router.add_post("/write", self.write_v1)
        app.router.add_post("/api/v2/write", self.write_v2)
        app.router.add_get("/ping", self.ping)
        app.router.add_route("*", "/query", self.query)
        app.router.add_post("/sonar/{topic}", self.sonar)
        app.router.add_post("/api/v1/insert/{topic}", self.sonar)
        app.router.add_get("/health", self.health)
        return app

    @web.middleware
    async def _answer_refusals(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except Refusal as refusal:
            return refusal_response(request, refusal)

    def source(self, cluster: str, name: str) -> SourceCounters:
        counters = self.counters.get((cluster, name))
        if counters is None:
            counters = self.counters[(cluster, name)] = SourceCounters()
        return counters

    # --- what every write does -------------------------------------------------------------------------

    async def authenticate(self, request: web.Request) -> str:
        """The cluster this request publishes for, or 401."""
        if self.auth.open:
            return self.auth.default
        given = credentials(request)
        try:
            cluster = await self.auth.cluster_of(*given) if given else None
        except Busy as exc:
            self.busy_checks += 1
            raise Refusal(
                503,
                f"hpcbus gateway busy ({exc}); retry",
                code="unavailable",
                retry_after=self.settings.retry_after,
            ) from None
        if cluster is None:
            self.unauthorized += 1
            who = f"user {given[0]!r}" if given else "no or unreadable credentials"
            self.refused_logins.note(f"{request.method} {request.path} from {peer(request)} ({who})")
            raise Refusal(401, "authorization failed", code="unauthorized")
        return cluster

    async def body(self, request: web.Request, counters: SourceCounters) -> bytes:
        """The body within the limits (`intake.read_body`)."""
        return await read_body(request, counters, self.settings, self.gone)

    def _sonar_limit(self) -> int:
        """Bytes a Sonar envelope's message may have (`sonar_limit`; not capped like `_limit`)."""
        return sonar_limit(self.nc.max_payload if self.nc is not None else None)

    def _limit(self) -> int:
        """Bytes a message may have: what the server takes beside the `Nats-Msg-Id` header, and at most
        `MAX_PAYLOAD` (without a connection the answer is 503 anyway)."""
        nc = self.nc
        if nc is None:
            return MAX_PAYLOAD
        return min(MAX_PAYLOAD, int(nc.max_payload or DEFAULT_MAX_PAYLOAD) - ID_HEADER_BYTES)

    async def publish(self, messages: list[Message], counters: SourceCounters) -> None:
        """Every message stored by JetStream, or 503 (some may be stored: a retry drops them by id)."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            counters.refused_unavailable += 1
            self.trouble.failed("not connected to NATS")
            raise Refusal(
                503,
                "NATS is unreachable; nothing was stored, retry",
                code="unavailable",
                retry_after=self.settings.retry_after,
            )
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
            raise Refusal(
                503,
                f"{reason}; retry (what was stored is not stored twice)",
                code="unavailable",
                retry_after=self.settings.retry_after,
            )
        if messages:
            self.trouble.ok()
        counters.messages_published += len(messages)
        counters.duplicate_messages += sum(1 for r in results if getattr(r, "duplicate", False))

    # --- InfluxDB ------------------------------------------------------------------------------------------

    async def write_v1(self, request: web.Request) -> web.StreamResponse:
        return await self._write(
            request, "influx-v1", request.query.get("precision", ""), V1_PRECISIONS | {""}
        )

    async def write_v2(self, request: web.Request) -> web.StreamResponse:
        return await self._write(request, "influx-v2", request.query.get("precision", "ns"), V2_PRECISIONS)

    async def _write(
        self, request: web.Request, source: str, precision: str, allowed: frozenset[str]
    ) -> web.StreamResponse:
        cluster = await self.authenticate(request)  # first, as InfluxDB: no answer about input without it
        if source == "influx-v2" and not request.query.get("bucket"):
            raise Refusal(400, "bucket is required")
        if precision not in allowed:
            choices = ", ".join(sorted(p for p in allowed if p))
            raise Refusal(400, f"invalid precision {precision!r} (one of {choices})")
        counters = self.source(cluster, source)
        counters.requests += 1
        db = request.query.get("db") or request.query.get("bucket") or ""
        if db and len(self.databases) < MAX_DATABASES:
            self.databases.add(db)
        async with self.slots.slot(request, cluster, counters):
            body = await self.body(request, counters)
            limit = self._limit()
            place = f"{request.method} {request.path}"
            result = await normalise_in_steps(
                body,
                self.stopping,
                precision=precision,
                cluster=cluster,
                now=int(time.time()),
                place=place,
                max_future=self.settings.max_future,
            )
            if result is None:
                counters.refused_busy += 1
                raise Refusal(
                    503,
                    "hpcbus gateway stopping; retry",
                    code="unavailable",
                    retry_after=self.settings.retry_after,
                )
            messages, oversized = line_messages(result, cluster, limit, place, prefix=self.prefix)
            problems = result.problems + oversized
            rejected = result.rejected + len(oversized)
            received, published = result.received, len(result.lines) - len(oversized)
            del (
                body,
                result,
            )  # only the messages are held while JetStream answers: memory ~ max_body a request
            await self.publish(messages, counters)
        counters.lines_received += received
        counters.lines_rejected += rejected
        counters.lines_published += published
        if rejected:
            text = problems_text(problems)
            log.info("%s for %s: %d of %d lines refused: %s", place, cluster, rejected, received, text)
            partial = "partial write: " if published else ""
            raise Refusal(400, f"{partial}{text} dropped={rejected}")
        return web.Response(status=204)

    async def ping(self, request: web.Request) -> web.StreamResponse:
        headers = {"X-Influxdb-Version": INFLUX_VERSION, "X-Influxdb-Build": "OSS", "X-Hpcbus": "gateway"}
        if request.query.get("verbose", "").lower() == "true":
            return web.json_response({"version": INFLUX_VERSION}, headers=headers)
        return web.Response(status=204, headers=headers)

    async def query(self, request: web.Request) -> web.StreamResponse:
        """Enough of InfluxQL for clients that probe at start-up; nothing is created or read."""
        await self.authenticate(request)
        q = request.query.get("q", "")
        if not q and request.method == "POST":
            q = str((await request.post()).get("q", ""))
        return web.json_response({"results": query_results(q, self.databases)})

    # --- Sonar ---------------------------------------------------------------------------------------------

    async def sonar(self, request: web.Request) -> web.StreamResponse:
        """Sonar's HTTP sink (`api-root` = `http://host:port/sonar`) and Jobanalyzer's insert API."""
        topic = request.match_info["topic"]
        kind = topic_kind(topic)
        if not kind:
            raise Refusal(
                404, f"unknown topic {topic!r}: sample, sysinfo, job, cluster, or <prefix>.<one of them>"
            )
        cluster = await self.authenticate(request)
        counters = self.source(cluster, "sonar")
        counters.requests += 1
        place = f"{request.method} {request.path}"
        async with self.slots.slot(request, cluster, counters):
            body = await self.body(request, counters)
            # in a thread: a JSONL body of many envelopes, or a token's hash, takes long enough to stall
            # the event loop (other requests, /health, SIGTERM)
            found = await asyncio.to_thread(
                read_envelopes,
                body,
                kind,
                cluster,
                place=place,
                token_ok=self.auth.sonar_token_check(cluster),
            )
            subject = subjects.sonar(cluster, kind, prefix=self.prefix)
            # cut in a thread too: a large jobs envelope is decoded and re-encoded part by part
            messages, envelopes, too_large = await asyncio.to_thread(
                sonar_messages, found.payloads, subject, kind, self._sonar_limit(), place
            )
            await self.publish(messages, counters)
        rejected = found.received - len(found.payloads)
        counters.envelopes_received += found.received
        counters.envelopes_published += envelopes
        counters.envelopes_rejected += rejected
        counters.records_too_large += len(too_large)
        problems = found.problems + too_large
        if problems:
            text = problems_text(problems)
            log.info(
                "%s for %s: %d of %d envelopes refused, %d records too large: %s",
                place,
                cluster,
                rejected,
                found.received,
                len(too_large),
                text,
            )
            status, code = refusal_status(found.problems, bool(messages))
            # as for line protocol: what was stored beside the refused records (or envelopes) is said first
            partial = "partial write: " if messages and status == 400 else ""
            raise Refusal(status, f"{partial}{text}", code=code)
        answer: dict[str, int] = {"published": envelopes}
        if len(messages) != envelopes:
            answer["messages"] = len(messages)
        return web.json_response(answer)

    # --- health and progress -------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.StreamResponse:
        """200 while NATS is connected, 503 otherwise (a load balancer then sends writes elsewhere)."""
        up = self.nc is not None and self.nc.is_connected and not self.stopping.is_set()
        body = {
            "name": "hpcbus-gateway",
            "status": "pass" if up else "fail",
            "message": "ready for writes"
            if up
            else "NATS is unreachable"
            if not self.stopping.is_set()
            else "stopping",
            "nats": "connected" if self.nc is not None and self.nc.is_connected else "unreachable",
            "in_flight": self.in_flight,
            "clusters": self.auth.clusters,
        }
        return web.json_response(body, status=200 if up else 503)

    async def drain(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no request is in progress; False if some still were."""
        return await self.slots.drain(timeout)

    def flush(self) -> None:
        """The summary lines of refusals counted but not yet logged (the report, and the stop)."""
        for tally in (self.refused_logins, self.malformed, self.gone):
            tally.flush()

    def summary(self) -> str:
        parts = []
        for (cluster, source), c in sorted(self.counters.items()):
            parts.append(
                f"{cluster} {source}: {c.requests} requests, {c.lines_published} lines and "
                f"{c.envelopes_published} envelopes published, {c.lines_rejected + c.envelopes_rejected} refused, "
                f"{c.refused_unavailable + c.refused_busy + c.refused_full} answered 503"
                + (f" ({c.refused_full} stream full)" if c.refused_full else "")
                + (f", {c.refused_timeout} body timeouts" if c.refused_timeout else "")
                + (f", {c.disconnected} clients gone mid-body" if c.disconnected else "")
            )
        if self.unauthorized:
            parts.append(f"{self.unauthorized} unauthorized")
        if self.malformed.total:
            parts.append(f"{self.malformed.total} malformed requests")
        if self.busy_checks:
            parts.append(f"{self.busy_checks} answered 503 while checking other credentials")
        return "; ".join(parts) or "no requests"

    async def report(self) -> None:
        """The summary line, and the counters as `hpcbus_*` metric lines on each cluster's subject."""
        self.flush()
        log.info("gateway: %s", self.summary())
        nc = self.nc
        if nc is None or not nc.is_connected:
            return
        from hpcbus.outlet import Outlet

        for (cluster, source), counters in list(self.counters.items()):
            await Outlet(nc, cluster, jetstream=True, prefix=self.prefix).telemetry(
                f"gateway-{source}", counters
            )

    async def report_loop(self) -> None:
        while not await self.stopping.sleep(self.settings.stats_seconds):
            try:
                await self.report()
            except Exception as exc:  # progress reports must never stop the gateway
                log.debug("report failed: %s", describe(exc))


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:8086` for IPv6) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen {text!r}: HOST:PORT expected, e.g. 0.0.0.0:8086")
    return host.strip("[]") or "0.0.0.0", int(port)
