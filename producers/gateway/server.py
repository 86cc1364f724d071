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

This module routes requests to the handlers and answers `/health`; each role is a module beside it:
`core.py` (what every request shares: credentials, slots, limits, publishing), `influx_api.py` and
`sonar_api.py` (the two APIs), `influx.py` and `sonar.py` (what a body becomes), `intake.py` (credentials,
slots, body reading), `answers.py` (refusals and counters), `stats.py` (summary and self-telemetry).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from nats.aio.client import Client as NATS

from hpcbus.producers.gateway.answers import Refusal, SourceCounters, refusal_response
from hpcbus.producers.gateway.auth import Authenticator, Busy
from hpcbus.producers.gateway.core import Core
from hpcbus.producers.gateway.influx import normalise_in_steps
from hpcbus.producers.gateway.influx_api import InfluxApi
from hpcbus.producers.gateway.intake import HttpLog, credentials, peer
from hpcbus.producers.gateway.settings import GatewaySettings
from hpcbus.producers.gateway.sonar_api import SonarApi
from hpcbus.retry import Stopping, describe

__all__ = ["Gateway", "Refusal", "SourceCounters", "listen_address", "normalise_in_steps"]

log = logging.getLogger("hpcbus.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """The HTTP application: the routes of both APIs on one `Core`, `/health`, the stop's drain and the
    periodic report. `nc` is set by the service body while connected and None otherwise."""

    def __init__(
        self, settings: GatewaySettings, auth: Authenticator, stopping: Stopping, *, prefix: str = ""
    ) -> None:
        self.core = Core(settings, auth, stopping, prefix=prefix)
        self.influx = InfluxApi(self.core)
        self.sonar = SonarApi(self.core)
        stats = self.core.stats
        self.http_log = HttpLog(log, stats.malformed, stats.gone)

    @property
    def nc(self) -> NATS | None:
        return self.core.nc

    @nc.setter
    def nc(self, nc: NATS | None) -> None:
        self.core.nc = nc

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        return self.core.slots.in_flight

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._answer_refusals])
        app.router.add_post("/write", self.influx.write_v1)
        app.router.add_post("/api/v2/write", self.influx.write_v2)
        app.router.add_get("/ping", self.influx.ping)
        app.router.add_route("*", "/query", self.influx.query)
        app.router.add_post("/sonar/{topic}", self.sonar.insert)
        app.router.add_post("/api/v1/insert/{topic}", self.sonar.insert)
        app.router.add_get("/health", self.health)
        return app

    @web.middleware
    async def _answer_refusals(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every refusal in JSON (`Content-Type: application/json`), also aiohttp's own 404 (a path no route
        has: `/sonar/`, `/sonar/a/b`) and 405 (`GET /sonar/sample`), which it would answer in plain text:
        Sonar 0.19's HTTP sink posts `application/json`, and a client reading the answer as what it sent
        (or InfluxDB's `{"error": ...}`) gets the reason, not an HTML-less text it cannot parse."""
        try:
            return await handler(request)
        except Refusal as refusal:
            return refusal_response(request, refusal)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = f"{exc.reason}: {request.method} {request.path}"
            allow = exc.headers.get("Allow")
            if allow:
                message += f" (allowed: {allow})"
            answer = refusal_response(request, Refusal(exc.status, message, code=exc.reason.lower()))
            if allow:
                answer.headers["Allow"] = allow
            return answer

    async def health(self, request: web.Request) -> web.StreamResponse:
        """200 while NATS is connected, 503 otherwise (a load balancer then sends writes elsewhere). Without
        credentials the answer says only that (`{"status": "pass"}` or `"fail"`): the cluster names are the
        user names of the auth file, not for anyone who can reach the port. With a cluster's credentials
        (or without an auth file, where every request is that cluster's) it also says why, the requests in
        progress and the cluster."""
        core = self.core
        connected = core.nc is not None and core.nc.is_connected
        stopping = core.stopping.is_set()
        up = connected and not stopping
        status = 200 if up else 503
        cluster = await self._health_reader(request)
        if cluster is None:
            return web.json_response({"status": "pass" if up else "fail"}, status=status)
        body = {
            "name": "hpcbus-gateway",
            "status": "pass" if up else "fail",
            "message": "ready for writes" if up else "stopping" if stopping else "NATS is unreachable",
            "nats": "connected" if connected else "unreachable",
            "in_flight": self.in_flight,
            "clusters": [cluster],
        }
        return web.json_response(body, status=status)

    async def _health_reader(self, request: web.Request) -> str | None:
        """The cluster whose credentials a `/health` request carries (the default one without an auth file);
        None without good ones, or when they cannot be checked now (a health check is never 401 or 503 for
        its credentials: it says less)."""
        auth = self.core.auth
        if auth.open:
            return auth.default
        given = credentials(request)
        if given is None:
            return None
        try:
            who = await auth.identity_of(*given, peer=peer(request))
        except Busy:
            return None
        return None if who is None else who.cluster

    async def drain(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no request is in progress; False if some still were."""
        return await self.core.slots.drain(timeout)

    def flush(self) -> None:
        """The summary lines of refusals counted but not yet logged (the report, and the stop)."""
        self.core.stats.flush()

    def summary(self) -> str:
        """The counters' summary, and what the slots saw: places taken from stalled bodies, the most body
        bytes held at once (against `max_body_memory`)."""
        slots = self.core.slots
        extra = f"; bodies in memory at most {slots.memory.peak / 2**20:.1f} MiB"
        if slots.taken_over:
            extra += f"; {slots.taken_over} stalled bodies lost their place"
        return self.core.stats.summary() + extra

    async def report_loop(self) -> None:
        core = self.core
        while not await core.stopping.sleep(core.settings.stats_seconds):
            try:
                await core.stats.report(core.nc)
            except Exception as exc:  # progress reports must never stop the gateway
                log.debug("report failed: %s", describe(exc))


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:8086` for IPv6) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen {text!r}: HOST:PORT expected, e.g. 0.0.0.0:8086")
    return host.strip("[]") or "0.0.0.0", int(port)
