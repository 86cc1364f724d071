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
checked before the body is read, and the body is inflated here in steps of `INFLATE_STEP` bytes with the
event loop run between them, stopping at `max_body`. So a gzip bomb costs at most `max_body` bytes of
inflating, in small steps, and only with valid credentials.

Status codes and bodies follow InfluxDB: v1 `{"error": "..."}`, v2 `{"code": "...", "message": "..."}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import BasicAuth, web
from aiohttp.http_exceptions import HttpProcessingError
from nats.aio.client import Client as NATS

from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES, js_publish, sonar_limit, stream_full
from hpcbus.outbox import split_lines
from hpcbus.retry import Stopping, Trouble, describe
from producers.gateway.auth import Authenticator, Busy
from producers.gateway.inflate import WBITS, Inflater
from producers.gateway.settings import GatewaySettings
from producers.gateway.tally import Tally
from schemas import subjects
from schemas.foreign import PRECISIONS, Normalised, normalise, read_envelopes, topic_kind
from schemas.message import Message
from schemas.problems import Problem
from schemas.translate import MAX_PAYLOAD, envelope_messages, msg_id, route

log = logging.getLogger("hpcbus.gateway")

INFLUX_VERSION = "1.8.10"
"""What `/ping` says in `X-Influxdb-Version`: clients pick their API by it, and 1.8 is the first 1.x with the
v2 write API (`/api/v2/write`) that this gateway also answers."""

V1_PRECISIONS = frozenset(PRECISIONS) - {""}
V2_PRECISIONS = frozenset({"ns", "us", "ms", "s"})
MAX_PROBLEMS_SHOWN = 20
"""Bad lines named one by one in an error answer; the rest are counted."""
MAX_DATABASES = 64
"""Database names `CREATE DATABASE` adds to what `SHOW DATABASES` answers (probes only; nothing is made)."""

SOURCES = ("influx-v1", "influx-v2", "sonar")
INFLATE_STEP = 1 << 18
"""Bytes a compressed body is inflated to between two returns to the event loop (about a millisecond)."""
STEP_BYTES = 1 << 20
"""Body bytes normalised between two returns to the event loop (~10,000 lines, tens of ms): a 32 MiB body
takes seconds to read, and meanwhile `/health`, other requests and SIGTERM must still be answered."""


class SourceCounters(msgspec.Struct):
    """Per cluster and source (`influx-v1`, `influx-v2`, `sonar`), published as `hpcbus_<name>` lines."""

    requests: int = 0
    lines_received: int = 0
    lines_published: int = 0
    lines_rejected: int = 0
    envelopes_received: int = 0
    envelopes_published: int = 0
    envelopes_rejected: int = 0
    messages_published: int = 0
    duplicate_messages: int = 0
    """Messages JetStream already had (a client's retry after a lost answer)."""
    refused_unavailable: int = 0
    """Requests answered 503 because NATS was unreachable or did not acknowledge in time."""
    refused_busy: int = 0
    """Requests answered 503 because `max_requests` (or this client's or cluster's share) were already being
    handled."""
    refused_full: int = 0
    """Requests answered 503 because the stream refused messages: full, with `discard: new`."""
    refused_too_large: int = 0
    records_too_large: int = 0
    """Sonar records (or whole samples) larger than one NATS message: refused alone with 413."""
    refused_timeout: int = 0
    """Requests answered 408: the body did not arrive within `body_timeout`."""
    disconnected: int = 0
    """Requests whose client went away before its body was read."""


class Refusal(Exception):
    """An answer other than success: the middleware writes it in the style of the API asked."""

    def __init__(self, status: int, message: str, *, code: str = "invalid", retry_after: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after = retry_after


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _problems_text(problems: list[Problem]) -> str:
    errors = [p for p in problems if p.severity == "error"]
    shown = "; ".join(str(p) for p in errors[:MAX_PROBLEMS_SHOWN])
    more = len(errors) - MAX_PROBLEMS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


async def normalise_in_steps(
    body: bytes, stopping: Stopping, *, step: int = STEP_BYTES, **options: Any
) -> Normalised | None:
    """`normalise(body, **options)`, whole lines of about `step` bytes at a time with the event loop run
    between them (line numbers as if in one go); None when `stopping` was set meanwhile (nothing has been
    published yet: the client's retry goes to the next gateway or this one restarted)."""
    if len(body) <= step:
        return normalise(body, **options)
    out = Normalised([], [], [], 0)
    start = lines_before = 0
    while start < len(body):
        cut = body.find(b"\n", start + step - 1)
        end = len(body) if cut < 0 else cut + 1
        piece = body[start:end]
        part = normalise(piece, **options)
        out.lines += part.lines
        out.texts += part.texts
        out.problems += [p.located(p.place, lines_before) for p in part.problems]
        out.received += part.received
        lines_before += piece.count(b"\n")
        start = end
        await asyncio.sleep(0)
        if stopping.is_set():
            return None
    return out


def credentials(request: web.Request) -> tuple[str, str] | None:
    """(user, secret) from Basic auth, `Token <user>:<secret>`, or InfluxDB 1.x's `u`/`p` parameters; None
    when there are none or they cannot be read (not base64, not UTF-8: the request is then refused 401,
    like wrong ones, instead of failing on them later)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    found: tuple[str, str] | None = None
    if scheme.lower() == "basic":
        try:
            basic = BasicAuth.decode(header, encoding="utf-8")
        except (ValueError, UnicodeError):
            return None
        found = basic.login, basic.password
    elif scheme.lower() == "token":
        user, sep, secret = value.strip().partition(":")
        found = (user, secret) if sep else ("", user)
    elif "u" in request.query:
        found = request.query["u"], request.query.get("p", "")
    if found is None or not all(_utf8(part) for part in found):
        return None
    return found


def _utf8(text: str) -> bool:
    """aiohttp keeps header bytes that are not UTF-8 as lone surrogates: such text cannot be a secret."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _peer(request: web.Request) -> str:
    return request.remote or "unknown"


class HttpLog(logging.LoggerAdapter):
    """aiohttp's server log (`AppRunner(logger=...)`): a malformed request or a client gone mid-request is
    counted in a `Tally` instead of an ERROR with a traceback each; anything else (a bug here) is logged as
    aiohttp logs it."""

    def __init__(self, logger: logging.Logger, malformed: Tally, gone: Tally) -> None:
        super().__init__(logger, {})
        self.malformed = malformed
        self.gone = gone

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        peer = args[0] if args else "unknown"
        if isinstance(exc, HttpProcessingError):
            self.malformed.note(f"from {peer}: {describe(exc)}")
            return
        if isinstance(exc, ConnectionError):
            self.gone.note(f"from {peer}: {describe(exc)}")
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


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
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.counters: dict[tuple[str, str], SourceCounters] = {}
        self.unauthorized = 0
        self.busy_checks = 0
        """Requests answered 503 because `Authenticator.max_checks` secrets were being checked already."""
        self.trouble = Trouble(log, "gateway: publish to JetStream")
        self.refused_logins = Tally(log, "gateway: 401 (credentials refused)")
        self.malformed = Tally(log, "gateway: malformed HTTP request refused")
        self.gone = Tally(log, "gateway: client gone before its answer", level=logging.INFO)
        self.http_log = HttpLog(log, self.malformed, self.gone)
        self.by_client: Counter[str] = Counter()
        self.by_cluster: Counter[str] = Counter()
        self.databases: set[str] = set()
        self.host = socket.gethostname()

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
            return self._refusal_response(request, refusal)

    def _refusal_response(self, request: web.Request, refusal: Refusal) -> web.Response:
        headers: dict[str, str] = {}
        if refusal.retry_after:
            headers["Retry-After"] = str(refusal.retry_after)
        if refusal.status == 401:
            headers["WWW-Authenticate"] = 'Basic realm="hpcbus"'
        body: dict[str, Any]
        if request.path.startswith("/api/v2/"):
            body = {"code": refusal.code, "message": refusal.message}
        else:
            body = {"error": refusal.message}
        return web.json_response(body, status=refusal.status, headers=headers)

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
            self.refused_logins.note(f"{request.method} {request.path} from {_peer(request)} ({who})")
            raise Refusal(401, "authorization failed", code="unauthorized")
        return cluster

    def cluster_share(self) -> int:
        """Places one cluster may hold (`max_requests_per_cluster`, 0: all, or half with several clusters)."""
        n = self.settings.max_requests
        share = self.settings.max_requests_per_cluster
        if not share:
            share = n if len(self.auth.clusters) <= 1 else max(1, n // 2)
        return min(share, n)

    @contextlib.asynccontextmanager
    async def slot(self, request: web.Request, cluster: str, counters: SourceCounters) -> AsyncIterator[None]:
        """One of `max_requests` places, within this client's and this cluster's share, or 503 at once."""
        peer = _peer(request)
        client_share = self.settings.max_requests_per_client or self.settings.max_requests
        why = ""
        if self.stopping.is_set():
            why = "stopping"
        elif self.in_flight >= self.settings.max_requests:
            why = f"{self.in_flight} requests in progress"
        elif self.by_client[peer] >= client_share:
            why = f"{self.by_client[peer]} requests of {peer} in progress, its share"
        elif self.by_cluster[cluster] >= self.cluster_share():
            why = f"{self.by_cluster[cluster]} requests of cluster {cluster} in progress, its share"
        if why:
            counters.refused_busy += 1
            raise Refusal(
                503,
                f"hpcbus gateway busy ({why}); retry",
                code="unavailable",
                retry_after=self.settings.retry_after,
            )
        self.in_flight += 1
        self.by_client[peer] += 1
        self.by_cluster[cluster] += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            for held, key in ((self.by_client, peer), (self.by_cluster, cluster)):
                held[key] -= 1
                if not held[key]:
                    del held[key]
            if not self.in_flight:
                self._idle.set()

    async def body(self, request: web.Request, counters: SourceCounters) -> bytes:
        """The body, inflated here when gzip or deflate (`Content-Encoding`) in steps with the event loop run
        between them; 413 beyond `max_body`, counted both as received (compressed: a `Content-Length` over it
        is refused before reading, and a body of endless empty gzip members is stopped there too) and as
        inflated (inflating stops there); 408 when it does not arrive within `body_timeout`, 415 for another
        encoding, 400 when unreadable or the client went away. The loop runs between received chunks as well
        as between inflated steps: a chunk that inflates to nothing must not keep other clients waiting."""
        limit = self.settings.max_body
        too_large = Refusal(413, f"request body larger than {limit} bytes", code="request too large")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
        if encoding not in WBITS and encoding != "identity":
            raise Refusal(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)")
        inflater = Inflater(encoding, INFLATE_STEP) if encoding in WBITS else None
        if request.content_length is not None and request.content_length > limit:
            counters.refused_too_large += 1
            raise too_large
        chunks: list[bytes] = []
        size = 0
        received = 0
        timeout = self.settings.body_timeout
        try:
            async with asyncio.timeout(timeout):
                async for chunk in request.content.iter_chunked(1 << 16):
                    received += len(chunk)
                    if received > limit:  # compressed bytes count too (chunked bodies have no length)
                        counters.refused_too_large += 1
                        raise too_large
                    for out in [chunk] if inflater is None else inflater.pieces(chunk):
                        size += len(out)
                        if size > limit:  # the rest is never inflated (aiohttp discards it as it comes)
                            counters.refused_too_large += 1
                            raise too_large
                        chunks.append(out)
                        if inflater is not None:
                            await asyncio.sleep(0)
                    await asyncio.sleep(0)  # also when a chunk inflates to nothing (empty gzip members)
        except TimeoutError:
            counters.refused_timeout += 1
            raise Refusal(
                408, f"request body not received within {timeout:g} s (body_timeout)", code="timeout"
            ) from None
        except HttpProcessingError as exc:
            raise Refusal(400, f"unreadable body: {exc.message or exc}") from None
        except zlib.error as exc:
            raise Refusal(400, f"unreadable {encoding} body: {exc}") from None
        except ConnectionError as exc:  # nobody to answer; counted, one line per episode
            counters.disconnected += 1
            self.gone.note(f"{request.method} {request.path} from {_peer(request)}: {describe(exc)}")
            raise Refusal(400, "client went away mid-body") from None
        if inflater is not None and not inflater.complete:
            raise Refusal(400, f"unreadable {encoding} body: it ends before its compressed stream does")
        return b"".join(chunks)

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
        full = [f for f in failures if stream_full(f)]
        if full:
            counters.refused_full += 1
            self.trouble.failed(full[0])
            raise Refusal(
                503,
                f"the stream is full ({describe(full[0])}): {len(failures)} of {len(messages)} messages not "
                "stored until its workers catch up; retry (what was stored is not stored twice)",
                code="unavailable",
                retry_after=self.settings.retry_after,
            )
        if failures:
            counters.refused_unavailable += 1
            self.trouble.failed(failures[0])
            raise Refusal(
                503,
                f"JetStream did not store {len(failures)} of {len(messages)} messages ({describe(failures[0])}); "
                "retry (what was stored is not stored twice)",
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
        async with self.slot(request, cluster, counters):
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
            messages, oversized = self.messages(result, cluster, limit, place)
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
            text = _problems_text(problems)
            log.info("%s for %s: %d of %d lines refused: %s", place, cluster, rejected, received, text)
            partial = "partial write: " if published else ""
            raise Refusal(400, f"{partial}{text} dropped={rejected}")
        return web.Response(status=204)

    def messages(
        self, result: Normalised, cluster: str, limit: int, place: str
    ) -> tuple[list[Message], list[Problem]]:
        """The lines as messages per subject, each at most `limit` bytes and named by its content; a single
        line longer than that cannot be published (a problem)."""
        routes = route(result.lines, cluster, prefix=self.prefix)
        if len(routes) == 1:  # the usual request, all metrics: the texts in order, no per-line lookup
            texts = {subject: "\n".join(result.texts) for subject in routes}
        else:
            text_of = {id(line): text for line, text in zip(result.lines, result.texts, strict=True)}
            texts = {s: "\n".join(text_of[id(line)] for line in group) for s, group in routes.items()}
        out: list[Message] = []
        oversized: list[Problem] = []
        for subject, text in texts.items():
            payload = (text + "\n").encode()
            pieces = [payload] if len(payload) <= limit else split_lines(payload, limit)
            for piece in pieces:
                if len(piece) > limit:
                    reason = f"a line of {len(piece)} bytes is longer than a NATS message may be ({limit})"
                    oversized.append(Problem(reason, place, 0, "lp", "line"))
                    continue
                out.append(Message(subject, piece, msg_id(subject, piece)))
        return out, oversized

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
        results: list[dict[str, Any]] = []
        for i, statement in enumerate(s.strip() for s in q.split(";") if s.strip()):
            words = statement.split()
            head = " ".join(words[:2]).upper()
            if head == "SHOW DATABASES":
                values = [[name] for name in sorted(self.databases)]
                series = {"name": "databases", "columns": ["name"], "values": values}
                results.append({"statement_id": i, "series": [series]})
            elif head == "CREATE DATABASE" and len(words) > 2:
                if len(self.databases) < MAX_DATABASES:
                    self.databases.add(words[2].strip('"'))
                results.append({"statement_id": i})
            else:
                error = (
                    "hpcbus gateway answers SHOW DATABASES and CREATE DATABASE only; query InfluxDB itself"
                )
                results.append({"statement_id": i, "error": error})
        return web.json_response({"results": results})

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
        async with self.slot(request, cluster, counters):
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
                self.sonar_messages, found.payloads, subject, kind, self._sonar_limit(), place
            )
            await self.publish(messages, counters)
        rejected = found.received - len(found.payloads)
        counters.envelopes_received += found.received
        counters.envelopes_published += envelopes
        counters.envelopes_rejected += rejected
        counters.records_too_large += len(too_large)
        problems = found.problems + too_large
        if problems:
            text = _problems_text(problems)
            log.info(
                "%s for %s: %d of %d envelopes refused, %d records too large: %s",
                place,
                cluster,
                rejected,
                found.received,
                len(too_large),
                text,
            )
            paths = {p.path for p in found.problems if p.severity == "error"}
            status = 400
            if not found.problems:
                status = 413
            elif not messages and paths == {"meta.token"}:
                status = 401
            elif not messages and paths and all(p.endswith("cluster") for p in paths):
                status = 403
            code = {401: "unauthorized", 403: "forbidden", 413: "request too large"}.get(status, "invalid")
            # as for line protocol: what was stored beside the refused records (or envelopes) is said first
            partial = "partial write: " if messages and status == 400 else ""
            raise Refusal(status, f"{partial}{text}", code=code)
        answer: dict[str, int] = {"published": envelopes}
        if len(messages) != envelopes:
            answer["messages"] = len(messages)
        return web.json_response(answer)

    @staticmethod
    def sonar_messages(
        payloads: list[bytes], subject: str, kind: str, limit: int, place: str
    ) -> tuple[list[Message], int, list[Problem]]:
        """The messages of a request's valid envelopes, each cut to `limit` (`envelope_messages`: a jobs or
        cluster envelope in parts, each with the same meta and attributes); how many envelopes have something
        published; and the problems of records (or samples) too large for one message, located at `place`."""
        messages: list[Message] = []
        too_large: list[Problem] = []
        envelopes = 0
        for payload in payloads:
            out, problems = envelope_messages(subject, payload, limit, kind=kind)
            messages += out
            envelopes += bool(out)
            too_large += [p.located(place) for p in problems]
        return messages, envelopes, too_large

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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout))
        return self._idle.is_set()

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
        from consumers.outlet import Outlet

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
