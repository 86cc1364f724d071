"""What a gateway request is answered when it is not a success, and what each source counts.

A module of its own so that intake (slots, body reading), the InfluxDB and Sonar paths and publishing all
refuse and count the same way: a `Refusal` raised anywhere is written by one middleware in the style of
the API asked (v1 `{"error": ...}`, v2 `{"code": ..., "message": ...}`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hpcbus.counters import Counters
from hpcbus.schemas.problems import Problem

MAX_PROBLEMS_SHOWN = 20
"""Bad lines named one by one in an error answer; the rest are counted."""


class SourceCounters(Counters):
    """Per cluster and source (`influx-v1`, `influx-v2`, `sonar`), published as `hpcbus_<name>` lines: the
    standard counters of `hpcbus.counters` (one vocabulary for sources and sinks), counted in the source's
    items (lines for the InfluxDB APIs, envelopes for Sonar: `received` in the bodies read, `delivered`
    stored by JetStream (a Telegraf line of several fields is as many lines), `rejected` refused as invalid,
    each named in the answer; the gateway retries nothing and dead-letters nothing: a refused item is
    answered, and a client retries a 503), and what only the gateway knows."""

    requests: int = 0
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
    refused_no_durable: int = 0
    """Requests answered 503 because the stream keeps messages only for its durables (`discard: new`) and
    had none: JetStream would have acknowledged them and kept nothing (`hpcbus.interest`)."""
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


def refusal_response(request: web.Request, refusal: Refusal) -> web.Response:
    """The answer to `refusal`, in the style of the API `request` asked (v2 paths: `code` and `message`)."""
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


def problems_text(problems: list[Problem]) -> str:
    """The errors among `problems` for an answer: the first `MAX_PROBLEMS_SHOWN`, then how many more."""
    errors = [p for p in problems if p.severity == "error"]
    shown = "; ".join(str(p) for p in errors[:MAX_PROBLEMS_SHOWN])
    more = len(errors) - MAX_PROBLEMS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")
