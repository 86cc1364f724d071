"""InfluxDB's HTTP API as the gateway answers it: `/write` (v1), `/api/v2/write`, `/ping` and the
start-up probes of `/query`. Statuses and bodies follow InfluxDB (`answers.py`); what a body becomes is
`influx.py`."""

from __future__ import annotations

import time

from aiohttp import web

from hpcbus.producers.gateway.answers import Refusal, problems_text
from hpcbus.producers.gateway.core import Core
from hpcbus.producers.gateway.influx import (
    INFLUX_VERSION,
    MAX_DATABASES,
    V1_PRECISIONS,
    V2_PRECISIONS,
    line_messages,
    normalise_in_steps,
    query_results,
)
from hpcbus.producers.gateway.roles import keep_allowed_lines


class InfluxApi:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.databases: set[str] = set()
        """The `db`/`bucket` names clients wrote to (what `SHOW DATABASES` answers), at most `MAX_DATABASES`."""

    async def write_v1(self, request: web.Request) -> web.StreamResponse:
        return await self._write(
            request, "influx-v1", request.query.get("precision", ""), V1_PRECISIONS | {""}
        )

    async def write_v2(self, request: web.Request) -> web.StreamResponse:
        return await self._write(request, "influx-v2", request.query.get("precision", "ns"), V2_PRECISIONS)

    async def _write(
        self, request: web.Request, source: str, precision: str, allowed: frozenset[str]
    ) -> web.StreamResponse:
        core = self.core
        who = await core.authenticate(request)  # first, as InfluxDB: no answer about input without it
        cluster = who.cluster
        if source == "influx-v2" and not request.query.get("bucket"):
            raise Refusal(400, "bucket is required")
        if precision not in allowed:
            choices = ", ".join(sorted(p for p in allowed if p))
            raise Refusal(400, f"invalid precision {precision!r} (one of {choices})")
        counters = core.stats.source(cluster, source)
        counters.requests += 1
        db = request.query.get("db") or request.query.get("bucket") or ""
        if db and len(self.databases) < MAX_DATABASES:
            self.databases.add(db)
        async with core.slots.slot(request, cluster, counters):
            body = await core.body(request, counters)
            limit = core.limit()
            place = f"{request.method} {request.path}"
            result = await normalise_in_steps(
                body,
                core.stopping,
                precision=precision,
                cluster=cluster,
                now=int(time.time()),
                place=place,
                max_future=core.settings.max_future,
            )
            if result is None:
                counters.refused_busy += 1
                raise core.unavailable("hpcbus gateway stopping; retry")
            result, forbidden = keep_allowed_lines(result, who, place)
            messages, oversized = line_messages(result, cluster, limit, place, prefix=core.prefix)
            problems = result.problems + forbidden + oversized
            rejected = result.rejected + len(forbidden) + len(oversized)
            received, published = result.received, len(result.lines) - len(oversized)
            del (
                body,
                result,
            )  # only the messages are held while JetStream answers: memory ~ max_body a request
            await core.publish(messages, counters)
        counters.received += received
        counters.rejected += rejected
        counters.delivered += published
        if rejected:
            text = problems_text(problems)
            core.stats.partial.note(f"{place} for {cluster}: {rejected} of {received} lines refused: {text}")
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
        await self.core.authenticate(request)
        q = request.query.get("q", "")
        if not q and request.method == "POST":
            q = str((await request.post()).get("q", ""))
        return web.json_response({"results": query_results(q, self.databases)})
