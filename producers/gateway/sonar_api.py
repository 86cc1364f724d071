"""Sonar's HTTP sink (`api-root` = `http://host:port/sonar`, POST `/sonar/<topic>`) and Jobanalyzer's insert
API (`/api/v1/insert/<topic>`) as the gateway answers them; what a body becomes is `sonar.py`."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from hpcbus.producers.gateway.answers import Refusal, problems_text
from hpcbus.producers.gateway.auth import Busy
from hpcbus.producers.gateway.core import Core
from hpcbus.producers.gateway.intake import peer
from hpcbus.producers.gateway.roles import check_kind, keep_allowed_envelopes
from hpcbus.producers.gateway.sonar import refusal_status, sonar_messages
from hpcbus.schemas import subjects
from hpcbus.schemas.foreign import read_envelopes, topic_kind


class SonarApi:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def insert(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        topic = request.match_info["topic"]
        kind = topic_kind(topic)
        if not kind:
            raise Refusal(
                404, f"unknown topic {topic!r}: sample, sysinfo, job, cluster, or <prefix>.<one of them>"
            )
        who = await core.authenticate(request)
        check_kind(who, kind)
        cluster = who.cluster
        counters = core.stats.source(cluster, "sonar")
        counters.requests += 1
        place = f"{request.method} {request.path}"
        async with core.slots.slot(request, cluster, counters):
            body = await core.body(request, counters)
            # in a thread: a JSONL body of many envelopes takes long enough to stall the event loop (other
            # requests, /health, SIGTERM); each token is checked on the loop like a secret (the bounded
            # check slots, the memory of results, this address' budget of failed checks)
            try:
                found = await asyncio.to_thread(
                    read_envelopes,
                    body,
                    kind,
                    cluster,
                    place=place,
                    token_ok=core.auth.sonar_token_check(cluster, peer(request)),
                    latest=int(time.time()) + core.settings.max_future,
                )
            except Busy as exc:  # a token that would need a hash it may not have now: nothing published
                core.stats.busy_checks += 1
                raise core.unavailable(f"hpcbus gateway busy ({exc}); retry") from None
            found = keep_allowed_envelopes(found, who, place)
            subject = subjects.sonar(cluster, kind, prefix=core.prefix)
            # cut in a thread too: a large jobs envelope is decoded and re-encoded part by part
            messages, envelopes, too_large = await asyncio.to_thread(
                sonar_messages, found.payloads, subject, kind, core.sonar_limit(), place
            )
            await core.publish(messages, counters)
        rejected = found.received - len(found.payloads)
        counters.received += found.received
        counters.delivered += envelopes
        counters.rejected += rejected
        counters.records_too_large += len(too_large)
        problems = found.problems + too_large
        if problems:
            text = problems_text(problems)
            core.stats.partial.note(
                f"{place} for {cluster}: {rejected} of {found.received} envelopes refused, "
                f"{len(too_large)} records too large: {text}"
            )
            status, code = refusal_status(found.problems, bool(messages))
            # as for line protocol: what was stored beside the refused records (or envelopes) is said first
            partial = "partial write: " if messages and status == 400 else ""
            raise Refusal(status, f"{partial}{text}", code=code)
        answer: dict[str, int] = {"published": envelopes}
        if len(messages) != envelopes:
            answer["messages"] = len(messages)
        return web.json_response(answer)
