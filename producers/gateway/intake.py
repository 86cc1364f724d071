"""Taking a gateway request in, before anything is made of it: credentials, a place among the requests
handled at once, and the body.

Apart from the handlers because every write path (InfluxDB v1 and v2, Sonar) takes its request in the same
way, and this is where the limits against clients live: at most `max_requests` requests at once, of them at
most `max_requests_per_client` from one peer and `max_requests_per_cluster` for one cluster (503 at once
beyond), a body within `body_timeout` (408) and `max_body` (413), inflated here in steps of `INFLATE_STEP`
bytes with the event loop run between them (aiohttp's own decompression is off), and only after the
credentials were checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import BasicAuth, web
from aiohttp.http_exceptions import HttpProcessingError

from hpcbus.producers.gateway.answers import Refusal, SourceCounters
from hpcbus.producers.gateway.httpserver import malformed_text
from hpcbus.producers.gateway.inflate import WBITS, Inflater
from hpcbus.producers.gateway.memory import BodyMemory, malloc_trim
from hpcbus.producers.gateway.settings import GatewaySettings
from hpcbus.producers.gateway.tally import Tally
from hpcbus.retry import Stopping, describe

INFLATE_STEP = 1 << 18
"""Bytes a compressed body is inflated to between two returns to the event loop (about a millisecond)."""


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


def peer(request: web.Request) -> str:
    return request.remote or "unknown"


class HttpLog(logging.LoggerAdapter):
    """aiohttp's server log (`AppRunner(logger=...)`): a malformed request or a client gone mid-request is
    counted in a `Tally` instead of an ERROR with a traceback each, a malformed one by the fixed words of
    its kind (the parser's message quotes the request: a long `Authorization` header is a secret); anything
    else (a bug here) is logged as aiohttp logs it."""

    def __init__(self, logger: logging.Logger, malformed: Tally, gone: Tally) -> None:
        super().__init__(logger, {})
        self.malformed = malformed
        self.gone = gone

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        peer = args[0] if args else "unknown"
        if isinstance(exc, HttpProcessingError):
            self.malformed.note(f"from {peer}: {malformed_text(exc)}")  # never the request's bytes
            return
        if isinstance(exc, ConnectionError):
            self.gone.note(f"from {peer}: {describe(exc)}")
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


class Place:
    """One request's place among those handled at once: whose it is, and how its body is coming, so that a
    stalled one can be given to a request that finds no place free."""

    def __init__(self, client: str, cluster: str, memory: BodyMemory | None = None) -> None:
        self.client = client
        self.cluster = cluster
        self.memory = memory
        """What the body counts against `max_body_memory` (None: nothing)."""
        self.progress = time.monotonic()
        """When a byte of its body last came (or the place was taken)."""
        self.reading: asyncio.Timeout | None = None
        """The body's timeout while it is being read (the only time a place can be lost): expired at once
        to take the place away."""
        self.lost = False
        self.held = 0
        """Inflated body bytes counted against `max_body_memory`."""


PLACE = web.RequestKey("hpcbus_gateway_place", Place)
"""Where a request keeps its `Place` (the body reader updates its progress)."""


class Slots:
    """The requests handled at once, in all, per peer address and per cluster; `idle` is set while none is.

    A request that finds no place free (in all, or in its client's or cluster's share) takes the place of
    one whose body has made no progress for `stall_timeout` seconds, if there is one that frees what is
    full (the stalled one is answered 408), else it gets 503 at once: stalled clients, from however many
    addresses, cannot keep clients that send out for `body_timeout`."""

    def __init__(
        self, settings: GatewaySettings, stopping: Stopping, cluster_count: Callable[[], int]
    ) -> None:
        self.settings = settings
        self.stopping = stopping
        self.cluster_count = cluster_count
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.by_client: Counter[str] = Counter()
        self.by_cluster: Counter[str] = Counter()
        self.places: set[Place] = set()
        self.memory = BodyMemory(settings.max_body_memory, malloc_trim())
        self.taken_over = 0
        """Places given to a new request because their body stalled."""

    def cluster_share(self) -> int:
        """Places one cluster may hold (`max_requests_per_cluster`, 0: all, or half with several clusters)."""
        n = self.settings.max_requests
        share = self.settings.max_requests_per_cluster
        if not share:
            share = n if self.cluster_count() <= 1 else max(1, n // 2)
        return min(share, n)

    def _full(self, client: str, cluster: str) -> tuple[str, bool, bool, bool]:
        """(why there is no place for this request, "" when there is; all full, client's, cluster's)."""
        client_share = self.settings.max_requests_per_client or self.settings.max_requests
        every = self.in_flight >= self.settings.max_requests
        mine = self.by_client[client] >= client_share
        ours = self.by_cluster[cluster] >= self.cluster_share()
        why = ""
        if every:
            why = f"{self.in_flight} requests in progress"
        elif mine:
            why = f"{self.by_client[client]} requests of {client} in progress, its share"
        elif ours:
            why = f"{self.by_cluster[cluster]} requests of cluster {cluster} in progress, its share"
        return why, every, mine, ours

    def _stalled(self, client: str, cluster: str, mine: bool, ours: bool) -> Place | None:
        """The place stalled longest whose loss makes room for this request, if one stalled long enough."""
        since = time.monotonic() - self.settings.stall_timeout
        found = [
            p
            for p in self.places
            if p.reading is not None
            and not p.lost
            and p.progress <= since
            and (not mine or p.client == client)
            and (not ours or p.cluster == cluster)
        ]
        return min(found, key=lambda p: p.progress, default=None)

    def _take(self, place: Place) -> None:
        self.places.add(place)
        self.in_flight += 1
        self.by_client[place.client] += 1
        self.by_cluster[place.cluster] += 1
        self.idle.clear()

    def _free(self, place: Place) -> None:
        if place not in self.places:
            return
        self.places.discard(place)
        self.in_flight -= 1
        for held, key in ((self.by_client, place.client), (self.by_cluster, place.cluster)):
            held[key] -= 1
            if not held[key]:
                del held[key]
        if not self.in_flight:
            self.idle.set()

    @contextlib.asynccontextmanager
    async def slot(self, request: web.Request, cluster: str, counters: SourceCounters) -> AsyncIterator[None]:
        """One of `max_requests` places, within this client's and this cluster's share (a stalled body's
        place if need be), or 503 at once."""
        client = peer(request)
        why = "stopping" if self.stopping.is_set() else ""
        if not why:
            why, _, mine, ours = self._full(client, cluster)
            stalled = self._stalled(client, cluster, mine, ours) if why else None
            if stalled is not None and stalled.reading is not None:
                stalled.lost = True
                self._free(stalled)
                stalled.reading.reschedule(asyncio.get_running_loop().time())  # its read ends: 408
                self.taken_over += 1
                why = ""
        if why:
            counters.refused_busy += 1
            raise Refusal(
                503,
                f"hpcbus gateway busy ({why}); retry",
                code="unavailable",
                retry_after=self.settings.retry_after,
            )
        place = Place(client, cluster, self.memory)
        self._take(place)
        request[PLACE] = place
        try:
            yield
        finally:
            self._free(place)
            self.memory.release(place.held)
            place.held = 0

    async def drain(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no request is in progress; False if some still were."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), max(0.0, timeout))
        return self.idle.is_set()


async def read_body(
    request: web.Request, counters: SourceCounters, settings: GatewaySettings, gone: Tally
) -> bytes:
    """The body, inflated here when gzip or deflate (`Content-Encoding`) in steps with the event loop run
    between them; 413 beyond `max_body`, counted both as received (compressed: a `Content-Length` over it
    is refused before reading, and a body of endless empty gzip members is stopped there too) and as
    inflated (inflating stops there); 503 when the bodies of all requests would pass `max_body_memory`; 408
    when it does not arrive within `body_timeout`, or stalls for `stall_timeout` while another request
    needs its place (`Slots`); 415 for another encoding, 400 when unreadable or the client went away. The
    loop runs between received chunks as well as between inflated steps: a chunk that inflates to nothing
    must not keep other clients waiting."""
    limit = settings.max_body
    too_large = Refusal(413, f"request body larger than {limit} bytes", code="request too large")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if encoding not in WBITS and encoding != "identity":
        raise Refusal(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)")
    inflater = Inflater(encoding, INFLATE_STEP) if encoding in WBITS else None
    if request.content_length is not None and request.content_length > limit:
        counters.refused_too_large += 1
        raise too_large
    place = request.get(PLACE) or Place(peer(request), "")
    memory = place.memory
    chunks: list[bytes] = []
    size = 0
    received = 0
    timeout = settings.body_timeout
    try:
        async with asyncio.timeout(timeout) as place.reading:
            async for chunk in request.content.iter_any():  # what came, however little: progress
                place.progress = time.monotonic()
                received += len(chunk)
                if received > limit:  # compressed bytes count too (chunked bodies have no length)
                    counters.refused_too_large += 1
                    raise too_large
                for out in [chunk] if inflater is None else inflater.pieces(chunk):
                    size += len(out)
                    if size > limit:  # the rest is never inflated (aiohttp discards it as it comes)
                        counters.refused_too_large += 1
                        raise too_large
                    if memory is not None:
                        if not memory.take(len(out)):
                            counters.refused_busy += 1
                            raise Refusal(
                                503,
                                f"hpcbus gateway busy ({memory.held} bytes of request bodies in memory, "
                                "max_body_memory); retry",
                                code="unavailable",
                                retry_after=settings.retry_after,
                            )
                        place.held += len(out)
                    chunks.append(out)
                    if inflater is not None:
                        await asyncio.sleep(0)
                await asyncio.sleep(0)  # also when a chunk inflates to nothing (empty gzip members)
        body = b"".join(chunks)
    except TimeoutError:
        counters.refused_timeout += 1
        if place.lost:
            raise Refusal(
                408,
                f"request body stalled for over {settings.stall_timeout:g} s (stall_timeout) while other "
                "requests waited: its place was given to one of them",
                code="timeout",
            ) from None
        raise Refusal(
            408, f"request body not received within {timeout:g} s (body_timeout)", code="timeout"
        ) from None
    except HttpProcessingError as exc:
        raise Refusal(400, f"unreadable body: {exc.message or exc}") from None
    except zlib.error as exc:
        raise Refusal(400, f"unreadable {encoding} body: {exc}") from None
    except ConnectionError as exc:  # nobody to answer; counted, one line per episode
        counters.disconnected += 1
        gone.note(f"{request.method} {request.path} from {peer(request)}: {describe(exc)}")
        raise Refusal(400, "client went away mid-body") from None
    finally:
        chunks.clear()  # a refusal's traceback must not keep the pieces alive
        place.reading = None
    if inflater is not None and not inflater.complete:
        raise Refusal(400, f"unreadable {encoding} body: it ends before its compressed stream does")
    return body
