"""The Sonar side of the gateway made of pure steps: valid envelopes to messages, and the answer's status.

Apart from the handler (`sonar_api.py`, which authenticates, holds a slot, reads the body and publishes) so
that what a Sonar body becomes, and which refusal a request with problems gets, are in one place.
"""

from __future__ import annotations

from hpcbus.schemas.message import Message
from hpcbus.schemas.problems import FORBIDDEN, Problem
from hpcbus.schemas.translate import envelope_messages


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


def refusal_status(envelope_problems: list[Problem], published: bool) -> tuple[int, str]:
    """(status, InfluxDB-style code) for a Sonar request with problems: 413 when only records were too
    large, 401 when nothing was published for a bad token alone, 403 when nothing was published and every
    error is a valid name of a cluster or host the credential may not publish for (`FORBIDDEN`, marked where
    the problem is made: the reason quotes the request, so its words decide nothing), else 400 (also for a
    cluster field that is not a Clustername: invalid input, not a question of permission)."""
    errors = [p for p in envelope_problems if p.severity == "error"]
    paths = {p.path for p in errors}
    status = 400
    if not envelope_problems:
        status = 413
    elif not published and paths == {"meta.token"}:
        status = 401
    elif not published and errors and all(p.code == FORBIDDEN for p in errors):
        status = 403
    code = {401: "unauthorized", 403: "forbidden", 413: "request too large"}.get(status, "invalid")
    return status, code
