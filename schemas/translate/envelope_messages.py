"""Raw Sonar envelopes as NATS messages on `<cluster>.sonar.<kind>`: cut to the budget, each part with its
own deterministic `Nats-Msg-Id`.

One function for every publisher of raw envelopes (the gateway, `hpcbus pub`, `consume sonar --to sonar`),
so that the same envelope always becomes the same messages: a retried request or a rebuilt envelope is
dropped by JetStream's duplicate window part by part. The cutting itself is `schemas.sonar.split`.
"""

from __future__ import annotations

from hpcbus.schemas.message import Message
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.sonar.split import split_envelope
from hpcbus.schemas.sonar.validate import Envelope
from hpcbus.schemas.translate.bus import msg_id

__all__ = ["envelope_messages"]


def envelope_messages(
    subject: str, payload: bytes, max_bytes: int, *, kind: str = "", env: Envelope | None = None
) -> tuple[list[Message], list[Problem]]:
    """The messages of one valid envelope (`payload`, its JSON; `env`, the same decoded, or decoded here with
    `expect=kind` only when it is too large), and the problems of what could not be published: a record,
    sample or sysinfo larger than `max_bytes` (located at `subject`). An envelope that fits is one message
    of exactly `payload`, with the id it always had (`msg_id(subject, payload)`); the parts of a cut one are
    named `i/n` in their ids."""
    if len(payload) <= max_bytes:
        return [Message(subject, payload, msg_id(subject, payload))], []
    if env is None:
        env = decode_envelope(payload, expect=kind or None)
    parts = split_envelope(env, max_bytes, payload=payload)
    messages: list[Message] = []
    problems: list[Problem] = []
    n = len(parts)
    for i, part in enumerate(parts, 1):
        if part.problem is not None:
            problems.append(part.problem.located(subject))
            continue
        name = f"{i}/{n}" if n > 1 else ""
        messages.append(Message(subject, part.payload, msg_id(subject, part.payload, name)))
    return messages, problems
