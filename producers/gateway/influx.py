"""The InfluxDB side of the gateway made of pure steps: line protocol to messages, and the few InfluxQL
statements that clients send when they start.

Apart from the handlers (`influx_api.py`, which authenticate, hold a slot, read the body and publish) so that
what a write body becomes is in one place: normalised in steps of `STEP_BYTES` with the event loop run
between them, routed per subject, cut to what one NATS message may hold, each message named by its content.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hpcbus.outbox import split_lines
from hpcbus.retry import Stopping
from hpcbus.schemas.foreign import PRECISIONS, Normalised, normalise
from hpcbus.schemas.message import Message
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.translate import msg_id, route

INFLUX_VERSION = "1.8.10"
"""What `/ping` says in `X-Influxdb-Version`: clients pick their API by it, and 1.8 is the first 1.x with the
v2 write API (`/api/v2/write`) that this gateway also answers."""

V1_PRECISIONS = frozenset(PRECISIONS) - {""}
V2_PRECISIONS = frozenset({"ns", "us", "ms", "s"})
MAX_DATABASES = 64
"""Database names `CREATE DATABASE` adds to what `SHOW DATABASES` answers (probes only; nothing is made)."""
STEP_BYTES = 1 << 20
"""Body bytes normalised between two returns to the event loop (~10,000 lines, tens of ms): a 32 MiB body
takes seconds to read, and meanwhile `/health`, other requests and SIGTERM must still be answered."""


async def normalise_in_steps(
    body: bytes, stopping: Stopping, *, step: int = STEP_BYTES, **options: Any
) -> Normalised | None:
    """`normalise(body, **options)`, whole lines of about `step` bytes at a time with the event loop run
    between them (line numbers as if in one go); None when `stopping` was set meanwhile (nothing has been
    published yet: the client's retry goes to the next gateway or this one restarted). One set of the new
    measurements goes through every step: the limit on them is the whole request's."""
    options.setdefault("new", set())
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


def line_messages(
    result: Normalised, cluster: str, limit: int, place: str, *, prefix: str = ""
) -> tuple[list[Message], list[Problem]]:
    """The lines as messages per subject, each at most `limit` bytes and named by its content; a single
    line longer than that cannot be published (a problem)."""
    routes = route(result.lines, cluster, prefix=prefix)
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


def query_results(q: str, databases: set[str]) -> list[dict[str, Any]]:
    """The answers to InfluxQL statements `q`: `SHOW DATABASES` lists `databases`, `CREATE DATABASE` adds to
    it (up to `MAX_DATABASES`), anything else is an error per statement; nothing is created or read."""
    results: list[dict[str, Any]] = []
    for i, statement in enumerate(s.strip() for s in q.split(";") if s.strip()):
        words = statement.split()
        head = " ".join(words[:2]).upper()
        if head == "SHOW DATABASES":
            values = [[name] for name in sorted(databases)]
            series = {"name": "databases", "columns": ["name"], "values": values}
            results.append({"statement_id": i, "series": [series]})
        elif head == "CREATE DATABASE" and len(words) > 2:
            if len(databases) < MAX_DATABASES:
                databases.add(words[2].strip('"'))
            results.append({"statement_id": i})
        else:
            error = "hpcbus gateway answers SHOW DATABASES and CREATE DATABASE only; query InfluxDB itself"
            results.append({"statement_id": i, "error": error})
    return results
